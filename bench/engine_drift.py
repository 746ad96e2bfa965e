"""Benchmark: what a quantized KV cache does to a real engine, and how fast the gate
catches it — llama.cpp serving the generated random-weight GGUF (the ``engine`` extra).

Part 1, engine pods (``python -m canarystack.engine``, each its own process, stopped by
PID): two f16 pods (b0, b1) and one canary pod (c). ``--prompts`` pseudo-word prompts of
16-256 words (about 40-650 llama tokens), greedy, 8 positions, top-5 logprobs, compared
with the harness's oracle (``gameday.oracle``: KL over the union of the top-5 lists):

- noise floor, fresh: b0 vs b1, each prompt evaluated from BOS on both;
- noise floor, prefix reuse: b1 first served a prompt sharing the first half of the
  words, so llama.cpp reuses that cached prefix (the way replicas with different
  histories differ in live traffic);
- canary f16 / q8_0 / q4_0 (the ``kernel`` fault) vs b0;
- the engine's own figure: full-vocabulary KL at the first position, from direct logits
  (``llama_cpp.Llama`` in this process, same settings as the pods);
- rollout time: fault injected -> the pod serves with the new cache.

Part 2, the whole stack (``--trip-runs``; each a fresh ``gameday stack up --engine
llamacpp`` with its default settings): two closed-loop users stream greedy completions
(16-256 words, max_tokens 8) through the router; after 20 baseline-canary comparisons the
canary gets a q4_0 kernel fault. Measured from the injection: the rollout (health shows
q4_0), the trip (``trip.tripped_at``) and ``rolled_back``. Any trip before the fault is a
false trip and is counted.

Prints one JSON object. Loopback only; bounded by the counts and per-step deadlines.
Never asserts on timings.

    .venv/bin/python bench/engine_drift.py                 # 40 prompts, 3 trip runs
    .venv/bin/python bench/engine_drift.py --trip-runs 0   # drift figures only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import requests
from _procs import ADMIN, launch, wait_port
from _results import Run

from canary_contract.json import JsonObject
from canarystack.engine.gguf_gen import write_gguf
from canarystack.tokenizer import make_prompt
from gameday.oracle import compare_positions, kl_topk, parse_logprobs

RESET_PROMPT = "0 1 2 3 4 5 6 7 8 9"
WORDS = (16, 32, 48, 64, 96, 128, 192, 256)
GGML = {"f16": 1, "q4_0": 2, "q8_0": 8}


def wait(pred: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")


@contextmanager
def pods(gguf: Path, folder: Path, n: int) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for i in range(n):
            ready, log = folder / f"pod{i}.json", folder / f"pod{i}.log"
            args = ["--model", str(gguf), "--version", f"v{i}"]
            procs.append(launch("canarystack.engine", args, ready=ready, log=log))
            port = wait_port(procs[-1], ready, log, f"engine pod {i}", timeout_s=60)
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait(lambda u=url: requests.get(u + "/health", timeout=2).ok, 90, "engine up")  # type: ignore[misc]
        yield urls
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def ask(url: str, text: str, positions: int = 8) -> list[Any]:
    body = {"prompt": text, "max_tokens": positions, "temperature": 0, "logprobs": 5}
    resp = requests.post(url + "/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return parse_logprobs(resp.json())


def reset(url: str) -> None:
    requests.post(
        url + "/v1/completions", json={"prompt": RESET_PROMPT, "max_tokens": 1}, timeout=60
    ).raise_for_status()


def summary(rows: list[tuple[float, float, float, int]]) -> dict[str, float]:
    kl = [r[0] for r in rows]
    return {
        "kl_mean": statistics.fmean(kl),
        "kl_p50": statistics.median(kl),
        "kl_max": max(kl),
        "kl_first_mean": statistics.fmean(r[1] for r in rows),
        "top1_agree": statistics.fmean(r[2] for r in rows),
        "positions_mean": statistics.fmean(r[3] for r in rows),
        "prompts": len(rows),
    }


def compare(a: str, b: str, prompts: list[str], prefix_reuse_b: bool = False) -> dict[str, float]:
    rows = []
    for text in prompts:
        reset(a)
        if prefix_reuse_b:
            words = text.split()
            head = " ".join(words[: len(words) // 2])
            ask(b, head + " " + make_prompt(len(words) - len(words) // 2, seed=99), positions=1)
        else:
            reset(b)
        c = compare_positions(ask(a, text), ask(b, text))
        rows.append((c.kl_mean, c.kl_first, c.top1_agree, c.positions))
    return summary(rows)


def set_cache(url: str, cache_type: str) -> float:
    requests.delete(url + "/admin/faults", headers=ADMIN, timeout=5).raise_for_status()
    t0 = time.monotonic()
    if cache_type != "f16":
        requests.post(
            url + "/admin/faults",
            json={"kind": "kernel", "ttl_s": 600, "cache_type": cache_type},
            headers=ADMIN,
            timeout=5,
        ).raise_for_status()
    wait(
        lambda: requests.get(url + "/health", timeout=2).json()["kv_cache_type"] == cache_type,
        60,
        f"{cache_type} rollout",
    )
    return time.monotonic() - t0


def direct_full_kl(gguf: Path, prompts: list[str]) -> dict[str, float]:
    from llama_cpp import Llama

    def load(t: str) -> Llama:
        return Llama(str(gguf), n_ctx=8192, n_threads=1, flash_attn=True, type_k=GGML[t],
                     type_v=GGML[t], logits_all=True, verbose=False)  # fmt: skip

    def logprobs(m: Llama, text: str) -> np.ndarray:
        toks = m.tokenize(text.encode(), add_bos=True, special=True)
        m.reset()
        m.eval(toks)
        lg = np.asarray(m.scores[len(toks) - 1], dtype=np.float64)
        lg -= lg.max()
        return lg - np.log(np.exp(lg).sum())

    def top5(m: Llama, lp: np.ndarray) -> dict[str, float]:
        idx = np.argsort(-lp)[:5]
        return {m.detokenize([int(i)]).decode("utf-8", "ignore"): float(lp[i]) for i in idx}

    ref = load("f16")
    base = [logprobs(ref, t) for t in prompts]
    out: dict[str, float] = {}
    for t in ("q8_0", "q4_0"):
        m = load(t)
        full, t5 = [], []
        for text, a in zip(prompts, base, strict=True):
            b = logprobs(m, text)
            full.append(float(np.sum(np.exp(a) * (a - b))))
            t5.append(kl_topk(top5(ref, a), top5(m, b)))
        out[f"{t}_full_vocab_kl_first_mean"] = statistics.fmean(full)
        out[f"{t}_top5_kl_first_mean"] = statistics.fmean(t5)
        del m
    return out


def part_pods(args: argparse.Namespace, folder: Path) -> JsonObject:
    gguf = write_gguf(folder / "model.gguf", seed=args.seed)
    rng = random.Random(args.seed)
    prompts = [
        make_prompt(rng.choice(WORDS), seed=rng.getrandbits(32)) for _ in range(args.prompts)
    ]
    out: JsonObject = {}
    with pods(gguf, folder, 3) as (b0, b1, c):
        out["noise_fresh"] = compare(b0, b1, prompts)
        out["noise_prefix_reuse"] = compare(b0, b1, prompts, prefix_reuse_b=True)
        out["canary_f16"] = compare(b0, c, prompts)
        for cache_type in ("q8_0", "q4_0"):
            out[f"rollout_s_{cache_type}"] = set_cache(c, cache_type)
            out[f"canary_{cache_type}"] = compare(b0, c, prompts)
        out["rollout_s_back_to_f16"] = set_cache(c, "f16")
    out["direct"] = direct_full_kl(gguf, prompts)
    return out


class Traffic:
    def __init__(self, router: str, users: int = 2) -> None:
        self.router = router
        self.stop = threading.Event()
        self.errors = 0
        self.threads = [threading.Thread(target=self.user, args=(i,)) for i in range(users)]

    def user(self, i: int) -> None:
        rng = random.Random(1000 + i)
        deadline = time.monotonic() + 300
        with requests.Session() as s:
            while not self.stop.is_set() and time.monotonic() < deadline:
                body = {
                    "prompt": make_prompt(rng.choice(WORDS), seed=rng.getrandbits(32)),
                    "max_tokens": 8, "temperature": 0, "stream": True,
                }  # fmt: skip
                try:
                    with s.post(self.router + "/v1/completions", json=body, stream=True,
                                headers={"x-user-id": f"u{rng.getrandbits(16)}"},
                                timeout=60) as r:  # fmt: skip
                        data = b"".join(r.iter_content(None))
                        self.errors += r.status_code != 200 or b"[DONE]" not in data
                except requests.RequestException:
                    self.errors += 1

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def trip_run(folder: Path, base_port: int) -> JsonObject:
    sd = folder / "stack"
    cluster = [sys.executable, "-m", "canarystack.cluster"]
    up = subprocess.run([*cluster, "up", "--engine", "llamacpp", "--state-dir", str(sd),
                         "--base-port", str(base_port), "--json"],
                        capture_output=True, text=True, timeout=180)  # fmt: skip
    if up.returncode != 0:
        raise RuntimeError(f"stack up failed: {up.stderr or up.stdout}")
    try:
        desc = json.loads((sd / "stack.json").read_text())
        # One credential per capability (docs/ARCHITECTURE.md §8): the canary's fault API.
        token = Path(desc["credentials"]["faults-model-canary"]).read_text().strip()
        canary = next(c["url"] for c in desc["components"] if c["name"] == "model-canary-0")
        broker, gate = desc["broker_url"], desc["gate_url"]

        def release() -> JsonObject:
            return dict(requests.get(f"{broker}/v1/releases/default", timeout=5).json())

        def comparisons() -> int:
            g = requests.get(f"{gate}/v1/gate/default", timeout=5).json()
            return sum(b["comparisons"] for b in g["buckets"].values())

        with Traffic(desc["router_url"]) as traffic:
            wait(lambda: comparisons() >= 20, 120, "20 comparisons")
            false_trip = release()["trip"] is not None
            t0 = time.time()
            requests.post(
                canary + "/admin/faults",
                json={"kind": "kernel", "ttl_s": 300, "cache_type": "q4_0"},
                headers={"Authorization": f"Bearer {token}", "x-actor": "bench"},
                timeout=5,
            ).raise_for_status()
            rollout_s = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                health = requests.get(canary + "/health", timeout=5).json()
                if rollout_s is None and health["kv_cache_type"] == "q4_0":
                    rollout_s = time.time() - t0
                if release()["phase"] == "rolled_back":
                    break
                time.sleep(0.05)
            rolled_back_s = time.time() - t0
            rel = release()
        trip = rel["trip"] or {}
        return {
            "false_trip_before_fault": false_trip,
            "rollout_s": rollout_s,
            "trip_s": (trip["tripped_at"] - t0) if trip else None,
            "rolled_back_s": rolled_back_s if rel["phase"] == "rolled_back" else None,
            "trip_test": trip.get("test"),
            "trip_bucket": trip.get("bucket"),
            "trip_samples": trip.get("samples"),
            "request_errors": traffic.errors,
        }
    finally:
        subprocess.run([*cluster, "down", "--state-dir", str(sd)], capture_output=True, timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--trip-runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="GGUF and prompt seed")
    p.add_argument("--base-port", type=int, default=18700)
    args = p.parse_args()
    run = Run("engine_drift")
    result: JsonObject = {"prompts": args.prompts, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        result["pods"] = part_pods(args, Path(tmp))
        runs = [trip_run(Path(tmp) / f"run{i}", args.base_port) for i in range(args.trip_runs)]
    result["trip_runs"] = runs
    trips = [r["trip_s"] for r in runs if r["trip_s"] is not None]
    if trips:
        result["trip_s_median"] = statistics.median(trips)
        result["trip_s_max"] = max(trips)
        result["trip_after_rollout_s_median"] = statistics.median(
            r["trip_s"] - r["rollout_s"] for r in runs if r["trip_s"] and r["rollout_s"]
        )
    print(json.dumps(result, indent=2))
    run.write(result)


if __name__ == "__main__":
    main()
