"""Divergence between two sides of a shadow comparison: the KL math and the comparison
record the gate reads.

This module must never do I/O, raise on a broken side, or put a non-finite number in a
record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from canarystack.router.records import ComparisonRecord

FLOOR_EPS = 1e-6
# Maximal divergence: what a comparison against a broken canary side counts as. The gate
# clips each comparison's KL at its --drift-kl-clip (default 1.0 nats), so this is the
# largest value the gate's drift test can use.
KL_MAX_NATS = 1.0

# Why a side is invalid (SideResult.invalid, the record's "invalid").
NON_FINITE = "non_finite_logprobs"
MALFORMED = "malformed_logprobs"
MISSING = "missing_logprobs"
BAD_JSON = "bad_json"
BAD_TEXT = "bad_text"


def kl_topk(
    p_top: Mapping[str, float], q_top: Mapping[str, float], eps: float = FLOOR_EPS
) -> float:
    """KL(P || Q) in nats over the union of two top-k lists (token -> logprob).

    The formula is below (floor for missing tokens, renormalised).
    A non-finite logprob on either side, or a result that is not finite, is maximal
    divergence (``KL_MAX_NATS``): never 0, never an exception.

    KL per position, over the union of the two top-k sets. For side X in {P, Q} (P is the
    baseline, Q the canary — or the second baseline replica) with top-k set T_X and
    log-probabilities l_X(t)::

        U       = T_P ∪ T_Q
        f_X     = max(eps, min(min_{s in T_X} exp l_X(s),  1 - sum_{s in T_X} exp l_X(s)))
        p~_X(t) = exp l_X(t)  if t in T_X  else  f_X          (floor for a token X did not list)
        p_X(t)  = p~_X(t) / sum_{u in U} p~_X(u)              (renormalised over U)
        KL(P || Q) = sum_{t in U} p_P(t) * ln(p_P(t) / p_Q(t))   [nats, >= 0]

    with eps = 1e-6. The floor is the largest probability a token missing from X's top-k
    could have (it is at most X's k-th probability and at most X's tail mass), so a token
    that only fell just below the other side's cut-off costs little, and a token the other
    side ranks high but X does not list at all costs a lot. Per comparison we report the mean
    KL over compared positions, the KL at position 0, the share of positions whose top-1
    tokens agree, both TTFTs (send to first content event), the bucket and the versions.
    """
    if not p_top or not q_top:
        raise ValueError("kl_topk needs two non-empty top-k lists")
    values = (*p_top.values(), *q_top.values())
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return KL_MAX_NATS
    p_probs = {t: math.exp(lp) for t, lp in p_top.items()}
    q_probs = {t: math.exp(lp) for t, lp in q_top.items()}
    p_floor = max(eps, min(min(p_probs.values()), 1.0 - sum(p_probs.values())))
    q_floor = max(eps, min(min(q_probs.values()), 1.0 - sum(q_probs.values())))
    union = p_probs.keys() | q_probs.keys()
    p_vals = [p_probs.get(t, p_floor) for t in union]
    q_vals = [q_probs.get(t, q_floor) for t in union]
    p_sum = sum(p_vals)
    q_sum = sum(q_vals)
    kl = 0.0
    for pv, qv in zip(p_vals, q_vals, strict=True):
        pn = pv / p_sum
        if pn <= 0.0:
            continue  # 0 * log(0 / q) is 0
        qn = qv / q_sum
        if qn <= 0.0:
            return KL_MAX_NATS  # P lists a token Q gives probability 0: unbounded
        kl += pn * math.log(pn / qn)
    if not math.isfinite(kl):
        return KL_MAX_NATS
    return max(0.0, kl)


def top1(top: Mapping[str, float]) -> str:
    # Ties broken by token text so both sides break them the same way.
    return max(top.items(), key=lambda kv: (kv[1], kv[0]))[0]


def rank(v: Any) -> float:
    """Sort key for a logprob that may be malformed (what is not a finite number sorts last)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return math.inf
    return -float(v)


def truncate_top(top: Mapping[str, float], k: int) -> dict[str, float]:
    if len(top) <= k:
        return dict(top)
    return dict(sorted(top.items(), key=lambda kv: (rank(kv[1]), str(kv[0])))[:k])


@dataclass
class Position:
    """One generated position: the token chosen and the top-k alternatives."""

    token: str | None
    top: dict[str, float]


@dataclass
class PositionScore:
    kl: float
    top1_agree: bool


