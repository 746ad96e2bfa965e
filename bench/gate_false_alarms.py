"""False trips of the gate on healthy traffic, per release-hour, with a Clopper-Pearson bound.

``.venv/bin/python bench/gate_false_alarms.py`` (defaults: >= 1,000,000 healthy
baseline-canary comparisons, seed 0; ~7 min of one core, ~2 more for llama.cpp) writes
``bench/results/gate_false_alarms.json``.

What is replayed. Healthy comparisons, produced by the real code: two replicas of one
version (``canarystack.model.engine.NextTokenModel`` with the default batch noise,
``BATCH_NOISE_KL``, each its own ``noise_seed``, each request in a batch of a random
running count 1-8) answer the same context; the router's own ``kl_topk`` and ``top1``
score their top-5 logprobs at every position the router compares at temperature 1 (the
game day's sampling): both sides draw with one seed, as the router couples them
(``canarystack.router.shadow.coupled_body``), and positions are compared while their tokens
agree, up to the router's 8 shadow tokens. Baseline-baseline comparisons (the noise floor)
come from a second baseline replica the same way. If ``llama_cpp`` imports, a smaller set
comes from llama.cpp: the random-weight GGUF of ``canarystack.engine.gguf_gen``, one
replica with 1 thread and batch 512, the other with 2 threads and batch 16 (a benign source
of nondeterminism), on prompts of 16-64 words, position 0 only (this set reads llama.cpp's
logits of the prompt directly; it does not decode).

At the rate a game day sees. ``bench/gate_detection.py``'s open loop: 15 requests/s,
14 % of prompts 2048-6000 tokens, the rest 16-1500; a request is shadowed at the router's
default per-bucket rate (``0-512=0.05,512-1k=0.1,1k-2k=0.25,2k-4k=1,4k+=1``) and
compared baseline-baseline at 0.2 x that rate (``--shadow-noise-fraction``). Sample times
follow that schedule (Poisson arrivals), so one release-hour is 3600 s of it.

How it is counted. Each release-hour (a release of ``--llama-hour-s`` for the llama.cpp
set) is a fresh ``canarystack.gate.state.ReleaseGate``
(a new release: its noise floor starts empty, the worst case) with the default
configuration (``GateConfig.from_budget()``), fed in router-sized batches (<= 500
samples, about 2 s each). A release-hour is a trial; it fails when the gate decides a
trip (the release would end there). The rate is failed hours / hours with a one-sided
Clopper-Pearson 95 % upper bound. Only comparisons are replayed: the drift detectors (18
of 28 at the defaults) are exercised; latency and errors need outcome streams, which the
simulator's healthy TTFTs and errors do not come from here.

This file must never start a server or open a socket: it drives pure code.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta

from canary_contract.broker import Release
from canary_contract.json import JsonObject

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import machine

from canarystack.common.buckets import bucket_labels, bucket_of
from canarystack.gate.state import GateConfig, ReleaseGate, SampleBatch, release_record
from canarystack.gate.stats import ECusum
from canarystack.model.engine import BATCH_NOISE_KL, NextTokenModel, next_context
from canarystack.router.shadow import kl_topk, top1

RESULTS = Path(__file__).resolve().parent / "results" / "gate_false_alarms.json"
SHADOW_RATES = {"0-512": 0.05, "512-1k": 0.1, "1k-2k": 0.25, "2k-4k": 1.0, "4k+": 1.0}
NOISE_FRACTION = 0.2
REQUEST_RATE = 15.0
LONG_SHARE = 0.14
TOPK = 5
POSITIONS = 8  # the router's --shadow-max-tokens
TEMPERATURE = 1.0
BATCH_S = 2.0
MAX_BATCH = 500
HOUR_S = 3600.0


def release() -> Release:
    return release_record("default", 1, "v1", "v2", 5)


def schedule(rng: np.random.Generator, hour_s: float) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(times, buckets, is_noise) of the comparisons of one release-hour, in time order."""
    n = int(rng.poisson(REQUEST_RATE * hour_s))
    t = np.sort(rng.uniform(0.0, hour_s, n))
    long = rng.random(n) < LONG_SHARE
    tokens = np.where(long, rng.integers(2048, 6001, n), rng.integers(16, 1501, n))
    labels = [bucket_of(int(x)) for x in tokens]
    rate = np.array([SHADOW_RATES[b] for b in labels])
    u = rng.random(n)
    shadow = u < rate
    noise = (u >= rate) & (u < rate * (1.0 + NOISE_FRACTION))
    keep = shadow | noise
    idx = np.flatnonzero(keep)
    return t[idx], [labels[i] for i in idx], noise[idx]


@dataclass(frozen=True)
class Score:
    """One comparison's scores, as the router's record carries them."""

    kl_mean: float
    kl_first: float
    top1_agree: float
    positions: int


