"""Null stress of the one-test-per-release mode (``--test release-eprocess``) on its
latency and errors detectors, and on sporadic invalid answers (issue #26: the replay of
>= 3,000 healthy release-hours with latency and error streams).

``nice -n 19 .venv/bin/python bench/gate_null_outcomes.py`` (defaults: 3,000 releases per
stream, each a release-hour in steps of 0.1 s; ~5 min of one core) writes
``bench/results/gate_null_outcomes.json``, quoted in docs/gate-statistics.md.

``bench/gate_null_stress.py`` drives the drift detectors; this file drives the others,
each healthy canary as the gate sees it at the game day's traffic (~40 requests/s: the
baseline's outcomes at ~38/s, the canary's at 2/s, paired shadow comparisons at 5/s), one
detector at weight 1 in the gate's own ``canarystack.gate.eprocess.ReleaseEProcess``
(tripping at ``1/alpha``: the hardest case for one stream; in the default average a
detector of weight ``w`` needs ``~1/(alpha w)`` alone). What the gate computes around the
e-process is computed as ``canarystack.gate.detect`` does, vectorised over the releases and
checked against the gate's own functions on the first releases:

- **errors**: each canary outcome is 1 for an error, against ``m0`` = the one-sided
  Clopper-Pearson bound (level ``1 - error_ucb_delta``, ``canarystack.gate.stats.
  binomial_upper``) on the baseline's errors in the last ``error_window_s`` seconds, +
  ``error_tolerance``; no observation while ``m0 >= 1``. A step's canary outcome is tested
  before that step's baseline outcomes arrive (the reference lags by up to 0.1 s: harsher
  than the gate, never kinder).
- **latency, paired**: each admitted comparison is 1 when the canary's TTFT exceeds
  ``latency_ratio`` x the baseline's + ``latency_slack_s``, against ``m0 = 1/2``.
- **latency, outcomes**: each canary outcome is 1 when its TTFT exceeds ``latency_ratio``
  x the median of the last ``latency_reference_n`` baseline TTFTs + slack, against 1/2.
- **drift with sporadic invalid answers**: a healthy KL stream (m0/20) where a share of
  the canary's answers is invalid (a dropped stream, a malformed logprob) and counts as
  ``invalid_weight x m0`` (the issue found the old rule, KL = 1, tripping ~4 times an hour at
  1 %).

Streams (``STREAMS``): the same error rate on both sides; a canary at the baseline's rate
+ the tolerance (the boundary, which the per-step bound covers only with probability
``1 - error_ucb_delta``: the row says what that costs); outages of a dependency both
variants share, partial and total; paired TTFTs under a shared load swing; the same with
each side's own short stalls (a GC pause, a noisy neighbour); the outcomes' reference
under load steps. A release fails when it trips; the rate is failed releases / releases
with a one-sided Clopper-Pearson 95 % upper bound (0 of 3,000: <= 1.0e-3).

This file must never start a server or open a socket: it drives pure code.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _results import Run, percentile
from scipy.special import betaincinv
from scipy.stats import beta, binom

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from canary_contract.json import JsonObject
from canarystack.gate.config import GateConfig
from canarystack.gate.eprocess import ReleaseEProcess, alone_threshold
from canarystack.gate.release_weights import focus_scope, release_weights
from canarystack.gate.stats import binomial_lower, binomial_upper

CFG = GateConfig(test="release-eprocess")
DT = 0.1  # seconds per step
BASELINE_PER_S = 38.0  # the baseline's outcomes (95 % of ~40 requests/s)
CANARY_PER_S = 2.0  # the canary's outcomes (5 %)
PAIRED_PER_S = 5.0  # paired shadow comparisons with both TTFTs
TTFT_MEDIAN_S = 0.2
TTFT_SIGMA = 0.6  # lognormal spread of one request's TTFT
M0_KL = 0.0225  # the drift floor + tolerance of bench/gate_null_stress.py
CHECKED = 3  # releases whose m0 is checked against the gate's own function
_W = release_weights(CFG.edges, CFG.pool_tails, CFG.focus_weight)
# Each stream's detector's weight in the default average: one bucket's latency or errors
# detector; for invalid answers the long-prompt KL focus (the most weight they can reach).
WEIGHTS = {
    "errors": _W[f"{CFG.labels[-1]}:errors"],
    "latency": _W[f"{CFG.labels[-1]}:latency"],
    "focus": _W[f"{focus_scope(CFG.edges, CFG.pool_tails)}:drift_kl"],
}


def cp_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on the false-trip rate, k in n releases."""
    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def binomial_upper_v(k: np.ndarray, n: np.ndarray, delta: float) -> np.ndarray:
    """``canarystack.gate.stats.binomial_upper`` for arrays (checked against it below)."""
    out = np.ones(k.shape)
    ok = (n > 0) & (k < n)
    out[ok] = betaincinv(k[ok] + 1.0, (n[ok] - k[ok]).astype(float), 1.0 - delta)
    return out