def compare_positions(
    a: list[Position], b: list[Position], topk: int | None = None
) -> list[PositionScore]:
    """Scores at the positions where both sides condition on the same prefix.

    Which positions are compared. Position 0 (the first generated token) always: both sides
    condition on the same prompt. Position i > 0 while the tokens generated at positions
    0..i-1 agree on both sides, at any temperature: a position's distribution depends only
    on the prompt and the tokens before it (logprobs are the raw model's, before
    temperature), so two sides that drew the same prefix are scored on the same context.
    Greedy sides agree until a near-tie flips; sampled sides agree as long as their draws
    do, which a shared seed makes likely (``shadow.coupled_body``). Past the first
    disagreement the two sides condition on different prefixes and are not comparable. The
    top-k lists are cut to the shorter side's k, and to ``topk`` (the k the router asked
    for) when given: a completions answer also lists its *sampled* token (vLLM does, so
    does the simulator), which at temperature > 0 is now and then outside the top k. That
    extra entry is no part of the top-k set ``kl_topk``'s floor assumes: two sides that each
    sampled a different token beyond the top k would compare at up to ~0.6 nats with
    identical distributions.
    """
    scores: list[PositionScore] = []
    for i in range(min(len(a), len(b))):
        if i > 0 and not (a[i - 1].token is not None and a[i - 1].token == b[i - 1].token):
            break
        pa, pb = a[i].top, b[i].top
        k = min(len(pa), len(pb))
        if topk is not None:
            k = min(k, topk)
        if k == 0:
            break
        pa, pb = truncate_top(pa, k), truncate_top(pb, k)
        scores.append(PositionScore(kl_topk(pa, pb), top1(pa) == top1(pb)))
    return scores


@dataclass
class SideResult:
    positions: list[Position] = field(default_factory=list)
    ttft_s: float | None = None
    version: str = ""
    error: str | None = None  # the side failed (http_5xx, broken_stream, connect, ...)
    invalid: str | None = None  # the side answered, but broken (comparison_result)
    # The model server's x-dependency answer ("ok" | "degraded"), None when it sent none.
    dependency: str | None = None


@dataclass(frozen=True)
class _Pairing:
    """Two sides' answers to one prompt, and what the gate's record says about the prompt."""

    pair: str
    a: SideResult
    b: SideResult
    bucket: str
    prompt_tokens: int
    request_id: str
    topk: int

    def record(
        self, positions: int, kl_mean: float, kl_first: float, agree: float
    ) -> ComparisonRecord:
        """The comparison record (docs/ARCHITECTURE.md §3) with these scores."""
        return {
            "time": time.time(),
            "pair": self.pair,
            "bucket": self.bucket,
            "prompt_tokens": self.prompt_tokens,
            "positions": positions,
            "kl_mean": kl_mean,
            "kl_first": kl_first,
            "top1_agree": agree,
            "ttft_a_s": self.a.ttft_s,
            "ttft_b_s": self.b.ttft_s,
            "version_a": self.a.version,
            "version_b": self.b.version,
            "request_id": self.request_id,
        }

    def compared(self) -> ComparisonRecord | None:
        """The scored comparison, or None when nothing is comparable."""
        scores = compare_positions(self.a.positions, self.b.positions, self.topk)
        if not scores:
            return None
        kls = [s.kl for s in scores]
        agree = sum(1 for s in scores if s.top1_agree) / len(scores)
        return self.record(len(scores), sum(kls) / len(kls), kls[0], agree)

    def broken(self, reason: str) -> ComparisonRecord:
        """A comparison of maximal divergence against a broken side ``b`` (finite values)."""
        out = self.record(max(1, len(self.a.positions)), KL_MAX_NATS, KL_MAX_NATS, 0.0)
        out["invalid"] = reason
        return out


def comparison_result(
    *,
    pair: str,
    a: SideResult,
    b: SideResult,
    bucket: str,
    prompt_tokens: int,
    request_id: str,
    topk: int,
) -> tuple[str, ComparisonRecord | None]:
    """(result for the metric, record for the gate or None) for two sides that answered.

    ``a`` is a baseline side; ``b`` the canary (baseline-canary) or a second baseline.
    Results: ``ok``; ``canary_invalid`` (record of maximal divergence); ``baseline_invalid``
    and ``invalid_dropped`` (dropped: a broken baseline says nothing about the canary, and
    the noise floor must stay finite); ``not_comparable``.

    Invalid sides. In a baseline-canary pair an invalid canary side (``SideResult.invalid``,
    why its answer is broken: ``collector.py``) is a comparison of maximal divergence
    (``KL_MAX_NATS``, top-1 disagreement, ``"invalid": <reason>`` in the record); an invalid
    baseline side says nothing about the canary and is dropped (counted). In a
    baseline-baseline pair an invalid side is dropped (counted), so the noise floor never sees
    an infinite value.
    """
    a_bad = a.invalid or (MISSING if b.positions and not a.positions else None)
    b_bad = b.invalid or (MISSING if a.positions and not b.positions else None)
    pairing = _Pairing(pair, a, b, bucket, prompt_tokens, request_id, topk)
    if pair == "baseline-canary":
        if a_bad is not None:
            return "baseline_invalid", None
        if b_bad is not None:
            return "canary_invalid", pairing.broken(b_bad)
    elif a_bad is not None or b_bad is not None:
        return "invalid_dropped", None
    record = pairing.compared()
    if record is None:
        return "not_comparable", None
    return "ok", record