class SimPairs:
    """Healthy comparisons from the simulator's engine: baseline replica vs another replica."""

    def __init__(self, seed: int) -> None:
        self.base = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=1)
        self.base2 = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=2)
        self.canary = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=3)
        self.rng = random.Random(seed)

    def score(self, noise: bool) -> Score:
        """One comparison as the router scores a sampled request: both sides draw with one
        seed, positions compared while the tokens drawn so far agree."""
        rng = self.rng
        ctx = rng.getrandbits(64)
        seed = rng.getrandbits(64)
        draw_a, draw_b = random.Random(seed), random.Random(seed)
        other = self.base2 if noise else self.canary
        key_a = self.base.batch_key(rng.randint(1, 8))
        key_b = other.batch_key(rng.randint(1, 8))
        kls: list[float] = []
        agree = 0
        for _ in range(POSITIONS):
            pa = self.base.distribution(ctx, 0.0, key_a)
            pb = other.distribution(ctx, 0.0, key_b)
            ta = {str(k): v for k, v in pa.top(TOPK)}
            tb = {str(k): v for k, v in pb.top(TOPK)}
            kls.append(kl_topk(ta, tb))
            agree += top1(ta) == top1(tb)
            tok_a = self.base.sample(pa, TEMPERATURE, 1.0, draw_a)
            if other.sample(pb, TEMPERATURE, 1.0, draw_b) != tok_a:
                break
            ctx = next_context(ctx, tok_a)
        return Score(math.fsum(kls) / len(kls), kls[0], agree / len(kls), len(kls))


class LlamaPairs:
    """Healthy comparisons from llama.cpp: one GGUF, two thread/batch layouts."""

    def __init__(self, seed: int, workdir: Path) -> None:
        from llama_cpp import Llama

        from canarystack.engine.gguf_gen import write_gguf
        from canarystack.tokenizer import make_prompt

        path = write_gguf(workdir / "model.gguf", seed=0)
        common: JsonObject = {"n_ctx": 512, "logits_all": True, "verbose": False}
        self.a = Llama(str(path), n_threads=1, n_batch=512, **common)
        self.b = Llama(str(path), n_threads=2, n_batch=16, **common)
        self.rng = random.Random(seed)
        self.make_prompt = make_prompt

    def _top(self, llama: Any, toks: list[int]) -> dict[str, float]:
        llama.reset()
        llama.eval(toks)
        logits = np.asarray(llama.scores[len(toks) - 1], dtype=np.float64)
        lp = logits - logits.max()
        lp = lp - np.log(np.exp(lp).sum())
        return {str(int(i)): float(lp[i]) for i in np.argsort(-lp)[:TOPK]}

    def score(self, noise: bool) -> Score:
        del noise  # both sides are replicas of one version either way
        words = self.rng.randint(16, 64)
        text = self.make_prompt(words, seed=self.rng.getrandbits(32))
        toks = self.a.tokenize(text.encode("utf-8"), add_bos=True, special=True)[:400]
        ta, tb = self._top(self.a, toks), self._top(self.b, toks)
        kl = kl_topk(ta, tb)
        return Score(kl, kl, 1.0 if top1(ta) == top1(tb) else 0.0, 1)


