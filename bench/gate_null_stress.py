"""Null stress and detection time of the gate's one-test-per-release mode (``--test
release-eprocess``; issue #26, item 5, first bullet), beside the default restarting e-CUSUM.

``nice -n 19 .venv/bin/python bench/gate_null_stress.py`` (defaults: 3,000 releases per
stream, each a release-hour at 10 comparisons/s; ~3 min of one core) writes
``bench/results/gate_null_stress.json``, quoted in docs/gate-statistics.md.

Null stress. Each simulated release feeds one detector's stream, 36,000 observations (an
hour at 10 comparisons/s: the ``all`` scope sees every comparison), to the gate's own code:
``canarystack.gate.eprocess.ReleaseEProcess`` with that detector at weight 1, tripping at
``1/alpha``: the hardest case for one stream (a detector of weight ``w`` in the default
average needs ``~1/(alpha w)`` alone). Nothing of the test is re-implemented here: the
releases are the ``n`` copies the class is vectorised over. Streams, each with the null
mean ``m0`` (KL-like, nats) and clipped at the gate's ``kl_clip`` (clipping only lowers a
mean):

- ``at_m0``: Gamma(1.5) with mean exactly ``m0`` (the boundary the guarantee covers: an
  efficient test spends its alpha here, so about ``alpha x releases`` trips are expected,
  and the row reports the binomial p-value of its count against ``alpha``);
- ``at_0.9_m0``: the same at 0.9 ``m0`` (a healthy canary with a thin margin);
- ``lognormal_heavy``, ``pareto_heavy``: lognormal (sigma 2) and Pareto (shape 1.5,
  infinite variance) with mean ``m0`` before the clip;
- ``sessions_thinned``: session-dependent at mean ``m0``: 60 concurrent sessions, each
  with its own level (Gamma(2) x ``m0``, mean ``m0``), a session lasting 10 turns on
  average, each comparison from the session whose turn it is; one per session every 6 s,
  as the gate's dependence rule admits (``canarystack.gate.sessions.SessionThinning``,
  checked over the first releases' keys and times);
- ``sessions_bursts_no_rule``: the same sessions without the rule: each speaks 5 times in
  a row (an agent loop); the rule exists because this is not at the null given the past;
- ``estimated_floor``: the canary at the *true* boundary ``mu + tolerance``, tested
  against ``m0 = U + tolerance``, ``U`` the gate's confidence-sequence floor
  (``canarystack.gate.floor.UpperConfidenceSequence``) from 200 baseline-baseline
  comparisons measured before the canary (mean ``mu`` = 0.005 nats, clip 0.02) and frozen.

The restarting e-CUSUM at its defaults (A = 1000, bet 0.8, the recursion of
``canarystack.gate.stats.ECusum`` vectorised here and checked against that class on the
first releases) runs on the ``at_m0`` and ``lognormal_heavy`` streams for comparison.
A release fails when it trips; the rate is failed releases / releases with a one-sided
Clopper-Pearson 95 % upper bound (0 of 3,000: <= 1.0e-3, the rule of three).

Detection. The default release average (28 detectors, ``release_weights``) in copies fed
a game-day comparison mix (half the comparisons from prompts >= 2048 tokens), 200
healthy comparisons (KL ~ m0/20), then a fault: long-prompt comparisons shift to
``2 x m0`` or ``5 x m0`` (Gamma(1.5)), short ones stay healthy. Time to trip = the
comparisons until the trip / the comparison rate (5, 10, 15 per s; half of them affected),
p50/p95 over the runs; the pipeline's own latency (router batches, the broker write) comes
on top. A late fault: the focus detector after an hour of a healthy heavy-tailed stream
(lognormal at m0/10), then ``5 x m0``, against the same fault on a fresh detector.

This file must never start a server or open a socket: it drives pure code.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _results import Run, percentile
from scipy.stats import beta, binom

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from canary_contract.json import JsonObject
from canarystack.gate.config import GateConfig
from canarystack.gate.eprocess import (
    DEFAULT_BET_DISCOUNT,
    DEFAULT_BET_FRACTIONS,
    ReleaseEProcess,
    alone_threshold,
)
from canarystack.gate.floor import UpperConfidenceSequence
from canarystack.gate.release_weights import floor_count, focus_scope, release_weights
from canarystack.gate.scopes import tested_scopes
from canarystack.gate.sessions import SessionThinning
from canarystack.gate.stats import ECusum

CFG = GateConfig(test="release-eprocess")
M0 = 0.0225  # a frozen KL floor of ~0.0025 nats + the default tolerance 0.02
KL_CLIP = CFG.kl_clip
RATE = 10.0  # comparisons per second the `all` scope sees
BLOCK = 400  # observations drawn at once per release
SESSIONS = 60
SESSION_TURNS = 10.0  # mean turns of a session
BURST = 5
FLOOR_MU = 0.005
FLOOR_N = 200
# Of the comparisons at the game day's traffic (15 requests/s, 14 % of prompts >= 2048
# tokens shadowed at rate 1; the rest 16-1500 tokens at 0.05/0.1/0.25 by bucket): ~0.55.
LONG_SHARE = 0.5
# How the short comparisons split over 0-512, 512-1k, 1k-2k (prompt share x shadow rate).
SHORT_SPLIT = (0.13, 0.26, 0.61)
WARMUP = 200
DETECT_RATES = (5.0, 10.0, 15.0)
SHIFTS = (2.0, 5.0)

Stream = Callable[[np.random.Generator, int, int], np.ndarray]


def gamma_at(mean: float) -> Stream:
    return lambda rng, n, k: rng.gamma(1.5, mean / 1.5, (n, k))


def lognormal_at(mean: float, sigma: float) -> Stream:
    mu = math.log(mean) - sigma * sigma / 2.0
    return lambda rng, n, k: rng.lognormal(mu, sigma, (n, k))


def pareto_at(mean: float, shape: float) -> Stream:
    scale = mean * (shape - 1.0) / shape  # Pareto(shape, scale) has mean scale * s/(s-1)
    return lambda rng, n, k: scale * (1.0 + rng.pareto(shape, (n, k)))


class Sessions:
    """Session-dependent comparisons at mean ``m0``: ``SESSIONS`` concurrent sessions, each
    with a level ~ Gamma(2) x m0; a turn ends a session with probability 1/SESSION_TURNS
    (a new one, with a new level, takes its slot). ``burst`` comparisons in a row come
    from one session; with ``burst=1`` each slot speaks every ``SESSIONS`` comparisons."""

    def __init__(self, n: int, burst: int, rng: np.random.Generator) -> None:
        self.n, self.burst = n, burst
        self.level = rng.gamma(2.0, M0 / 2.0, (n, SESSIONS))
        self.key = np.tile(np.arange(SESSIONS), (n, 1))
        self.next_key = SESSIONS
        self.step = 0

    def slot(self) -> int:
        return (self.step // self.burst) % SESSIONS

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(x, session key) of every copy's next comparison."""
        s = self.slot()
        x = self.level[:, s] * rng.gamma(1.5, 1.0 / 1.5, self.n)
        keys = self.key[:, s].copy()
        self.step += 1
        if self.step % self.burst == 0:  # the session's turn is over; it may end
            ended = rng.random(self.n) < 1.0 / SESSION_TURNS
            k = int(ended.sum())
            self.level[ended, s] = rng.gamma(2.0, M0 / 2.0, k)
            self.key[ended, s] = self.next_key + np.arange(k)
            self.next_key += k
        return x, keys


