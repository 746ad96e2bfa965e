"""Router pure parts: hashing split and stickiness, pin parsing, prompt counting,
fail-safe weight, pool order, the KL math and the logprob collector/rewriter."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from canary_contract import strictjson
from canarystack import tokenizer
from canarystack.common.buckets import DEFAULT_EDGES
from canarystack.common.errors import BadRequest
from canarystack.router import shadow
from canarystack.router.__main__ import build_parser, settings_from_args
from canarystack.router.config import effective_weight
from canarystack.router.proxy import DOWN_S, Pool
from canarystack.router.records import ComparisonRecord
from canarystack.router.routing import (
    COUNT_SLICE_CHARS,
    canary_threshold,
    choose_variant,
    count_tokens,
    parse_pin,
    prompt_tokens_of,
    user_slot,
)
from canarystack.tokenizer import make_prompt
from tests.model_helpers import chat_answer

USERS = [f"user-{i}" for i in range(20_000)]


@pytest.mark.parametrize("weight", [0.5, 1, 5, 10, 25, 50, 90])
def test_split_is_within_one_point_over_20k_users(weight: float) -> None:
    canary = sum(
        choose_variant(release="default", user_key=u, weight_pct=weight, prompt_tokens=10)
        == "canary"
        for u in USERS
    )
    share_pct = 100 * canary / len(USERS)
    assert abs(share_pct - weight) <= 1.0, (weight, share_pct)


def test_user_keeps_variant_and_raising_weight_only_moves_users_to_canary() -> None:
    def variants(weight: float) -> list[str]:
        return [
            choose_variant(release="default", user_key=u, weight_pct=weight, prompt_tokens=1)
            for u in USERS[:5000]
        ]

    at5 = variants(5)
    assert at5 == variants(5)  # sticky while the weight does not change
    at20 = variants(20)
    moved_back = [u for u, a, b in zip(USERS, at5, at20, strict=False) if a == "canary" != b]
    assert moved_back == []
    assert at20.count("canary") > at5.count("canary")
    # 0 and 100 are exact
    assert set(variants(0)) == {"baseline"}
    assert set(variants(100)) == {"canary"}


def test_slot_is_stable_across_processes_and_salted_by_release() -> None:
    # A fixed value: the hash must not depend on PYTHONHASHSEED or the process.
    assert user_slot("default", "alice") == user_slot("default", "alice")
    assert 0 <= user_slot("default", "alice") < 10_000
    same = sum(user_slot("a", u) == user_slot("b", u) for u in USERS[:2000])
    assert same < 20  # different releases pick different users
    assert canary_threshold(5) == 500 and canary_threshold(0.01) == 1


def test_random_key_split_when_no_user_id() -> None:
    rng = random.Random(7)
    n = 20_000
    canary = sum(
        choose_variant(release="r", user_key=None, weight_pct=10, prompt_tokens=5, rng=rng)
        == "canary"
        for _ in range(n)
    )
    assert abs(100 * canary / n - 10) <= 1.0


def test_long_prompts_never_go_to_the_canary() -> None:
    for u in USERS[:500]:
        assert (
            choose_variant(
                release="r",
                user_key=u,
                weight_pct=100,
                prompt_tokens=2049,
                max_canary_prompt_tokens=2048,
            )
            == "baseline"
        )
    assert (
        choose_variant(
            release="r",
            user_key="u",
            weight_pct=100,
            prompt_tokens=2048,
            max_canary_prompt_tokens=2048,
        )
        == "canary"
    )


def test_pin_header_parsing() -> None:
    assert parse_pin(None) is None
    assert parse_pin("canary") == "canary"
    assert parse_pin(" Baseline ") == "baseline"
    with pytest.raises(BadRequest, match="x-canary-variant") as exc:
        parse_pin("blue")
    assert exc.value.param == "x-canary-variant"


def test_prompt_token_count_for_completions_and_chat() -> None:
    assert prompt_tokens_of({"prompt": make_prompt(300)}) == 300
    assert prompt_tokens_of({"prompt": [make_prompt(3)]}) == 3
    assert prompt_tokens_of({"prompt": [1, 2, 3, 4]}) == 4
    # chat: one role marker token per message plus the words
    body = {"messages": [{"role": "user", "content": make_prompt(10)}]}
    assert prompt_tokens_of(body) == 11
    # malformed prompts never raise
    assert prompt_tokens_of({"prompt": {"x": 1}}) == 0
    assert prompt_tokens_of({"messages": "nope"}) == 0


@pytest.mark.parametrize(
    ("release", "weight"),
    [
        (None, 0.0),
        ({"phase": "progressing", "canary": {"version": "v2"}, "weights": {"canary": 5}}, 5.0),
        ({"phase": "tripped", "canary": {"version": "v2"}, "weights": {"canary": 5}}, 0.0),
        ({"phase": "rolling_back", "canary": {"version": "v2"}, "weights": {"canary": 5}}, 0.0),
        ({"phase": "rolled_back", "canary": {"version": "v2"}, "weights": {"canary": 5}}, 0.0),
        ({"phase": "progressing", "canary": None, "weights": {"canary": 5}}, 0.0),
        (
            {
                "phase": "progressing",
                "canary": {"version": "v2", "quarantined": True},
                "weights": {"canary": 5},
            },
            0.0,
        ),
        ({"phase": "progressing", "canary": {"version": "v2"}, "weights": {}}, 0.0),
    ],
)
def test_effective_weight_is_fail_safe(release: dict[str, object] | None, weight: float) -> None:
    assert effective_weight(release) == weight


def test_pool_round_robin_skips_a_down_replica_for_a_while() -> None:
    now = [100.0]
    pool = Pool.from_urls("baseline", ["http://a", "http://b", "http://c"], clock=lambda: now[0])
    firsts = [pool.candidates()[0].url for _ in range(6)]
    assert firsts == ["http://a", "http://b", "http://c"] * 2
    b = pool.upstreams[1]
    pool.mark_down(b)
    for _ in range(6):
        order = [u.url for u in pool.candidates()]
        assert order[-1] == "http://b"  # still tried, but last
    now[0] += DOWN_S + 0.01
    assert "http://b" in [pool.candidates()[0].url for _ in range(3)]
    assert [u.url for u in pool.candidates(exclude="http://a")].count("http://a") == 0


# ----------------------------------------------------------------------------- KL math


def _lp(probs: dict[str, float]) -> dict[str, float]:
    return {t: math.log(p) for t, p in probs.items()}


def test_kl_is_zero_for_identical_and_matches_the_formula() -> None:
    p = _lp({"a": 0.5, "b": 0.3, "c": 0.1})
    assert shadow.kl_topk(p, p) == pytest.approx(0.0, abs=1e-12)
    q = _lp({"a": 0.3, "b": 0.5, "d": 0.1})
    # By hand: floors are min(min prob, 1 - sum) = min(0.1, 0.1) = 0.1 on both sides.
    pp = {"a": 0.5, "b": 0.3, "c": 0.1, "d": 0.1}
    qq = {"a": 0.3, "b": 0.5, "c": 0.1, "d": 0.1}
    sp, sq = sum(pp.values()), sum(qq.values())
    expected = sum((pp[t] / sp) * math.log((pp[t] / sp) / (qq[t] / sq)) for t in pp)
    assert shadow.kl_topk(p, q) == pytest.approx(expected, rel=1e-12)
    assert shadow.kl_topk(p, q) > 0


def test_kl_grows_with_disagreement() -> None:
    base = _lp({"a": 0.6, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.03})
    near = _lp({"a": 0.55, "b": 0.25, "c": 0.1, "d": 0.05, "e": 0.03})
    far = _lp({"x": 0.6, "y": 0.2, "z": 0.1, "a": 0.05, "b": 0.03})
    assert 0 < shadow.kl_topk(base, near) < shadow.kl_topk(base, far)


def test_positions_compared_only_on_a_shared_prefix() -> None:
    top = {"a": -0.1, "b": -2.5}
    a = [shadow.Position("a", top), shadow.Position("b", top), shadow.Position("c", top)]
    b_same = [shadow.Position("a", top), shadow.Position("b", top), shadow.Position("c", top)]
    b_diverge = [shadow.Position("a", top), shadow.Position("x", top), shadow.Position("c", top)]
    # The prefix decides, not the temperature: sampled sides that drew the same tokens
    # condition on the same context (was: sampling compared position 0 only).
    assert len(shadow.compare_positions(a, b_same)) == 3
    # positions 0 and 1 share the prefix; position 2 follows different tokens
    assert len(shadow.compare_positions(a, b_diverge)) == 2
    # a first token drawn differently leaves position 0 only
    assert len(shadow.compare_positions(a, [shadow.Position("x", top), *b_same[1:]])) == 1
    scores = shadow.compare_positions(a, [shadow.Position("a", {"b": -0.1, "a": -2.5})])
    assert scores[0].top1_agree is False


def test_a_sampled_request_without_a_seed_gets_a_fresh_one_and_the_copy_keeps_it() -> None:
    body = {"prompt": "hi", "max_tokens": 30}  # no temperature: the server's default, 1
    seeds = {shadow.coupled_body(body)["seed"] for _ in range(50)}
    assert len(seeds) > 1 and all(isinstance(x, int) and 0 <= x < shadow.SEED_RANGE for x in seeds)
    assert "seed" not in body  # the caller's body is not changed
    coupled = shadow.coupled_body({**body, "temperature": 0.7})
    copy = shadow.shadow_body(coupled, chat=False, k=5, max_tokens=8)
    assert copy["seed"] == coupled["seed"] and copy["max_tokens"] == 8
    # Greedy requests and seeds the user chose go as they came (any value: upstream judges).
    for kept in ({**body, "temperature": 0}, {**body, "seed": 7}, {**body, "seed": "x"}):
        assert shadow.coupled_body(kept) == kept


def test_shadow_rates_parse_and_reject_bad_input() -> None:
    rates = shadow.parse_shadow_rates("0-512=0.5,4k+=0", DEFAULT_EDGES)
    assert rates["0-512"] == 0.5 and rates["4k+"] == 0 and rates["2k-4k"] == 1.0
    with pytest.raises(ValueError, match="BUCKET=RATE"):
        shadow.parse_shadow_rates("0-100=1", DEFAULT_EDGES)
    with pytest.raises(ValueError, match="from 0 to 1"):
        shadow.parse_shadow_rates("0-512=2", DEFAULT_EDGES)


# ------------------------------------------------------------------ logprob rewriting


def _completion_event(tok: str, top: dict[str, float]) -> bytes:
    obj = {
        "choices": [
            {
                "index": 0,
                "text": tok,
                "logprobs": {"tokens": [tok], "token_logprobs": [top[tok]], "top_logprobs": [top]},
            }
        ]
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_collector_strips_logprobs_and_collects_positions_across_split_chunks() -> None:
    stream = (
        _completion_event(" a", {" a": -0.1, " b": -2.0, " c": -3.0})
        + _completion_event(" b", {" b": -0.2, " a": -1.9, " d": -3.0})
        + b"data: [DONE]\n\n"
    )
    col = shadow.Collector(
        shadow.LogprobRequest(chat=False, k=5, user_k=None), 8, clock=lambda: 1.0
    )
    out = b""
    for i in range(0, len(stream), 7):  # awkward chunk boundaries
        out += col.feed_chunk(stream[i : i + 7])
    out += col.flush()
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    for ev in events[:-1]:
        choice = json.loads(ev[len(b"data: ") :])["choices"][0]
        assert choice["logprobs"] is None
    assert [p.token for p in col.positions] == [" a", " b"]
    assert col.positions[0].top == {" a": -0.1, " b": -2.0, " c": -3.0}


def test_collector_trims_to_the_users_k_and_passes_through_when_enough() -> None:
    ev = _completion_event(" a", {" a": -0.1, " b": -2.0, " c": -3.0})
    trim = shadow.Collector(shadow.LogprobRequest(chat=False, k=5, user_k=1), 8, clock=lambda: 1.0)
    out = trim.feed_chunk(ev)
    top = json.loads(out.split(b"\n\n")[0][6:])["choices"][0]["logprobs"]["top_logprobs"][0]
    assert top == {" a": -0.1}
    keep = shadow.Collector(shadow.LogprobRequest(chat=False, k=5, user_k=5), 8, clock=lambda: 1.0)
    assert keep.feed_chunk(ev) == ev  # the user asked for all of it: bytes untouched
    assert len(keep.positions[0].top) == 3


def test_collector_chat_shape_non_streaming() -> None:
    body = chat_answer(" a", {" a": -0.1, " b": -2.4})
    col = shadow.Collector(shadow.LogprobRequest(chat=True, k=5, user_k=None), 8, clock=lambda: 1.0)
    out = json.loads(col.feed_body(json.dumps(body).encode()))
    assert out["choices"][0]["logprobs"] is None
    assert col.positions[0].top == {" a": -0.1, " b": -2.4}


def test_user_logprob_detection_and_shadow_body() -> None:
    assert shadow.user_logprobs_k({"logprobs": 3}, chat=False) == 3
    assert shadow.user_logprobs_k({}, chat=False) is None
    assert shadow.user_logprobs_k({"logprobs": True, "top_logprobs": 2}, chat=True) == 2
    assert shadow.user_logprobs_k({"logprobs": False}, chat=True) is None
    body = {"prompt": "x y", "max_tokens": 100, "temperature": 0, "stream": False, "seed": 3}
    sb = shadow.shadow_body(body, chat=False, k=5, max_tokens=8)
    assert sb["max_tokens"] == 8 and sb["stream"] is True and sb["logprobs"] == 5
    assert sb["seed"] == 3 and sb["temperature"] == 0 and sb["prompt"] == "x y"
    assert (
        shadow.shadow_body({**body, "max_tokens": 2}, chat=False, k=5, max_tokens=8)["max_tokens"]
        == 2
    )


# ------------------------------------------------------------- a broken engine (#12)

GOOD_TOP = {" a": -0.1, " b": -2.0, " c": -3.0}


def _raw_completion_event(text: str, logprobs: str) -> bytes:
    """An event written by hand, so it can hold what json.dumps would not (NaN tokens)."""
    return (
        b'data: {"choices":[{"index":0,"text":'
        + text.encode()
        + b',"logprobs":'
        + logprobs.encode()
        + b"}]}\n\n"
    )


def _collect(stream: bytes, user_k: int | None = None) -> tuple[shadow.Collector, bytes]:
    col = shadow.Collector(
        shadow.LogprobRequest(chat=False, k=5, user_k=user_k), 8, clock=lambda: 1.0
    )
    out = col.feed_chunk(stream) + col.flush()
    return col, out


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_kl_of_a_non_finite_logprob_is_maximal_never_zero_or_an_error(bad: float) -> None:
    # Before: NaN gave 0.0 (max(0.0, nan)) and +-inf raised ValueError.
    p = {" a": -0.1, " b": -2.5}
    assert shadow.kl_topk(p, {" a": bad, " b": -2.5}) == shadow.KL_MAX_NATS
    assert shadow.kl_topk({" a": bad, " b": bad}, p) == shadow.KL_MAX_NATS


def test_kl_of_a_zero_probability_token_is_finite() -> None:
    # exp(-1e300) is 0.0: no log(0), no division by zero.
    tiny = {" a": -1e300, " b": -0.1}
    assert math.isfinite(shadow.kl_topk(tiny, {" a": -0.1, " b": -2.0}))
    assert math.isfinite(shadow.kl_topk({" a": -0.1, " b": -2.0}, tiny))


@pytest.mark.parametrize(
    ("logprobs", "reason"),
    [
        ('{"tokens":[" a"],"token_logprobs":[NaN],"top_logprobs":[{" a":NaN}]}', shadow.NON_FINITE),
        (
            '{"tokens":[" a"],"token_logprobs":[-Infinity],"top_logprobs":[{" a":-Infinity}]}',
            shadow.NON_FINITE,
        ),
        (
            '{"tokens":[" a"],"token_logprobs":[Infinity],"top_logprobs":[{" a":1e999}]}',
            shadow.NON_FINITE,
        ),
        ('{"tokens":[" a"],"top_logprobs":[{}]}', shadow.MALFORMED),
        ('{"tokens":[" a"],"top_logprobs":[{" a":"high"}]}', shadow.MALFORMED),
        ('{"tokens":[" a"],"top_logprobs":[{" a":4.0}]}', shadow.MALFORMED),
        ('"yes"', shadow.MALFORMED),
        ("null", shadow.MISSING),
    ],
)
def test_collector_marks_a_broken_logprobs_object(logprobs: str, reason: str) -> None:
    col, _ = _collect(_raw_completion_event('" a"', logprobs) + b"data: [DONE]\n\n")
    assert col.broken == reason
    assert all(math.isfinite(v) for p in col.positions for v in p.top.values())


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (b"data: {not json at all\n\n", shadow.BAD_JSON),
        (b"data: [1, 2]\n\n", shadow.BAD_JSON),
        (
            _raw_completion_event("17", '{"tokens":[" a"],"top_logprobs":[{" a":-0.1}]}'),
            shadow.BAD_TEXT,
        ),
        (b'data: {"choices":[{"index":0,"delta":{"content":["x"]}}]}\n\n', shadow.BAD_TEXT),
    ],
)
def test_collector_marks_garbage_output(event: bytes, reason: str) -> None:
    good = _completion_event(" a", GOOD_TOP)
    col, _ = _collect(good + event + b"data: [DONE]\n\n")
    assert col.invalid == reason


def test_a_healthy_stream_is_not_broken() -> None:
    col, _ = _collect(
        _completion_event(" a", GOOD_TOP) + _completion_event(" b", GOOD_TOP) + b"data: [DONE]\n\n"
    )
    assert col.broken is None and len(col.positions) == 2


def test_stripping_a_nan_event_leaves_strict_json_for_the_user() -> None:
    nan = _raw_completion_event('" a"', '{"tokens":[" a"],"top_logprobs":[{" a":NaN}]}')
    col, out = _collect(nan + b"data: [DONE]\n\n", user_k=None)
    assert col.invalid == shadow.NON_FINITE
    first = out.split(b"\n\n")[0][len(b"data: ") :]
    assert strictjson.loads(first)["choices"][0]["logprobs"] is None


def _side(top: dict[str, float] | None = None, invalid: str | None = None) -> shadow.SideResult:
    positions = [shadow.Position(" a", top)] if top is not None else []
    return shadow.SideResult(positions=positions, ttft_s=0.01, version="v", invalid=invalid)


def _result(
    pair: str, a: shadow.SideResult, b: shadow.SideResult, **over: Any
) -> tuple[str, ComparisonRecord | None]:
    """``comparison_result`` of a short-prompt pair; ``over`` replaces any field."""
    fields: dict[str, Any] = {
        "bucket": "0-512",
        "prompt_tokens": 3,
        "request_id": "r",
        "topk": 5,
    }
    return shadow.comparison_result(pair=pair, a=a, b=b, **{**fields, **over})


@pytest.mark.parametrize(
    "reason", [shadow.NON_FINITE, shadow.MALFORMED, shadow.BAD_JSON, shadow.BAD_TEXT]
)
def test_a_broken_canary_side_is_a_comparison_of_maximal_divergence(reason: str) -> None:
    result, record = _result("baseline-canary", _side(GOOD_TOP), _side(invalid=reason))
    assert result == "canary_invalid" and record is not None
    assert record["kl_mean"] == record["kl_first"] == shadow.KL_MAX_NATS
    assert record["top1_agree"] == 0.0 and record["invalid"] == reason
    assert record["positions"] == 1
    strictjson.dumps(record)  # finite: the gate can take it


def test_a_canary_side_without_logprobs_counts_as_missing() -> None:
    result, record = _result("baseline-canary", _side(GOOD_TOP), _side(None))
    assert result == "canary_invalid" and record is not None
    assert record["invalid"] == shadow.MISSING


def test_a_broken_baseline_side_is_dropped_not_canary_drift() -> None:
    assert _result("baseline-canary", _side(invalid=shadow.NON_FINITE), _side(GOOD_TOP)) == (
        "baseline_invalid",
        None,
    )
    # Both broken: the baseline's brokenness says nothing about the canary.
    assert (
        _result("baseline-canary", _side(invalid=shadow.BAD_JSON), _side(invalid=shadow.BAD_JSON))[
            1
        ]
        is None
    )


def test_a_broken_side_of_a_noise_pair_is_dropped() -> None:
    for a, b in (
        (_side(GOOD_TOP), _side(invalid=shadow.NON_FINITE)),
        (_side(None), _side(GOOD_TOP)),
    ):
        assert _result("baseline-baseline", a, b) == ("invalid_dropped", None)
    result, record = _result("baseline-baseline", _side(GOOD_TOP), _side(GOOD_TOP))
    assert result == "ok" and record is not None and record["kl_mean"] == 0.0


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--max-body-bytes", "10"], "--max-body-bytes must be at least"),
        (["--watch-error-failsafe-s", "inf"], "--watch-error-failsafe-s must be a finite"),
        (["--watch-error-failsafe-s", "0"], "--watch-error-failsafe-s must be a finite"),
        (["--watch-error-failsafe-s", "nan"], "--watch-error-failsafe-s must be a finite"),
    ],
)
def test_router_flags_refuse_unsafe_limits(flags: list[str], says: str) -> None:
    args = build_parser().parse_args(["--baseline", "http://127.0.0.1:1", *flags])
    with pytest.raises(SystemExit, match=says):
        settings_from_args(args)


def test_router_body_limit_defaults_to_4_mib() -> None:
    args = build_parser().parse_args(["--baseline", "http://127.0.0.1:1"])
    settings = settings_from_args(args)
    assert settings.max_body_bytes == 1024**2 and settings.watch_error_failsafe_s == 10.0


def test_long_prompts_are_counted_in_slices_with_the_same_count() -> None:
    rng = random.Random(5)
    for n in (10, COUNT_SLICE_CHARS - 1, COUNT_SLICE_CHARS + 1, 3 * COUNT_SLICE_CHARS + 17):
        text = "".join(rng.choice("ab \n\t\u2003xyz") for _ in range(n))
        assert count_tokens(text) == tokenizer.count_tokens(text)
    long = make_prompt(100_000, seed=2)
    assert prompt_tokens_of({"prompt": long}) == 100_000


def test_a_sampled_token_beyond_the_top_k_is_not_compared() -> None:
    """A completions answer lists its sampled token in top_logprobs too (vLLM, simulator):
    at temperature 1 each side may append a different one beyond the top 5. Two sides with
    identical distributions must still compare at KL 0 (was 0.27: the noise floor of one
    gameday run rose 50x from one such baseline-baseline comparison)."""
    top5 = {" a": -0.5, " b": -1.6, " c": -2.3, " d": -2.9, " e": -3.2}
    a = shadow.SideResult(
        positions=[shadow.Position(" f", {**top5, " f": -3.5})], version="v1"
    )  # rank 6
    b = shadow.SideResult(
        positions=[shadow.Position(" zz", {**top5, " zz": -8.8})], version="v1"
    )  # tail
    result, record = _result("baseline-baseline", a, b, bucket="1k-2k", prompt_tokens=1500)
    assert result == "ok" and record is not None
    assert record["kl_mean"] == 0.0 and record["top1_agree"] == 1.0