def binomial_lower_v(k: np.ndarray, n: np.ndarray, delta: float) -> np.ndarray:
    """``canarystack.gate.stats.binomial_lower`` for arrays (checked against it below)."""
    out = np.zeros(k.shape)
    ok = (n > 0) & (k > 0)
    out[ok] = betaincinv(k[ok], (n[ok] - k[ok] + 1.0), delta)
    return out


def quantiles(values: np.ndarray) -> JsonObject:
    v = [float(x) for x in values]
    return {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95), "max": max(v) if v else None}


# -- what a healthy release's shared world does, step by step ---------------------------
def episodes(
    rng: np.random.Generator, n: int, left: np.ndarray | None, p_start: float, length_s: float
) -> np.ndarray:
    """Each release's time left in its episode (an outage, a load step, a stall) after
    this step, from ``left`` before it (None: none yet): where none runs, one starts with
    chance ``p_start`` and lasts ``length_s``."""
    if left is None:
        left = np.zeros(n)
    start = rng.random(n) < p_start
    return np.where(start & (left <= 0), length_s, left - DT)


@dataclass
class Outages:
    """A dependency both variants share: outages start at ``per_h`` an hour and last
    ``length_s``; during one every request of either variant fails with ``p``."""

    per_h: float
    length_s: float
    p: float
    left: np.ndarray | None = None

    def step(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each release's share of failing requests from the outage in this step."""
        self.left = episodes(rng, n, self.left, self.per_h * DT / 3600.0, self.length_s)
        return np.where(self.left > 0, self.p, 0.0)


@dataclass
class Load:
    """A load factor both variants' TTFTs share: log-normal AR(1) (``sigma``, correlation
    time ``tau_s``) and, with ``step_every_s``, load steps x ``step_factor`` lasting
    ``step_s``."""

    sigma: float = 0.5
    tau_s: float = 30.0
    step_every_s: float = 0.0
    step_factor: float = 3.0
    step_s: float = 30.0
    log_l: np.ndarray | None = None
    left: np.ndarray | None = None

    def step(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.log_l is None:
            self.log_l = rng.normal(0.0, self.sigma, n)
        a = math.exp(-DT / self.tau_s)
        noise = rng.normal(0.0, self.sigma * math.sqrt(1.0 - a * a), n)
        self.log_l = a * self.log_l + noise
        factor = np.exp(self.log_l)
        if self.step_every_s > 0:
            self.left = episodes(rng, n, self.left, DT / self.step_every_s, self.step_s)
            factor = np.where(self.left > 0, factor * self.step_factor, factor)
        return factor


@dataclass
class Stalls:
    """One variant's own short stalls (a GC pause, a noisy neighbour): at ``per_h`` an
    hour for ``length_s`` each, adding ``extra_s`` to every TTFT; independent per side."""

    per_h: float = 30.0
    length_s: float = 2.0
    extra_s: float = 0.5
    left: np.ndarray | None = None

    def step(self, rng: np.random.Generator, n: int) -> np.ndarray:
        self.left = episodes(rng, n, self.left, self.per_h * DT / 3600.0, self.length_s)
        return np.where(self.left > 0, self.extra_s, 0.0)


def ttft(rng: np.random.Generator, n: int, load: np.ndarray) -> np.ndarray:
    return TTFT_MEDIAN_S * load * rng.lognormal(0.0, TTFT_SIGMA, n)


# -- the detectors ----------------------------------------------------------------------
class Detector:
    """One detector at weight 1 in the gate's ``ReleaseEProcess``, over ``n`` releases."""

    def __init__(self, name: str, n: int, default_weight: float) -> None:
        self.name = name
        self.default_weight = default_weight
        self.merge = ReleaseEProcess({name: 1.0}, CFG.alpha, n=n)
        self.det = self.merge.detectors[name]
        self.observations = 0
        self.total = 0.0
        self.extra: JsonObject = {}

    def observe(self, x: np.ndarray, m0: np.ndarray | float, active: np.ndarray) -> None:
        if not active.any():
            return
        self.det.update(x, m0, active)
        self.observations += int(active.sum())
        self.total += float(x[active].sum())

    def tripped(self) -> np.ndarray:
        """With one detector the average is its wealth: its running maximum says whether
        the release ever reached 1/alpha."""
        out: np.ndarray = self.det.max_log_wealth >= self.merge.log_threshold
        return out

    def tripped_in_average(self) -> np.ndarray:
        """Releases where this detector alone would have tripped the default average, at
        its default weight ``w``, with every other detector's wealth still 1."""
        threshold = math.log(alone_threshold(self.default_weight, CFG.alpha))
        out: np.ndarray = self.det.max_log_wealth >= threshold
        return out

    def figures(self) -> JsonObject:
        n = self.det.n
        return {
            "observations_per_release": round(self.observations / n, 1),
            "mean_observation": self.total / self.observations if self.observations else None,
            "max_log_wealth": quantiles(self.det.max_log_wealth),
            "bets_per_release": quantiles(self.det.bets.astype(float)),
            **self.extra,
        }


class ErrorWindow:
    """The baseline's outcomes and errors of the last ``error_window_s``, per release, and
    the gate's shared-surge rule over its last ``surge_s`` (0: off)."""

    def __init__(self, n: int, surge_s: float) -> None:
        width = round(CFG.error_window_s / DT)
        self.outcomes = np.zeros((width, n))
        self.errors = np.zeros((width, n))
        self.surge_steps = round(surge_s / DT)
        self.i = 0
        self.checks = 0
        self.skipped = 0

    def m0(self) -> tuple[np.ndarray, np.ndarray]:
        """(m0, surge) per release: the errors test's null mean, and whether the gate's
        ``detect.error_surge`` leaves this step's canary outcome untested."""
        k, m = self.errors.sum(axis=0), self.outcomes.sum(axis=0)
        upper = binomial_upper_v(k, m, CFG.error_ucb_delta)
        surge = np.zeros(k.shape, dtype=bool)
        lower = np.zeros(k.shape)
        if self.surge_steps:
            last = [(self.i - 1 - j) % len(self.outcomes) for j in range(self.surge_steps)]
            k_s, m_s = self.errors[last].sum(axis=0), self.outcomes[last].sum(axis=0)
            lower = binomial_lower_v(k_s, m_s, CFG.error_ucb_delta)
            surge = lower > upper
            if self.checks < 200:
                for r in range(CHECKED):
                    own = binomial_lower(int(k_s[r]), int(m_s[r]), CFG.error_ucb_delta)
                    assert math.isclose(own, lower[r], abs_tol=1e-12)
        if self.checks < 200:  # the vectorised bounds are the gate's own functions
            self.checks += 1
            for r in range(CHECKED):
                own = binomial_upper(int(k[r]), int(m[r]), CFG.error_ucb_delta)
                assert math.isclose(own, upper[r], abs_tol=1e-12)
        return upper + CFG.error_tolerance, surge

    def add(self, outcomes: np.ndarray, errors: np.ndarray) -> None:
        self.outcomes[self.i] = outcomes
        self.errors[self.i] = errors
        self.i = (self.i + 1) % len(self.outcomes)


def errors_release(
    n: int, steps: int, rng: np.random.Generator, base_p: float, canary_p: float,
    outages: Outages | None, surge_s: float = CFG.error_surge_s,
) -> Detector:  # fmt: skip
    det = Detector("all:errors", n, WEIGHTS["errors"])
    window = ErrorWindow(n, surge_s)
    for _ in range(steps):
        shared = outages.step(rng, n) if outages is not None else np.zeros(n)
        p_base = 1.0 - (1.0 - base_p) * (1.0 - shared)
        p_canary = 1.0 - (1.0 - canary_p) * (1.0 - shared)
        m0, surge = window.m0()
        canary = rng.random(n) < CANARY_PER_S * DT
        window.skipped += int((canary & surge & (m0 < 1.0)).sum())
        active = canary & (m0 < 1.0) & ~surge
        x = (rng.random(n) < p_canary).astype(float)
        det.observe(x, np.where(active, m0, 0.5), active)
        outcomes = rng.poisson(BASELINE_PER_S * DT, n).astype(float)
        window.add(outcomes, rng.binomial(outcomes.astype(np.int64), p_base).astype(float))
    det.extra["surge_skips_per_release"] = round(window.skipped / n, 2)
    det.extra["error_surge_s"] = surge_s
    return det


def paired_release(
    n: int, steps: int, rng: np.random.Generator, load: Load, stalls: bool
) -> Detector:
    det = Detector("all:latency", n, WEIGHTS["latency"])
    base_stalls, canary_stalls = (Stalls(), Stalls()) if stalls else (None, None)
    for _ in range(steps):
        factor = load.step(rng, n)
        a, b = ttft(rng, n, factor), ttft(rng, n, factor)
        if base_stalls is not None and canary_stalls is not None:
            a, b = a + base_stalls.step(rng, n), b + canary_stalls.step(rng, n)
        slow = b > CFG.latency_ratio * a + CFG.latency_slack_s
        det.observe(slow.astype(float), 0.5, rng.random(n) < PAIRED_PER_S * DT)
    return det


def outcomes_release(n: int, steps: int, rng: np.random.Generator, load: Load) -> Detector:
    """The canary's TTFT against the median of the last ``latency_reference_n`` baseline
    TTFTs (the baseline's ~4 outcomes a step keep the reference full)."""
    det = Detector("all:latency", n, WEIGHTS["latency"])
    per_step = round(BASELINE_PER_S * DT)
    ref = np.full((n, CFG.latency_reference_n), TTFT_MEDIAN_S)
    for _ in range(steps):
        factor = load.step(rng, n)
        median = np.median(ref, axis=1)
        b = ttft(rng, n, factor)
        slow = b > CFG.latency_ratio * median + CFG.latency_slack_s
        det.observe(slow.astype(float), 0.5, rng.random(n) < CANARY_PER_S * DT)
        new = np.stack([ttft(rng, n, factor) for _ in range(per_step)], axis=1)
        ref = np.concatenate([ref[:, per_step:], new], axis=1)
    return det


def invalid_release(n: int, steps: int, rng: np.random.Generator, share: float) -> Detector:
    """Healthy KL (Gamma(1.5), mean m0/20) with ``share`` of the comparisons invalid,
    each counting as ``min(kl_clip, invalid_weight x m0)`` (``release_test``)."""
    det = Detector("all:drift_kl", n, WEIGHTS["focus"])
    for _ in range(steps):
        active = rng.random(n) < PAIRED_PER_S * DT
        kl = rng.gamma(1.5, M0_KL / 20.0 / 1.5, n)
        invalid = rng.random(n) < share
        x = np.where(invalid, min(CFG.kl_clip, CFG.invalid_weight * M0_KL), kl)
        det.observe(np.minimum(x, CFG.kl_clip), M0_KL, active)
    return det


Release = Callable[[int, int, np.random.Generator], Detector]

STREAMS: list[tuple[str, str, str, Release]] = [
    ("errors_same_rate", "errors", "1 % errors on both sides",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01, None)),
    ("errors_at_tolerance", "errors",
     f"baseline 1 %, canary 1 % + the tolerance ({CFG.error_tolerance:g}): the boundary",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01 + CFG.error_tolerance, None)),
    ("errors_shared_outage", "errors",
     "1 % on both, and a dependency both share fails half their requests for 20 s, "
     "6 times an hour",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01, Outages(6.0, 20.0, 0.5))),
    ("errors_shared_outage_total", "errors",
     "the same with every request failing during the outage",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01, Outages(6.0, 20.0, 1.0))),
    ("errors_shared_outage_no_surge_rule", "errors",
     "the half outage without the shared-surge rule (--error-surge-s 0: the gate before it)",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01, Outages(6.0, 20.0, 0.5), 0.0)),
    ("errors_shared_outage_total_no_surge_rule", "errors",
     "the total outage without the shared-surge rule",
     lambda n, s, r: errors_release(n, s, r, 0.01, 0.01, Outages(6.0, 20.0, 1.0), 0.0)),
    ("latency_paired_load", "latency (paired)",
     "the same TTFT distribution on both sides under a shared load swing "
     "(log-normal AR(1), sigma 0.5, 30 s)",
     lambda n, s, r: paired_release(n, s, r, Load(), stalls=False)),
    ("latency_paired_stalls", "latency (paired)",
     "the same, and each side stalls on its own (+0.5 s TTFT for 2 s, 30 times an hour)",
     lambda n, s, r: paired_release(n, s, r, Load(), stalls=True)),
    ("latency_outcomes_load_steps", "latency (outcomes)",
     "the canary's TTFT against the recent baselines' median, the shared load tripling "
     "for 30 s every 5 min on top of the swing",
     lambda n, s, r: outcomes_release(n, s, r, Load(step_every_s=300.0))),
    ("invalid_1pct", "drift (invalid answers)",
     "healthy KL (m0/20) with 1 % of the canary's answers invalid",
     lambda n, s, r: invalid_release(n, s, r, 0.01)),
    ("invalid_5pct", "drift (invalid answers)",
     "the same with 5 % invalid",
     lambda n, s, r: invalid_release(n, s, r, 0.05)),
]  # fmt: skip


