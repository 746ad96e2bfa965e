"""Reference rules, replayed on the recorded sample stream of a run (``stack.Tap``):

- seed article: trip when the mean KL of the last 100 baseline-canary comparisons (all
  buckets; evaluated once 100 exist) exceeds 0.05, or when more than 5 % of the canary's
  TTFTs (outcomes since the run began, once 20 exist) exceed 1.15 x the baseline's P99;
- Flagger-style: every ``--flagger-interval-s`` (default 10 s) one check - failed when
  that interval's mean KL > 0.05 or its canary TTFT P99 > 1.15 x baseline P99 (intervals
  without comparisons are skipped, the charitable reading); trip after
  ``--flagger-threshold`` (default 3) failed checks. (Flagger's defaults, interval 1m and
  threshold 5, cannot trip in under 5 minutes.)
- ours offline: the gate's own code at its defaults (``GateConfig.from_budget``), fed the
  same batches (used on the uncut streams of the open runs).
"""

from __future__ import annotations

import argparse

from canary_contract.json import JsonObject
from canarystack.gate.state import GateConfig, ReleaseGate, SampleBatch, release_record
from detection.stack import Batches

SEED_KL_WINDOW = 100
SEED_KL_THRESHOLD = 0.05
SEED_TTFT_FACTOR = 1.15
SEED_TTFT_SHARE = 0.05
SEED_MIN_CANARY_TTFTS = 20


def run_stream(batches: Batches, version: str) -> tuple[Batches, Batches]:
    """(arrival, comparison) for this canary version and (arrival, outcome) lists."""
    comps: Batches = []
    outs: Batches = []
    for t, b in batches:
        for c in b.get("comparisons", []):
            if c.get("pair") == "baseline-canary" and c.get("version_b") == version:
                comps.append((t, c))
        for o in b.get("outcomes", []):
            outs.append((t, o))
    return comps, outs


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def seed_rule(batches: Batches, version: str) -> float | None:
    """Arrival time of the batch at which the seed article's rule trips, or None."""
    kls: list[float] = []
    canary: list[float] = []
    baseline: list[float] = []
    for t, b in batches:
        comps, outs = run_stream([(t, b)], version)
        kls += [c["kl_mean"] for _, c in comps]
        for _, o in outs:
            if o.get("ttft_s") is None or o.get("error"):
                continue
            (canary if o["variant"] == "canary" else baseline).append(o["ttft_s"])
        if len(kls) >= SEED_KL_WINDOW:
            window = kls[-SEED_KL_WINDOW:]
            if sum(window) / len(window) > SEED_KL_THRESHOLD:
                return t
        if len(canary) >= SEED_MIN_CANARY_TTFTS and baseline:
            limit = SEED_TTFT_FACTOR * p99(baseline)
            if sum(1 for x in canary if x > limit) > SEED_TTFT_SHARE * len(canary):
                return t
    return None


def flagger_rule(
    batches: Batches,
    version: str,
    start: float,
    interval_s: float,
    threshold: int,
) -> float | None:
    """Time of the check at which the Flagger-style rule trips, or None."""
    if not batches:
        return None
    failed = 0
    end = batches[-1][0]
    k = 1
    while start + k * interval_s <= end + interval_s:
        t0, t1 = start + (k - 1) * interval_s, start + k * interval_s
        comps, outs = run_stream([(t, b) for t, b in batches if t0 <= t < t1], version)
        k += 1
        if t1 > end + 1e-9 and not comps:
            break
        if not comps:
            continue  # no data this interval: skipped, not failed
        kl = sum(c["kl_mean"] for _, c in comps) / len(comps)
        can = [o["ttft_s"] for _, o in outs if o["variant"] == "canary" and o.get("ttft_s")]
        base = [o["ttft_s"] for _, o in outs if o["variant"] == "baseline" and o.get("ttft_s")]
        slow = bool(can and base and p99(can) > SEED_TTFT_FACTOR * p99(base))
        if kl > SEED_KL_THRESHOLD or slow:
            failed += 1
            if failed >= threshold:
                return t1
    return None


def our_rule_offline(batches: Batches, version: str) -> float | None:
    """Our gate's decision on a recorded stream (the gate's own code, its defaults)."""
    gate = ReleaseGate("default", GateConfig.from_budget())  # as the gate process
    gate.on_release(release_record("default", 1, "v1", version, 5), 0.0)
    for t, b in batches:
        try:
            batch = SampleBatch.model_validate(b)
        except ValueError:
            continue
        gate.ingest(batch, t, t)
        if gate.trip is not None:
            return t
    return None


def replay(
    batches: Batches,
    version: str,
    start: float,
    fault: float | None,
    args: argparse.Namespace,
) -> JsonObject:
    ref = fault if fault is not None else start
    out: JsonObject = {}
    for name, t in (
        ("seed_article", seed_rule(batches, version)),
        (
            "flagger",
            flagger_rule(batches, version, start, args.flagger_interval_s, args.flagger_threshold),
        ),
    ):
        out[name] = None if t is None else round(t - ref, 4)
    return out
