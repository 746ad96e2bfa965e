"""The oracle's own KL and top-1 agreement (gameday.oracle), independent of canarystack."""

from __future__ import annotations

import math

import pytest

from gameday import oracle
from tests.model_helpers import chat_answer


def lp(**probs: float) -> dict[str, float]:
    return {t: math.log(p) for t, p in probs.items()}


def test_identical_lists_give_zero() -> None:
    p = lp(a=0.5, b=0.3, c=0.1)
    assert oracle.kl_topk(p, p) == 0.0


def test_same_support_is_the_textbook_kl_after_renormalising() -> None:
    p, q = lp(a=0.6, b=0.4), lp(a=0.5, b=0.5)
    expected = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)
    assert oracle.kl_topk(p, q) == pytest.approx(expected, rel=1e-12)


def test_missing_tokens_get_the_floor_from_the_unlisted_mass() -> None:
    # P lists a, b (0.9 in total); Q lists a, c. The union is {a, b, c}.
    p, q = lp(a=0.6, b=0.3), lp(a=0.7, c=0.2)
    # P's floor for c: min(max(0.1 / 1, 1e-6), 0.3) = 0.1; Q's floor for b: min(0.1, 0.2) = 0.1
    ph = {"a": 0.6, "b": 0.3, "c": 0.1}
    qh = {"a": 0.7 / 1.0, "b": 0.1 / 1.0, "c": 0.2 / 1.0}
    expected = sum(ph[t] * math.log(ph[t] / qh[t]) for t in ph)
    assert oracle.kl_topk(p, q) == pytest.approx(expected, rel=1e-12)


def test_floor_never_exceeds_the_least_listed_token_and_is_finite() -> None:
    # P lists little mass: its unlisted share (0.9 over 1 token) is capped at 0.05
    p, q = lp(a=0.05, b=0.05), lp(a=0.05, c=0.05)
    assert math.isfinite(oracle.kl_topk(p, q)) and oracle.kl_topk(p, q) == pytest.approx(
        0.0, abs=1e-12
    )
    # a full list on one side: nothing unlisted, the floor is epsilon
    disjoint = oracle.kl_topk(lp(a=1.0), lp(b=1.0))
    assert math.isfinite(disjoint) and disjoint == oracle.KL_CLIP  # ln(1/ε) ≈ 13.8, clipped


def test_compare_stops_after_the_first_diverging_token() -> None:
    same = oracle.Position(" a", lp(**{" a": 0.7, " b": 0.2}))
    other = oracle.Position(" b", lp(**{" b": 0.6, " a": 0.3}))
    never = oracle.Position(" z", lp(**{" z": 0.9}))
    cmp = oracle.compare_positions([same, same, same, never], [same, other, never, never])
    assert cmp.positions == 2  # position 1 differs; later positions see other prefixes
    assert cmp.kl_first == 0.0 and cmp.top1_agree == 0.5
    assert cmp.kl_mean == pytest.approx(oracle.kl_topk(same.top, other.top) / 2)
    with pytest.raises(oracle.BrokenBaseline, match="no logprobs"):
        oracle.compare_positions([], [same])


def test_parse_completions_and_chat_logprob_shapes() -> None:
    completions = {
        "choices": [
            {
                "text": " iou inea",
                "logprobs": {
                    "tokens": [" iou", " inea"],
                    "token_logprobs": [-0.29, -0.99],
                    "top_logprobs": [
                        {" iou": -0.29, " idou": -2.4},
                        {" inea": -0.99, " ibo": -1.3},
                    ],
                },
            }
        ]
    }
    got = oracle.parse_logprobs(completions)
    assert [p.token for p in got] == [" iou", " inea"] and got[1].top1 == " inea"
    chat = chat_answer(" ofu", {" ofu": -0.1, " oshe": -3.2})
    (pos,) = oracle.parse_logprobs(chat)
    assert pos.top == {" ofu": -0.1, " oshe": -3.2}
    with pytest.raises(ValueError, match="no logprobs"):
        oracle.parse_logprobs({"choices": [{"text": "x", "logprobs": None}]})