def row(name: str, test: str, what: str, det: Detector, hour_s: float) -> JsonObject:
    trips = det.tripped()
    k, n = int(trips.sum()), len(trips)
    k_w = int(det.tripped_in_average().sum())
    return {
        "stream": name,
        "test": test,
        "what": what,
        "releases": n,
        "release_hours": round(n * hour_s / 3600.0, 1),
        "false_trips": k,
        "false_trip_rate": k / n,
        "upper_95": cp_upper(k, n),
        # P(k or more trips | each release false-trips with probability alpha exactly).
        "p_value_vs_alpha": float(binom.sf(k - 1, n, CFG.alpha)),
        "default_weight": round(det.default_weight, 6),
        "false_trips_at_default_weight": k_w,
        "upper_95_at_default_weight": cp_upper(k_w, n),
        **det.figures(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--releases", type=int, default=3000, help="releases per stream")
    p.add_argument("--hour-s", type=float, default=3600.0, help="seconds per release")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated stream names")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.releases < 1 or args.hour_s <= 0:
        p.error("--releases must be >= 1 and --hour-s > 0")
    names = [s[0] for s in STREAMS]
    only = args.only.split(",") if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        p.error(f"--only: unknown streams {unknown}; known: {', '.join(names)}")
    run = Run("gate_null_outcomes")
    rng = np.random.default_rng(args.seed)
    steps = round(args.hour_s / DT)
    t0 = time.process_time()
    rows: list[JsonObject] = []
    for name, test, what, release in STREAMS:
        if name not in only:
            continue
        start = time.process_time()
        out = row(name, test, what, release(args.releases, steps, rng), args.hour_s)
        out["cpu_s"] = round(time.process_time() - start, 1)
        rows.append(out)
        print(f"{name}: {out['false_trips']}/{out['releases']} false trips, "
              f"{out['cpu_s']} s", file=sys.stderr, flush=True)  # fmt: skip
    figures: JsonObject = {
        "config": {
            "alpha": CFG.alpha,
            "threshold": 1.0 / CFG.alpha,
            "step_s": DT,
            "release_s": args.hour_s,
            "baseline_outcomes_per_s": BASELINE_PER_S,
            "canary_outcomes_per_s": CANARY_PER_S,
            "paired_comparisons_per_s": PAIRED_PER_S,
            "ttft": {"median_s": TTFT_MEDIAN_S, "lognormal_sigma": TTFT_SIGMA},
            "error_window_s": CFG.error_window_s,
            "error_ucb_delta": CFG.error_ucb_delta,
            "error_surge_s": CFG.error_surge_s,
            "error_tolerance": CFG.error_tolerance,
            "latency_ratio": CFG.latency_ratio,
            "latency_slack_s": CFG.latency_slack_s,
            "latency_reference_n": CFG.latency_reference_n,
            "invalid_weight": CFG.invalid_weight,
            "kl_m0": M0_KL,
        },
        "null_stress": rows,
        "cpu_s": round(time.process_time() - t0, 1),
    }
    run.write(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