def batches(
    times: np.ndarray,
    labels: list[str],
    noise: np.ndarray,
    pairs: Any,
    kls: list[float],
    positions: list[int],
) -> Iterator[SampleBatch]:
    start = 0
    n = len(times)
    while start < n:
        end = start
        limit = times[start] + BATCH_S
        while end < n and end - start < MAX_BATCH and times[end] < limit:
            end += 1
        comps = []
        for i in range(start, end):
            is_noise = bool(noise[i])
            sc = pairs.score(is_noise)
            if not is_noise:
                kls.append(sc.kl_mean)
                positions.append(sc.positions)
            comps.append(
                {
                    "time": float(times[i]),
                    "pair": "baseline-baseline" if is_noise else "baseline-canary",
                    "bucket": labels[i],
                    "prompt_tokens": 0,
                    "positions": sc.positions,
                    "kl_mean": sc.kl_mean,
                    "kl_first": sc.kl_first,
                    "top1_agree": sc.top1_agree,
                    "version_a": "v1",
                    "version_b": "v1" if is_noise else "v2",
                }
            )
        yield SampleBatch.model_validate(
            {"router_id": "replay", "release": "default", "comparisons": comps}
        )
        start = end


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper bound on a rate with k failures in n trials."""
    if k >= n:
        return 1.0
    return float(beta.ppf(level, k + 1, n - k))


def replay(source: str, pairs: Any, min_comparisons: int, hour_s: float, seed: int) -> JsonObject:
    cfg = GateConfig.from_budget()
    rng = np.random.default_rng(seed)
    hours = 0
    tripped: list[JsonObject] = []
    bc = bb = 0
    kls: list[float] = []
    positions: list[int] = []
    agree_sum = 0.0
    max_stat: dict[str, float] = {}
    t0 = time.process_time()
    while bc < min_comparisons:
        times, labels, noise = schedule(rng, hour_s)
        gate = ReleaseGate("default", cfg)
        gate.on_release(release(), 0.0)
        for b in batches(times, labels, noise, pairs, kls, positions):
            got = gate.ingest(b, 0.0, 0.0)
            bc += got.comparisons
            bb += got.noise_comparisons
            agree_sum += sum(c.top1_agree for c in b.comparisons if c.pair == "baseline-canary")
            if gate.trip is not None:
                tripped.append(
                    {
                        "hour": hours,
                        "test": gate.trip["test"],
                        "bucket": gate.trip["bucket"],
                        "metric": gate.trip["detail"].get("metric"),
                        "at_s": gate.trip["last_sample_time"],
                    }
                )
                break
        for scope, test, det in gate.detectors():
            if test.startswith("drift") and isinstance(det, ECusum):  # the default test
                key = f"{scope}:{test}"
                max_stat[key] = max(max_stat.get(key, 0.0), det.max_log_m)
        hours += 1
    k = len(tripped)
    arr = np.array(kls)
    worst = max(max_stat.items(), key=lambda kv: kv[1]) if max_stat else ("", 0.0)
    return {
        "source": source,
        "releases": hours,
        "release_s": hour_s,
        "release_hours": hours * hour_s / HOUR_S,
        "baseline_canary_comparisons": bc,
        "baseline_baseline_comparisons": bb,
        "comparisons_per_s": round((bc + bb) / (hours * hour_s), 3),
        "kl_mean": float(arr.mean()),
        "kl_p50": float(np.percentile(arr, 50)),
        "kl_p95": float(np.percentile(arr, 95)),
        "kl_p99": float(np.percentile(arr, 99)),
        "positions_mean": round(float(np.mean(positions)), 3),
        "top1_disagreement": 1.0 - agree_sum / max(bc, 1),
        "false_trips": k,
        "false_trips_per_release_hour": k / (hours * hour_s / HOUR_S),
        # Per release (a trial), then as a rate per release-hour (releases back to back).
        "false_trip_probability_per_release_cp95_upper": clopper_pearson_upper(k, hours),
        "false_trips_per_release_hour_cp95_upper": clopper_pearson_upper(k, hours)
        * HOUR_S
        / hour_s,
        "trips": tripped,
        "largest_statistic_seen": {
            "detector": worst[0],
            "statistic": math.exp(worst[1]),
            "threshold": cfg.drift_threshold,
        },
        "cpu_s": round(time.process_time() - t0, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--min-comparisons", type=int, default=1_000_000)
    p.add_argument("--llama-min-comparisons", type=int, default=1_000)
    p.add_argument(
        "--llama-hour-s",
        type=float,
        default=240.0,
        help="release length (s) of the llama.cpp set: it is too slow for whole hours",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.min_comparisons < 1 or args.llama_min_comparisons < 0:
        p.error("--min-comparisons must be >= 1 and --llama-min-comparisons >= 0")
    assert len(SHADOW_RATES) == len(bucket_labels())
    cfg = GateConfig.from_budget()
    started = time.time()
    results = [replay("simulator", SimPairs(args.seed), args.min_comparisons, HOUR_S, args.seed)]
    print(json.dumps(results[0], indent=1), flush=True)
    llama_note = None
    if args.llama_min_comparisons:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            llama_note = f"llama_cpp does not import ({exc}): no llama.cpp set"
        else:
            with tempfile.TemporaryDirectory() as d:
                pairs = LlamaPairs(args.seed, Path(d))
                results.append(
                    replay(
                        "llama.cpp",
                        pairs,
                        args.llama_min_comparisons,
                        args.llama_hour_s,
                        args.seed + 1,
                    )
                )
            print(json.dumps(results[-1], indent=1), flush=True)
    out = {
        "benchmark": "gate_false_alarms",
        "command": " ".join([".venv/bin/python", "bench/gate_false_alarms.py", *sys.argv[1:]]),
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "gate_budget": cfg.budget_json(),
        "traffic": {
            "request_rate_per_s": REQUEST_RATE,
            "long_share": LONG_SHARE,
            "shadow_rates": SHADOW_RATES,
            "noise_fraction": NOISE_FRACTION,
            "compared_positions": f"up to {POSITIONS} (simulator: one seed, while tokens agree); "
            "1 (llama.cpp)",
            "temperature": TEMPERATURE,
            "topk": TOPK,
            "batch_noise_kl": BATCH_NOISE_KL,
        },
        "results": results,
        "llama_note": llama_note,
        "percentile": "numpy linear interpolation (numpy.percentile default)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
