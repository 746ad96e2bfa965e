"""Helpers for the llama.cpp engine tests (``-m engine``): a local stack with engine
pods, a bounded traffic driver, and direct engine logits for the drift cross-check.

Everything started here is stopped by PID (the stack through supervisord's pidfile);
traffic goes to 127.0.0.1 only and is bounded in time and count.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from canarystack.tokenizer import make_prompt
from tests.procs import free_port, wait_for

# Prompt lengths (words) the engine tests send: short, so three single-threaded engines
# on two cores answer in tens of milliseconds.
PROMPT_WORDS = (16, 32, 48, 64, 96, 128, 192, 256)


def prompt(seed: int, words: int | None = None) -> str:
    n = words if words is not None else random.Random(seed).choice(PROMPT_WORDS)
    return make_prompt(n, seed=seed)


@dataclass
class Stack:
    state_dir: Path
    desc: dict[str, Any]
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """The operator credential (broker writes)."""
        return {"Authorization": f"Bearer {self.token}", "x-actor": "test"}

    def fault_headers(self, role: str) -> dict[str, str]:
        """``role``'s own fault credential (its /admin/faults)."""
        token = (self.state_dir / "credentials" / f"faults-{role}").read_text().strip()
        return {"Authorization": f"Bearer {token}", "x-actor": "test"}

    def url(self, name: str) -> str:
        for comp in self.desc["components"]:
            if comp["name"] == name:
                return str(comp["url"])
        raise KeyError(name)

    def release(self) -> dict[str, Any]:
        resp = requests.get(f"{self.desc['broker_url']}/v1/releases/default", timeout=5)
        resp.raise_for_status()
        return dict(resp.json())

    def gate(self) -> dict[str, Any]:
        resp = requests.get(f"{self.desc['gate_url']}/v1/gate/default", timeout=5)
        resp.raise_for_status()
        return dict(resp.json())


