"""The oracle fails closed (#12 item 1): a broken canary is maximal drift, never silence.

Unit level: ``kl_topk``/``compare_positions`` on non-finite and missing logprobs. End to
end: the load users' real HTTP client against a real HTTP server (in this process, on
real sockets) that answers as a broken engine would — ``NaN``/``Infinity`` as JSON
tokens, garbage, a router's 409 ``canary_off`` — and the oracle's judgement of the pair.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from gameday.load.client import Attempt, OpenAIClient
from gameday.load.pairs import judge_pair
from gameday.oracle import (
    KL_CLIP,
    BrokenBaseline,
    Position,
    compare_positions,
    kl_topk,
    parse_logprobs,
)
from gameday.oracle.wire import WireJsonError, loads
from tests.procs import ADMIN_TOKEN, Spawner, inject_fault
from tests.test_load_oracle import lp

SOUND = lp(a=0.6, b=0.3, c=0.1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_canary_logprobs_are_the_clip_never_zero(bad: float) -> None:
    # before: NaN gave max(0.0, nan) == 0.0 (no drift), -inf a ZeroDivisionError
    assert kl_topk(SOUND, {"a": bad}) == KL_CLIP
    assert kl_topk(SOUND, {"a": -0.5, "b": bad}) == KL_CLIP
    assert kl_topk(SOUND, {}) == KL_CLIP  # nothing listed: malformed


def test_a_broken_baseline_is_reported_not_counted_as_canary_drift() -> None:
    with pytest.raises(BrokenBaseline, match=r"baseline token 'a'.*not finite"):
        kl_topk({"a": math.nan}, SOUND)
    with pytest.raises(BrokenBaseline, match="no logprobs"):
        compare_positions([], [Position("a", SOUND)])


def test_every_kl_is_clipped_to_a_finite_bound() -> None:
    disjoint = kl_topk(lp(a=1.0), lp(b=1.0))  # ln(1/1e-6) ≈ 13.8 before the clip
    assert disjoint == KL_CLIP


def test_a_canary_without_positions_or_with_a_broken_one_is_maximal_divergence() -> None:
    good = Position("a", SOUND)
    cmp = compare_positions([good, good], [])
    assert (cmp.kl_mean, cmp.kl_first, cmp.top1_agree) == (KL_CLIP, KL_CLIP, 0.0)
    assert cmp.canary_broken is not None and "no logprobs" in cmp.canary_broken
    # position 0 is sound and identical, position 1 is NaN: the pair is maximal drift
    cmp = compare_positions([good, good], [good, Position("a", {"a": math.nan})])
    assert cmp.kl_mean == KL_CLIP and cmp.top1_agree == 0.0
    assert cmp.canary_broken is not None and "position 1" in cmp.canary_broken


def test_parse_refuses_malformed_logprobs_naming_the_position() -> None:
    chat = {
        "choices": [
            {"logprobs": {"content": [{"token": "x", "logprob": "-0.1", "top_logprobs": []}]}}
        ]
    }
    with pytest.raises(ValueError, match=r"position 0 chosen token: logprob is '-0\.1'"):
        parse_logprobs(chat)
    legacy = {"choices": [{"logprobs": {"tokens": ["x"], "top_logprobs": [{"x": 0.7}]}}]}
    with pytest.raises(ValueError, match="probability above 1"):
        parse_logprobs(legacy)


def test_strict_wire_reading_refuses_what_a_server_never_sends() -> None:
    for raw, why in (
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "-Infinity"),
        (b'{"a": ' + b"9" * 5000 + b"}", "5000 digits"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"a": "\xff"}', "UTF-8"),
    ):
        with pytest.raises(WireJsonError, match=why):
            loads(raw)
    assert math.isnan(loads(b'{"a": NaN}', keep_non_finite=True)["a"])


# --- end to end: the real client against a real HTTP server ---------------------------


def completion(logprob: str = "-0.1", other: str = "-2.5") -> bytes:
    """A chat completion whose logprobs are spliced in as raw JSON text."""
    return (
        '{"object": "chat.completion", "choices": [{"index": 0, "message": {"role": '
        '"assistant", "content": " ofu"}, "logprobs": {"content": [{"token": " ofu", '
        f'"logprob": {logprob}, "top_logprobs": [{{"token": " ofu", "logprob": {logprob}}}, '
        f'{{"token": " oshe", "logprob": {other}}}]}}]}}, "finish_reason": "length"}}], '
        '"usage": {"prompt_tokens": 5, "completion_tokens": 1}}'
    ).encode()


CANARY_OFF = (
    b'{"error": {"message": "the canary of release default is off (phase tripped)", '
    b'"type": "conflict", "code": "canary_off"}}'
)

ANSWERS: dict[str, tuple[int, bytes]] = {
    "/sound/v1/chat/completions": (200, completion()),
    "/nan/v1/chat/completions": (200, completion("NaN", "NaN")),
    "/inf/v1/chat/completions": (200, completion("-Infinity", "-Infinity")),
    "/garbage/v1/chat/completions": (200, b"\x00\x17 <<kernel fault>> \xc3\x28"),
    "/nologprobs/v1/chat/completions": (
        200,
        b'{"choices": [{"index": 0, "message": {"content": "x"}}], "usage": {}}',
    ),
    "/off/v1/chat/completions": (409, CANARY_OFF),
    "/down/v1/chat/completions": (500, b'{"error": {"message": "boom", "code": null}}'),
}


class Canned(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, body = ANSWERS[self.path]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        t.join(timeout=5)
        httpd.server_close()


def ask(server: str, side: str) -> Attempt:
    client = OpenAIClient(f"{server}/{side}", timeout_s=5)
    try:
        a = client.new_attempt("/v1/chat/completions", stream=False)
        client.send(a, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        return a
    finally:
        client.close()


@pytest.mark.parametrize("side", ["nan", "inf", "garbage", "nologprobs"])
def test_a_broken_canary_over_http_is_maximal_drift_with_no_error(server: str, side: str) -> None:
    fields, error, outcome = judge_pair(ask(server, "sound"), ask(server, side))
    assert (outcome, error) == ("canary_broken", None)
    assert fields["kl_mean"] == KL_CLIP and fields["kl_first"] == KL_CLIP
    assert fields["top1_agree"] == 0.0


def test_sound_sides_over_http_are_a_plain_pair(server: str) -> None:
    fields, error, outcome = judge_pair(ask(server, "sound"), ask(server, "sound"))
    assert (outcome, error) == ("pair", None)
    assert fields["kl_mean"] == 0.0 and fields["top1_agree"] == 1.0


def test_a_broken_baseline_over_http_is_reported_as_the_baseline(server: str) -> None:
    fields, error, outcome = judge_pair(ask(server, "nan"), ask(server, "sound"))
    assert outcome == "baseline_broken" and fields == {}
    assert error is not None and error.startswith("baseline broken: ") and "nan" in error


def test_canary_off_409_is_no_pair_and_no_failure(server: str) -> None:
    can = ask(server, "off")
    assert can.status == 409 and can.error_code == "canary_off"
    fields, error, outcome = judge_pair(ask(server, "sound"), can)
    assert outcome == "canary_off" and fields == {}
    assert error == "canary_off: HTTP 409: the canary of release default is off (phase tripped)"


def test_a_canary_5xx_stays_a_canary_error(server: str) -> None:
    _, error, outcome = judge_pair(ask(server, "sound"), ask(server, "down"))
    assert outcome == "failed" and error == "canary: http_status: HTTP 500: boom"


def test_stream_and_body_readers_refuse_hostile_json_without_crashing() -> None:
    from gameday.load.sse import StreamMeasurement, parse_full_response

    deep = "[" * 100_000 + "]" * 100_000
    m = StreamMeasurement(t_sent=0.0)
    m.on_payload(deep, 1.0)  # before: RecursionError out of the stream reader
    assert m.malformed is not None and "nested deeper than 64" in m.malformed
    with pytest.raises(ValueError, match=r"not JSON we read: .*digits"):
        parse_full_response(b'{"choices": [], "usage": {"prompt_tokens": ' + b"7" * 5000 + b"}}")


def test_the_same_input_failing_on_both_sides_is_the_requests_fault(server: str) -> None:
    _, error, outcome = judge_pair(ask(server, "down"), ask(server, "down"))
    assert outcome == "failed"
    assert (
        error == "both: baseline: http_status: HTTP 500: boom; canary: http_status: HTTP 500: boom"
    )


def test_a_huge_integer_logprob_is_broken_not_an_overflow() -> None:
    legacy = {"choices": [{"logprobs": {"tokens": ["x"], "top_logprobs": [{"x": -(10**400)}]}}]}
    with pytest.raises(ValueError, match="too large for a float"):
        parse_logprobs(legacy)


# --- end to end: the simulator's own broken-kernel modes --------------------------------

FAST = ("--ttft-base-ms", "5", "--prefill-ms-per-1k", "10", "--itl-ms", "1")


def completion_pair(baseline_url: str, canary_url: str) -> tuple[Attempt, Attempt]:
    body = {
        "model": "default",
        "prompt": " ".join(["ka"] * 40),
        "max_tokens": 4,
        "temperature": 0,
        "seed": 0,
        "logprobs": 5,
        "stream": False,
    }
    out = []
    for url in (baseline_url, canary_url):
        client = OpenAIClient(url, timeout_s=10)
        try:
            a = client.new_attempt("/v1/completions", stream=False)
            client.send(a, body)
            out.append(a)
        finally:
            client.close()
    return out[0], out[1]


def test_the_simulators_broken_kernels_are_maximal_drift_to_the_oracle(spawn: Spawner) -> None:
    baseline = spawn("canarystack.model", "--version", "v1", *FAST)
    canary = spawn("canarystack.model", "--version", "v1", *FAST)  # same version: no drift
    fields, error, outcome = judge_pair(*completion_pair(baseline.url, canary.url))
    assert (outcome, error, fields["kl_mean"]) == ("pair", None, 0.0)
    for mode in ("nan-logits", "inf-logits"):
        fault = {"kind": "kernel", "ttl_s": 30, "mode": mode, "min_prompt_tokens": 0}
        fault_id = inject_fault(canary.url, fault, {"x-actor": "test"})["id"]
        fields, error, outcome = judge_pair(*completion_pair(baseline.url, canary.url))
        assert (outcome, error) == ("canary_broken", None), mode
        assert fields["kl_mean"] == KL_CLIP and fields["top1_agree"] == 0.0, mode
        cleared = requests.delete(
            f"{canary.url}/admin/faults/{fault_id}",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "x-actor": "test"},
            timeout=5,
        )
        assert cleared.status_code == 200, cleared.text
