"""Which detectors a release runs in the one-test-per-release mode (``--test
release-eprocess``), the weight each gets in the release's average, and the guarantee the
gate states for it (``release_budget_json``).

The weights. A detector's weight sets how much evidence it needs to trip the release alone
(``canarystack.gate.eprocess.alone_threshold``: about ``1 / (alpha w)``), so the weights
say where the power goes. The faulty kernels this gate exists for drift on long prompts
first, so the KL detector of the *focus scope* (the narrowest tested scope holding every
bucket of prompts of at least ``LONG_PROMPT_TOKENS`` tokens: ``2k+`` at the default edges)
gets ``focus_weight`` (default 0.4: it trips alone at ~2,500 with alpha 1e-3, against 1,000
for a lone test). The rest is shared in fixed proportions, evenly within each group: the
other KL scopes 0.20, the top-1 disagreement scopes 0.10, latency 0.15 and errors 0.15 (of
1 - 0.4 = 0.6 at the default; ``GROUP_SHARES``). A group with no detector gives its share
to the focus.

This module must never do I/O; it knows the gate's layout (``scopes``), not its state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

from canarystack.common.buckets import bucket_labels
from canarystack.gate.eprocess import DEFAULT_BET_DISCOUNT, DEFAULT_BET_FRACTIONS, alone_threshold
from canarystack.gate.scopes import tested_scopes

LONG_PROMPT_TOKENS = 2048
DEFAULT_FOCUS_WEIGHT = 0.4
# The groups sharing 1 - focus_weight, in these proportions (they sum to 1).
GROUP_SHARES: dict[str, float] = {
    "drift_kl": 0.2 / 0.6,
    "drift_top1": 0.1 / 0.6,
    "latency": 0.15 / 0.6,
    "errors": 0.15 / 0.6,
}
TESTS = ("drift_kl", "drift_top1", "latency", "errors")


def detector_name(scope: str, test: str) -> str:
    """``"2k+:drift_kl"``: one detector's name in a release's average."""
    return f"{scope}:{test}"


def focus_scope(edges: Sequence[int], pool_tails: bool) -> str:
    """The tested drift scope whose KL detector gets ``focus_weight``: the narrowest one
    holding every bucket whose prompts have at least ``LONG_PROMPT_TOKENS`` tokens (the
    last bucket when none starts that high)."""
    labels = bucket_labels(edges)
    lows = [0, *edges]
    long = {b for b, lo in zip(labels, lows, strict=True) if lo >= LONG_PROMPT_TOKENS}
    long = long or {labels[-1]}
    tested = tested_scopes(labels, pool_tails)
    holding = [name for name, members in tested.items() if long <= set(members)]
    if not holding:  # no pooled tail: the bucket scope of the longest prompts
        holding = [name for name, members in tested.items() if labels[-1] in members]
    return min(holding, key=lambda name: (len(tested[name]), name))


def release_weights(
    edges: Sequence[int], pool_tails: bool, focus_weight: float = DEFAULT_FOCUS_WEIGHT
) -> dict[str, float]:
    """``{detector name: weight}`` of a release (they sum to 1): the focus scope's KL
    detector ``focus_weight``, the rest by ``GROUP_SHARES``, evenly within a group."""
    if not 0.0 < focus_weight < 1.0:
        raise ValueError(f"focus_weight must be in (0, 1), got {focus_weight!r}")
    labels = bucket_labels(edges)
    tested = tested_scopes(labels, pool_tails)
    focus = focus_scope(edges, pool_tails)
    groups: dict[str, list[str]] = {
        "drift_kl": [detector_name(s, "drift_kl") for s in tested if s != focus],
        "drift_top1": [detector_name(s, "drift_top1") for s in tested],
        "latency": [detector_name(b, "latency") for b in labels],
        "errors": [detector_name(b, "errors") for b in labels],
    }
    rest = 1.0 - focus_weight
    weights = {detector_name(focus, "drift_kl"): focus_weight}
    for group, names in groups.items():
        share = rest * GROUP_SHARES[group]
        if not names:
            weights[detector_name(focus, "drift_kl")] += share
        for name in names:
            weights[name] = share / len(names)
    total = math.fsum(weights.values())
    return {k: w / total for k, w in weights.items()}


def floor_count(edges: Sequence[int], pool_tails: bool) -> int:
    """Confidence sequences the floors of a release run (KL and top-1 per tested scope);
    the floors' delta is split evenly over them (a union bound)."""
    return 2 * len(tested_scopes(bucket_labels(edges), pool_tails))