def cp_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate, k failures in n trials."""
    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def quantiles(values: np.ndarray) -> JsonObject:
    v = [float(x) for x in values]
    return {
        "p50": percentile(v, 0.5),
        "p95": percentile(v, 0.95),
        "max": max(v) if v else None,
        "n": len(v),
    }


def null_row(
    name: str, what: str, trips: np.ndarray, samples: int, extra: JsonObject
) -> JsonObject:
    k, n = int(trips.sum()), len(trips)
    return {
        "stream": name,
        "what": what,
        "releases": n,
        "samples_per_release": samples,
        "release_hours": round(n * samples / RATE / 3600.0, 1),
        "false_trips": k,
        "false_trip_rate": k / n,
        "upper_95": cp_upper(k, n),
        # P(k or more trips | each release false-trips with probability alpha exactly).
        "p_value_vs_alpha": float(binom.sf(k - 1, n, CFG.alpha)),
        **extra,
    }


def ever_tripped(merge: ReleaseEProcess) -> np.ndarray:
    """Copies of a one-detector release whose average ever reached 1/alpha: with one
    detector the average is its wealth, so its running maximum says it (read once at the
    end instead of ``merge.tripped()`` after every observation: the same answer)."""
    (det,) = merge.detectors.values()
    out: np.ndarray = det.max_log_wealth >= merge.log_threshold
    return out


def eprocess_null(
    name: str, what: str, stream: Stream, n: int, samples: int, rng: np.random.Generator
) -> JsonObject:
    """One detector at weight 1 (trips at 1/alpha), ``n`` releases of ``samples`` each."""
    merge = ReleaseEProcess({"all:drift_kl": 1.0}, CFG.alpha, n=n)
    det = merge.detectors["all:drift_kl"]
    total = 0.0
    for start in range(0, samples, BLOCK):
        xs = np.minimum(stream(rng, n, min(BLOCK, samples - start)), KL_CLIP)
        total += float(xs.sum())
        for j in range(xs.shape[1]):
            det.update(xs[:, j], M0)
    ever = ever_tripped(merge)
    extra: JsonObject = {
        "test": "release-eprocess",
        "mean_observation": total / (n * samples),
        "max_log_wealth": quantiles(det.max_log_wealth),
        "bets_per_release": quantiles(det.bets.astype(float)),
    }
    return null_row(name, what, ever, samples, extra)


def session_null(
    name: str, what: str, burst: int, n: int, samples: int, rng: np.random.Generator
) -> JsonObject:
    merge = ReleaseEProcess({"all:drift_kl": 1.0}, CFG.alpha, n=n)
    det = merge.detectors["all:drift_kl"]
    sessions = Sessions(n, burst, rng)
    rule = [SessionThinning(CFG.session_window_s) for _ in range(min(n, 20))]
    thinned = 0
    total = 0.0
    for i in range(samples):
        x, keys = sessions.draw(rng)
        if burst == 1:
            # The gate's own rule over the first releases: it must admit every one.
            for r, kept in enumerate(rule):
                thinned += not kept.admit(f"s{keys[r]}", i / RATE)
        x = np.minimum(x, KL_CLIP)
        total += float(x.mean())
        det.update(x, M0)
    ever = ever_tripped(merge)
    extra: JsonObject = {
        "test": "release-eprocess",
        "mean_observation": total / samples,
        "max_log_wealth": quantiles(det.max_log_wealth),
        "bets_per_release": quantiles(det.bets.astype(float)),
    }
    if burst == 1:
        extra["rule_check"] = {
            "releases_checked": len(rule),
            "thinned_by_the_gate_rule": thinned,
            "session_window_s": CFG.session_window_s,
        }
    return null_row(name, what, ever, samples, extra)


def floor_null(n: int, samples: int, rng: np.random.Generator) -> JsonObject:
    """The canary at the true boundary mu + tolerance, tested against U + tolerance."""
    delta_each = CFG.floor_delta / floor_count(CFG.edges, CFG.pool_tails)
    cs = UpperConfidenceSequence(CFG.floor_kl_clip, delta_each, n=n)
    for _ in range(FLOOR_N):
        cs.add(rng.gamma(1.5, FLOOR_MU / 1.5, n))
    floor = cs.bound().copy()  # frozen before the canary takes traffic
    m0 = floor + CFG.kl_tolerance
    true_m0 = FLOOR_MU + CFG.kl_tolerance
    merge = ReleaseEProcess({"all:drift_kl": 1.0}, CFG.alpha, n=n)
    det = merge.detectors["all:drift_kl"]
    stream = gamma_at(true_m0)
    for start in range(0, samples, BLOCK):
        xs = np.minimum(stream(rng, n, min(BLOCK, samples - start)), KL_CLIP)
        for j in range(xs.shape[1]):
            det.update(xs[:, j], m0)
    ever = ever_tripped(merge)
    extra: JsonObject = {
        "test": "release-eprocess",
        "floor": {
            "baseline_baseline_mean": FLOOR_MU,
            "comparisons": FLOOR_N,
            "clip": CFG.floor_kl_clip,
            "delta_each": delta_each,
            "upper_bound": quantiles(floor),
            "covered": float(np.mean(floor >= FLOOR_MU)),
        },
        "canary_mean": true_m0,
        "max_log_wealth": quantiles(det.max_log_wealth),
    }
    return null_row(
        "estimated_floor",
        f"the canary at the true boundary mu + tolerance = {true_m0:g}, tested against "
        "the frozen confidence-sequence floor + tolerance",
        ever,
        samples,
        extra,
    )


def cusum_log_m(xs: np.ndarray, log_m: np.ndarray, bet: float) -> np.ndarray:
    """The e-CUSUM recursion of ``ECusum.update``, one step, for every copy."""
    e = 1.0 + (bet / M0) * (np.minimum(xs, KL_CLIP) - M0)
    return np.where(log_m <= 0.0, 0.0, log_m) + np.log(e)


def cusum_null(
    name: str, what: str, stream: Stream, n: int, samples: int, rng: np.random.Generator
) -> JsonObject:
    cfg = GateConfig()
    threshold, bet = cfg.drift_threshold, cfg.drift_bet
    log_a = math.log(threshold)
    log_m = np.zeros(n)
    ever = np.zeros(n, dtype=bool)
    checks = [ECusum(threshold, bet, clip=KL_CLIP) for _ in range(3)]
    for start in range(0, samples, BLOCK):
        xs = stream(rng, n, min(BLOCK, samples - start))
        for j in range(xs.shape[1]):
            log_m = cusum_log_m(xs[:, j], log_m, bet)
            ever |= log_m >= log_a
            if start + j < 5000:  # the vectorised recursion is the class's
                for r, det in enumerate(checks):
                    det.update(float(xs[r, j]), M0, float(start + j))
                    assert math.isclose(det.log_m, float(log_m[r]), abs_tol=1e-9)
    return null_row(
        name,
        what,
        ever,
        samples,
        {
            "test": "cusum (restarting e-CUSUM, A = 1000, bet 0.8: the default)",
            "threshold": threshold,
        },
    )


def detection(shift: float, runs: int, rng: np.random.Generator) -> JsonObject:
    """Comparisons from the fault to the trip of the default release average."""
    weights = release_weights(CFG.edges, CFG.pool_tails, CFG.focus_weight)
    merge = ReleaseEProcess(weights, CFG.alpha, n=runs)
    labels = CFG.labels
    lows = [0, *CFG.edges]
    # Each comparison's bucket: long prompts (half the comparisons) split evenly between
    # 2k-4k and 4k+, short ones by the game day's prompt mix x shadow rates.
    shares = np.array([*((1 - LONG_SHARE) * np.array(SHORT_SPLIT)), LONG_SHARE / 2, LONG_SHARE / 2])
    scopes = [(name, members) for name, members in merge_scopes()]
    healthy = gamma_at(M0 / 20.0)
    faulty = gamma_at(shift * M0)
    tripped_at = np.full(runs, -1)
    affected = np.zeros(runs, dtype=np.int64)
    for i in range(WARMUP + 2000):
        bucket = rng.choice(len(labels), size=runs, p=shares)
        long = np.array([lows[b] >= 2048 for b in range(len(labels))])[bucket]
        after = i >= WARMUP
        x = np.where(long & after, faulty(rng, runs, 1)[:, 0], healthy(rng, runs, 1)[:, 0])
        for name, members in scopes:
            active = np.isin(bucket, members)
            merge.detectors[f"{name}:drift_kl"].update(x, M0, active)
        if after:
            affected += long & (tripped_at < 0)
            hit = merge.tripped() & (tripped_at < 0)
            tripped_at[hit] = i - WARMUP + 1
            if np.all(tripped_at >= 0):
                break
        elif merge.tripped().any():
            raise AssertionError("a false trip in the healthy warm-up")
    done = tripped_at >= 0
    comps = tripped_at[done].astype(float)
    return {
        "shift_x_m0": shift,
        "runs": runs,
        "tripped": int(done.sum()),
        "comparisons_to_trip": quantiles(comps),
        "affected_comparisons_to_trip": quantiles(affected[done].astype(float)),
        "seconds_at": {
            f"{rate:g}": {
                "comparisons_per_s": rate,
                "affected_per_s": rate * LONG_SHARE,
                **quantiles(comps / rate),
            }
            for rate in DETECT_RATES
        },
    }


def merge_scopes() -> list[tuple[str, list[int]]]:
    """(scope, member bucket indexes) of every tested drift scope of the default layout."""
    labels = CFG.labels
    return [
        (name, [labels.index(m) for m in members])
        for name, members in tested_scopes(labels, CFG.pool_tails).items()
    ]


def cusum_detection(shift: float, runs: int, rng: np.random.Generator) -> JsonObject:
    """Affected comparisons to trip one default e-CUSUM (A = 1000) on the same fault."""
    cfg = GateConfig()
    log_a = math.log(cfg.drift_threshold)
    log_m = np.zeros(runs)
    for _ in range(WARMUP):
        log_m = cusum_log_m(gamma_at(M0 / 20.0)(rng, runs, 1)[:, 0], log_m, cfg.drift_bet)
    tripped_at = np.full(runs, -1)
    for i in range(2000):
        log_m = cusum_log_m(gamma_at(shift * M0)(rng, runs, 1)[:, 0], log_m, cfg.drift_bet)
        hit = (log_m >= log_a) & (tripped_at < 0)
        tripped_at[hit] = i + 1
        if np.all(tripped_at >= 0):
            break
    return {
        "shift_x_m0": shift,
        "affected_comparisons_to_trip": quantiles(tripped_at.astype(float)),
    }


def late_fault(n: int, samples: int, rng: np.random.Generator) -> JsonObject:
    """The focus detector alone (its weight, the others at 1): an hour of healthy
    heavy-tailed observations, then 5 x m0; against the same fault from a fresh start."""
    weight = CFG.focus_weight
    log_need = math.log(alone_threshold(weight, CFG.alpha))
    out: JsonObject = {"focus_weight": weight, "alone_threshold": math.exp(log_need)}
    for label, healthy_n in (("fresh", 0), ("after_a_healthy_hour", samples)):
        merge = ReleaseEProcess({"focus": 1.0}, CFG.alpha, n=n)
        det = merge.detectors["focus"]
        stream = lognormal_at(M0 / 10.0, 1.5)
        for start in range(0, healthy_n, BLOCK):
            xs = np.minimum(stream(rng, n, min(BLOCK, healthy_n - start)), KL_CLIP)
            for j in range(xs.shape[1]):
                det.update(xs[:, j], M0)
        wealth_at_fault = det.log_wealth.copy()
        tripped_at = np.full(n, -1)
        for i in range(500):
            det.update(np.minimum(gamma_at(5.0 * M0)(rng, n, 1)[:, 0], KL_CLIP), M0)
            hit = (det.log_wealth >= log_need) & (tripped_at < 0)
            tripped_at[hit] = i + 1
            if np.all(tripped_at >= 0):
                break
        out[label] = {
            "healthy_samples": healthy_n,
            "log_wealth_at_fault": {
                "p5": percentile([float(v) for v in wealth_at_fault], 0.05),
                "min": float(wealth_at_fault.min()),
            },
            "samples_to_trip": quantiles(tripped_at.astype(float)),
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--releases", type=int, default=3000)
    p.add_argument("--hour-s", type=float, default=3600.0, help="release length, seconds")
    p.add_argument("--detection-runs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.releases < 1 or args.hour_s <= 0 or args.detection_runs < 1:
        p.error("--releases and --detection-runs must be >= 1, --hour-s > 0")
    run = Run("gate_null_stress")
    rng = np.random.default_rng(args.seed)
    n, samples = args.releases, round(args.hour_s * RATE)
    t0 = time.process_time()
    null: list[JsonObject] = []

    def timed(row: JsonObject) -> None:
        row["cpu_s"] = round(time.process_time() - t0 - sum(r["cpu_s"] for r in null), 1)
        null.append(row)
        print(
            f"{row['stream']} ({row['test'][:16]}): {row['false_trips']}/{row['releases']}"
            f" false trips, {row['cpu_s']} s",
            file=sys.stderr,
            flush=True,
        )

    timed(eprocess_null("at_m0", "Gamma(1.5), mean m0", gamma_at(M0), n, samples, rng))
    timed(
        eprocess_null("at_0.9_m0", "Gamma(1.5), mean 0.9 m0", gamma_at(0.9 * M0), n, samples, rng)
    )
    timed(
        eprocess_null(
            "lognormal_heavy",
            "lognormal, sigma 2, mean m0 before the clip",
            lognormal_at(M0, 2.0),
            n,
            samples,
            rng,
        )
    )
    timed(
        eprocess_null(
            "pareto_heavy",
            "Pareto, shape 1.5 (infinite variance), mean m0 before the clip",
            pareto_at(M0, 1.5),
            n,
            samples,
            rng,
        )
    )
    timed(
        session_null(
            "sessions_thinned",
            f"{SESSIONS} sessions, levels Gamma(2) x m0, one comparison per session every "
            f"{SESSIONS / RATE:g} s (the gate's rule admits each)",
            1,
            n,
            samples,
            rng,
        )
    )
    timed(
        session_null(
            "sessions_bursts_no_rule",
            f"the same sessions, {BURST} comparisons in a row each, no dependence rule",
            BURST,
            n,
            samples,
            rng,
        )
    )
    timed(floor_null(n, samples, rng))
    timed(cusum_null("at_m0", "Gamma(1.5), mean m0", gamma_at(M0), n, samples, rng))
    timed(cusum_null("at_0.9_m0", "Gamma(1.5), mean 0.9 m0", gamma_at(0.9 * M0), n, samples, rng))
    timed(
        cusum_null(
            "lognormal_heavy",
            "lognormal, sigma 2, mean m0 before the clip",
            lognormal_at(M0, 2.0),
            n,
            samples,
            rng,
        )
    )
    det = [detection(s, args.detection_runs, rng) for s in SHIFTS]
    cusum_det = [cusum_detection(s, args.detection_runs, rng) for s in SHIFTS]
    late = late_fault(min(n, 1000), samples, rng)
    figures: JsonObject = {
        "config": {
            "alpha": CFG.alpha,
            "floor_delta": CFG.floor_delta,
            "threshold": 1.0 / CFG.alpha,
            "m0": M0,
            "kl_clip": KL_CLIP,
            "comparisons_per_s": RATE,
            "release_s": args.hour_s,
            "bet_fractions": list(DEFAULT_BET_FRACTIONS),
            "bet_discount": DEFAULT_BET_DISCOUNT,
            "focus_detector": f"{focus_scope(CFG.edges, CFG.pool_tails)}:drift_kl",
            "focus_weight": CFG.focus_weight,
            "long_share_of_comparisons": LONG_SHARE,
        },
        "null_stress": null,
        "detection": det,
        "cusum_detection": cusum_det,
        "late_fault": late,
        "cpu_s": round(time.process_time() - t0, 1),
    }
    run.write(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