def _cluster(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "canarystack.cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


LLAMACPP_DEFAULTS = Path(__file__).resolve().parents[1] / "canarystack/cluster/llamacpp.yaml"


def engine_config(tmp_path: Path, extra_args: Mapping[str, Sequence[str]]) -> Path:
    """A stack config: the llama.cpp defaults with ``extra_args`` appended role by role (a
    stack config's 'args' replace a role's defaults, so the defaults are copied first)."""
    import yaml

    defaults = yaml.safe_load(LLAMACPP_DEFAULTS.read_text())
    args = {role: list(v) for role, v in defaults.get("args", {}).items()}
    for role, more in extra_args.items():
        args[role] = [*args.get(role, []), *more]
    path = tmp_path / "stack-config.yaml"
    path.write_text(yaml.safe_dump({"engine": "llamacpp", "args": args}))
    return path


@contextmanager
def engine_stack(
    tmp_path: Path, config: Path | None = None, engine: str = "llamacpp", up_s: float = 120
) -> Iterator[Stack]:
    """``gameday stack up --engine ENGINE`` on free ports (with ``config``, a stack
    config; ``up_s`` bounds the start); stopped at the end."""
    state_dir = tmp_path / "stack"
    config_args = ["--config", str(config)] if config else []
    last = ""
    for _ in range(5):
        base = (free_port() // 100) * 100 % 40000 + 20000  # a block of 40 ports
        res = _cluster(
            "up", "--engine", engine, "--state-dir", str(state_dir),
            "--base-port", str(base), "--json", *config_args, timeout_s=up_s,
        )  # fmt: skip
        if res.returncode == 0:
            break
        last = res.stderr + res.stdout
        if "in use" not in last:
            raise AssertionError(f"stack up failed:\n{last}")
    else:
        raise AssertionError(f"no free port block for the stack:\n{last}")
    try:
        desc = json.loads((state_dir / "stack.json").read_text())
        token = (state_dir / "credentials" / "operator").read_text().strip()
        yield Stack(state_dir, desc, token)
    finally:
        _cluster("down", "--state-dir", str(state_dir), timeout_s=60)


@dataclass
class Traffic:
    """Closed-loop users streaming greedy completions through the router until stopped
    (or ``max_s``/``max_requests``, whichever comes first)."""

    router_url: str
    users: int = 2
    max_tokens: int = 8
    max_s: float = 120.0
    max_requests: int = 5000
    served: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    canary_starts: list[float] = field(default_factory=list)  # wall-clock request starts
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sent: int = 0

    def _user(self, i: int) -> None:
        rng = random.Random(i)
        deadline = time.monotonic() + self.max_s
        with requests.Session() as session:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with self._lock:
                    if self._sent >= self.max_requests:
                        return
                    self._sent += 1
                body = {
                    "prompt": prompt(rng.getrandbits(32)),
                    "max_tokens": self.max_tokens,
                    "temperature": 0,
                    "stream": True,
                }
                started = time.time()
                try:
                    with session.post(
                        self.router_url + "/v1/completions",
                        json=body,
                        headers={"x-user-id": f"user-{rng.getrandbits(16)}"},
                        stream=True,
                        timeout=60,
                    ) as resp:
                        text = b"".join(resp.iter_content(None))
                        served = resp.headers.get("x-served-by", "")
                        with self._lock:
                            self.served[served] += 1
                            if served == "canary":
                                self.canary_starts.append(started)
                            if resp.status_code != 200 or b"[DONE]" not in text:
                                self.errors.append(f"{resp.status_code} {text[:200]!r}")
                except requests.RequestException as exc:
                    with self._lock:
                        self.errors.append(repr(exc))

    def start(self) -> Traffic:
        for i in range(self.users):
            t = threading.Thread(target=self._user, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)


def inject_kernel(url: str, headers: dict[str, str], cache_type: str, ttl_s: float) -> str:
    resp = requests.post(
        url + "/admin/faults",
        json={"kind": "kernel", "ttl_s": ttl_s, "mode": "kv-quant", "cache_type": cache_type},
        headers=headers,
        timeout=5,
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def kv_cache_type(url: str) -> str | None:
    return requests.get(url + "/health", timeout=5).json().get("kv_cache_type")


class DirectEngine:
    """llama.cpp in this process with the pods' settings: the engine's own logits."""

    GGML_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 8}

    def __init__(self, model_path: Path, cache_type: str, n_ctx: int = 8192) -> None:
        from llama_cpp import Llama

        t = self.GGML_TYPE[cache_type]
        self.llama = Llama(
            str(model_path),
            n_ctx=n_ctx,
            n_threads=1,
            flash_attn=True,
            type_k=t,
            type_v=t,
            logits_all=True,
            verbose=False,
        )

    def next_logprobs(self, text: str) -> np.ndarray:
        """Log-softmax of the next-token logits after ``text`` (fresh context, float64)."""
        toks = self.llama.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        self.llama.reset()
        self.llama.eval(toks)
        logits = np.asarray(self.llama.scores[len(toks) - 1], dtype=np.float64)
        shifted = logits - logits.max()
        return shifted - np.log(np.exp(shifted).sum())

    def top_k(self, logprobs: np.ndarray, k: int) -> dict[str, float]:
        """The top k as llama_cpp.server builds completions ``top_logprobs``: a dict keyed
        by token text, in which a less likely token with the same text overwrites."""
        out: dict[str, float] = {}
        for i in np.argsort(-logprobs)[:k]:
            text = self.llama.detokenize([int(i)]).decode("utf-8", errors="ignore")
            out[text] = float(logprobs[i])
        return out


def full_kl(p_logprobs: np.ndarray, q_logprobs: np.ndarray) -> float:
    """KL(P‖Q) over the whole vocabulary, in nats."""
    return float(np.sum(np.exp(p_logprobs) * (p_logprobs - q_logprobs)))


@dataclass
class DriftTrip:
    """What ``drive_to_rollback`` saw: the release after it, the traffic, and the wall
    times of the fault and of the rollback."""

    release: dict[str, Any]
    traffic: Traffic
    t_fault: float
    t_rolled_back: float


def drive_to_rollback(
    stack: Stack, inject: Callable[[], object], max_s: float = 150, seen_s: float = 60
) -> DriftTrip:
    """Two users through the router; once the gate has 20 comparisons, ``inject`` the
    canary's fault, wait until the release is rolled back, and keep the traffic 2 s more
    (none of it may reach the canary)."""
    traffic = Traffic(stack.desc["router_url"], users=2, max_s=max_s).start()
    try:
        wait_for(
            lambda: sum(b["comparisons"] for b in stack.gate()["buckets"].values()) >= 20,
            timeout=seen_s,
            interval=0.5,
            what="the gate to see the canary",
        )
        t_fault = time.time()
        inject()
        wait_for(
            lambda: stack.release()["phase"] == "rolled_back",
            timeout=max(90.0, max_s / 2),
            interval=0.2,
            what="the rollback",
        )
        t_rolled_back = time.time()
        time.sleep(2)
    finally:
        traffic.stop()
    return DriftTrip(stack.release(), traffic, t_fault, t_rolled_back)
