"""A shadow comparison is scored once both sides hold the positions it compares, not when
the user's whole answer has been relayed (#26 item 3); it carries the request's session key
for the gate's dependence rule (#26 item 4); long-prompt buckets keep in-flight slots of
their own; a comparison reaches the gate within ~50 ms, not at the next 200 ms tick.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
import requests

from canarystack.router.__main__ import build_parser, settings_from_args
from canarystack.router.collector import Collector, LogprobRequest
from canarystack.router.samples import SampleQueue, outcome_record
from canarystack.router.session_key import PREFIX_BYTES, session_key
from canarystack.router.shadow import ShadowManager, ShadowSettings, ShadowStats
from tests import router_support as rs
from tests.procs import Spawner, wait_for


def _digest(kind: str, text: str) -> str:
    return f"{kind}:{hashlib.sha256(text.encode()).hexdigest()[:24]}"


# ------------------------------------------------------------------ session key


def test_the_session_key_is_the_user_then_the_header_then_the_prompt_opening() -> None:
    body = {"prompt": "hello", "user": "alice"}
    assert session_key(body, False, "bob") == _digest("u", "alice")
    assert session_key({"prompt": "hello"}, False, "bob") == _digest("u", "bob")
    assert session_key({"prompt": "hello"}, False, None) == _digest("p", '"hello"')
    assert session_key({"prompt": "hello", "user": ""}, False, None) == _digest("p", '"hello"')
    assert session_key({}, False, None) is None


def test_turns_of_one_conversation_share_a_key_and_other_conversations_do_not() -> None:
    system = {"role": "system", "content": "be brief"}
    turn1 = [system, {"role": "user", "content": "what is a canary?"}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "a release"},
        {"role": "user", "content": "and?"},
    ]
    other = [system, {"role": "user", "content": "what is a gate?"}]
    k1 = session_key({"messages": turn1}, True, None)
    assert k1 is not None and k1.startswith("p:")
    assert session_key({"messages": turn2}, True, None) == k1
    assert session_key({"messages": other}, True, None) != k1
    # A growing completions prompt keeps its opening: the same key up to PREFIX_BYTES.
    opening = "x" * PREFIX_BYTES
    assert session_key({"prompt": opening + " more"}, False, None) == session_key(
        {"prompt": opening + " much more text"}, False, None
    )
    assert session_key({"prompt": "a" + opening}, False, None) != session_key(
        {"prompt": "b" + opening}, False, None
    )


# ------------------------------------------------------- in-flight slots, flushing


def _manager(max_inflight: int, reserved: int) -> tuple[ShadowManager, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    settings = ShadowSettings(
        rates={"0-512": 1.0, "512-1k": 0.5, "2k-4k": 1.0},
        noise_fraction=0.0,
        max_inflight=max_inflight,
        reserved_long=reserved,
    )
    stats = ShadowStats(lambda pair, result: seen.append((pair, result)), lambda p, b: None)
    return ShadowManager(settings, stats), seen


def test_short_buckets_cannot_take_the_slots_reserved_for_long_prompts() -> None:
    mgr, seen = _manager(max_inflight=8, reserved=4)
    assert mgr.settings.long_bucket("2k-4k") and mgr.settings.long_bucket("0-512")
    assert not mgr.settings.long_bucket("512-1k")
    mgr.inflight = 4
    # 512-1k is shadowed at 0.5: a draw below it is sampled; force it with a fixed rng.
    mgr.rng.random = lambda: 0.0  # type: ignore[method-assign]
    assert mgr.plan("512-1k", "baseline", True, 1) == []
    assert seen == [("baseline-canary", "dropped_cap")]
    assert mgr.plan("2k-4k", "baseline", True, 1) == ["baseline-canary"]
    mgr.inflight = 3
    assert mgr.plan("512-1k", "baseline", True, 1) == ["baseline-canary"]
    mgr.inflight = 8
    assert mgr.plan("2k-4k", "baseline", True, 1) == []


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--shadow-reserved-long", "8"], "--shadow-reserved-long must be from 0 to"),
        (["--shadow-reserved-long", "-1"], "--shadow-reserved-long must be from 0 to"),
    ],
)
def test_router_refuses_a_reservation_that_leaves_short_buckets_no_slot(
    flags: list[str], says: str
) -> None:
    args = build_parser().parse_args(["--baseline", "http://127.0.0.1:9", *flags])
    with pytest.raises(SystemExit, match=says):
        settings_from_args(args)


def test_the_reservation_defaults_to_half_the_slots() -> None:
    for cap, want in (("8", 4), ("4", 2), ("1", 0)):
        args = build_parser().parse_args(
            ["--baseline", "http://127.0.0.1:9", "--shadow-max-inflight", cap]
        )
        settings = settings_from_args(args)
        assert settings.shadow is not None and settings.shadow.reserved_long == want


def test_a_comparison_wakes_the_pusher_and_an_outcome_waits_for_the_tick() -> None:
    async def main() -> tuple[bool, bool]:
        q = SampleQueue(100)
        record = outcome_record(
            variant="baseline",
            bucket="0-512",
            prompt_tokens=1,
            ttft_s=None,
            error=None,
            request_id="r",
        )
        q.put("outcome", record)
        after_outcome = q.wakeup.is_set()
        q.put("comparison", record)  # only the kind wakes the pusher
        return after_outcome, q.wakeup.is_set()

    assert asyncio.run(main()) == (False, True)


def test_the_collector_says_once_when_it_holds_its_positions() -> None:
    calls: list[int] = []
    col = Collector(LogprobRequest(chat=False, k=2, user_k=None), 3, time.perf_counter)
    col.on_full = lambda: calls.append(len(col.positions))

    def event(tok: str) -> bytes:
        lp = {"tokens": [tok], "top_logprobs": [{tok: -0.1, "z": -2.5}]}
        choice = {"index": 0, "text": tok, "logprobs": lp}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

    for tok in ("a", "b"):
        col.feed_chunk(event(tok))
    assert calls == []
    for tok in ("c", "d", "e"):
        col.feed_chunk(event(tok))
    assert calls == [3]


# ------------------------------------------------------------ through a real router


def test_a_long_answer_is_compared_before_it_ends_and_frees_its_slot(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    # 160 tokens at 40 ms: the user's stream lasts ~6.4 s; the comparison reads 8 positions.
    slow = ("--itl-ms", "40", "--itl-jitter", "0")
    baseline = rs.start_model(spawn, "v1", *slow)
    canary = rs.start_model(spawn, "v1", *slow)
    rs.write_release_cache(tmp_path, weight=100)  # the canary serves, the copy goes to baseline
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--shadow-rates", "0-512=1", gate=gate.url
    )
    ended = threading.Event()
    chunks: list[bytes] = []

    def read_stream() -> None:
        with requests.post(
            router.url + "/v1/completions",
            json={
                "model": "default",
                "prompt": "hello there world",
                "max_tokens": 160,
                "stream": True,
                "temperature": 0,
            },
            headers={"x-user-id": "user-7"},
            stream=True,
            timeout=60,
        ) as r:
            assert r.status_code == 200
            chunks.extend(r.iter_content(chunk_size=None))
        ended.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    try:
        wait_for(lambda: gate.records("comparisons"), timeout=20, what="the comparison at the gate")
        assert not ended.is_set(), "the comparison waited for the whole answer"
        (record,) = gate.records("comparisons")
        assert record["pair"] == "baseline-canary"
        assert record["positions"] == 8
        assert record["session"] == _digest("u", "user-7")
        # The copy gave its in-flight slot back while the user's answer still streams.
        assert rs.health(router)["shadow_inflight"] == 0
        assert not ended.is_set()
    finally:
        reader.join(timeout=60)
    assert ended.is_set()
    assert b"[DONE]" in b"".join(chunks)
    # The outcome comes when the answer ends, once.
    wait_for(lambda: gate.records("outcomes"), what="the outcome at the gate")
    assert len(gate.records("outcomes")) == 1
    assert len(gate.records("comparisons")) == 1