class TestCount(TypedDict):
    detectors: int


class BetJson(TypedDict):
    fractions: list[float]
    discount: float
    rule: str


class FloorBudgetJson(TypedDict):
    method: str
    confidence_sequences: int
    delta_each: float
    kl_clip: float
    top1_clip: float
    min_samples: int
    fallback: str


class DependenceJson(TypedDict):
    rule: str
    key: str
    session_window_s: float


class InvalidAnswerJson(TypedDict):
    weight: float
    rule: str


class ReleaseBudget(TypedDict):
    """The release test's false-alarm budget (``release_budget_json``);
    ``observed_max_sample_rate_hz`` once a gate adds what it sees
    (``views.budget_json``)."""

    test: str
    merge: str
    alpha: float
    floor_delta: float
    false_trip_probability_per_release: float
    threshold: float
    detectors: int
    per_test: dict[str, TestCount]
    focus_detector: str
    focus_alone_threshold: float
    weights: dict[str, float]
    bet: BetJson
    noise_floor: FloorBudgetJson
    dependence: DependenceJson
    invalid_answer: InvalidAnswerJson
    guarantee: str
    observed_max_sample_rate_hz: NotRequired[float | None]


def release_budget_json(
    *,
    edges: Sequence[int],
    pool_tails: bool,
    alpha: float,
    floor_delta: float,
    focus_weight: float,
    floor_kl_clip: float,
    floor_top1_clip: float,
    floor_min_samples: int,
    invalid_weight: float,
    session_window_s: float,
) -> ReleaseBudget:
    """What the release test guarantees and how (``/v1/gate``'s ``false_alarm_budget``,
    the start-up log line)."""
    weights = release_weights(edges, pool_tails, focus_weight)
    focus = detector_name(focus_scope(edges, pool_tails), "drift_kl")
    floors = floor_count(edges, pool_tails)
    counts = {t: sum(1 for k in weights if k.endswith(":" + t)) for t in TESTS}
    return {
        "test": "release-eprocess",
        "merge": "weighted average of betting e-processes (one test per release)",
        "alpha": alpha,
        "floor_delta": floor_delta,
        "false_trip_probability_per_release": alpha + floor_delta,
        "threshold": 1.0 / alpha,
        "detectors": len(weights),
        "per_test": {t: {"detectors": n} for t, n in counts.items()},
        "focus_detector": focus,
        "focus_alone_threshold": alone_threshold(weights[focus], alpha),
        "weights": {k: round(w, 6) for k, w in weights.items()},
        "bet": {
            "fractions": list(DEFAULT_BET_FRACTIONS),
            "discount": DEFAULT_BET_DISCOUNT,
            "rule": "the candidate fraction with the highest discounted past log-wealth, "
            "0 when none is positive (predictable; off while the evidence is healthy)",
        },
        "noise_floor": {
            "method": "predictable plug-in empirical-Bernstein upper confidence sequence "
            "(Waudby-Smith & Ramdas 2024, Thm 2), running minimum, frozen per release",
            "confidence_sequences": floors,
            "delta_each": floor_delta / floors,
            "kl_clip": floor_kl_clip,
            "top1_clip": floor_top1_clip,
            "min_samples": floor_min_samples,
            "fallback": "the clip (the bound with no data) while a scope has fewer than "
            "min_samples baseline-baseline comparisons",
        },
        "dependence": {
            "rule": f"at most one comparison per session key every {session_window_s:g} s "
            "enters the test",
            "key": "the comparison's session, else its trace_id",
            "session_window_s": session_window_s,
        },
        "invalid_answer": {
            "weight": invalid_weight,
            "rule": f"a comparison with an invalid canary side counts as {invalid_weight:g} "
            "x the null mean (capped at the clip), not as maximal divergence",
        },
        "guarantee": "P(any false trip during the release) <= alpha + floor_delta, however "
        "long the release and whatever the sample rate, for every canary whose "
        "observations meet their null means given the past (drift: the baseline-baseline "
        "noise mean + tolerance; latency: P(slower than ratio x baseline) <= 1/2; errors: "
        "the baseline's recent error-rate upper bound + tolerance); Ville's inequality on "
        "the weighted average, a union bound over the floors' confidence sequences",
    }


def weights_by_test(weights: Mapping[str, float]) -> dict[str, float]:
    """The weight each test holds in total."""
    out = dict.fromkeys(TESTS, 0.0)
    for name, w in weights.items():
        out[name.rsplit(":", 1)[1]] += w
    return out
