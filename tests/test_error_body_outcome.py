"""A 200 whose body is an error is an error (#27, finding 3).

A canary that answers HTTP 200 with an OpenAI-shaped error body — ``{"error": {...}}``
non-streamed, or an SSE ``data: {"error": {...}}`` event streamed — must reach the gate as
an error outcome (``error_body``), never as a success. Here the canary is a real HTTP
upstream that answers that way (a small aiohttp app in a background thread), behind a real
router process; the gate is ``GateReceiver``, which records what the router pushes. Answers
that only mention "error" in their text or as a top-logprob token stay successes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from canarystack.router.error_body import MAX_EVENT_BYTES, ErrorEvents
from tests import router_support as rs
from tests.procs import Spawner, wait_for

ERROR = {
    "error": {
        "message": "CUDA error: an illegal memory access was encountered",
        "type": "server_error",
        "param": None,
        "code": 500,
    }
}


def _completion(text: str) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "default",
        "choices": [
            {
                "index": 0,
                "text": text,
                "finish_reason": "length",
                # A token named "error" is a key here: not an error body.
                "logprobs": {"tokens": [" a"], "top_logprobs": [{'"error"': -0.1, " a": -2.0}]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


class FakeUpstream(rs.ThreadedApp):
    """A model server that answers by prompt: ``error-body`` gives 200 with an error body
    (streamed: one good event, then an error event, then ``[DONE]``); anything else a
    healthy answer whose text says ``{"error": ...}`` (escaped, as JSON writes it)."""

    what = "fake upstream"

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bad = body.get("prompt", "").startswith("error-body")
        headers = {"x-model-version": "fake"}
        if not body.get("stream"):
            answer = ERROR if bad else _completion('{"error": "just text"}')
            return web.json_response(answer, headers=headers)
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event(_completion(" a")))
        # The error event arrives in two writes: a scanner must see across chunks.
        event = _event(ERROR) if bad else _event(_completion(' "error": no'))
        await resp.write(event[:9])
        await asyncio.sleep(0.02)
        await resp.write(event[9:])
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._complete)


@pytest.fixture
def upstreams() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    baseline, canary = FakeUpstream().start(), FakeUpstream().start()
    try:
        yield baseline, canary
    finally:
        baseline.stop()
        canary.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_200_with_an_error_body_is_an_error_outcome(
    spawn: Spawner,
    tmp_path: Path,
    gate: rs.GateReceiver,
    upstreams: tuple[FakeUpstream, FakeUpstream],
    stream: bool,
) -> None:
    baseline, canary = upstreams
    rs.write_release_cache(tmp_path, weight=100)  # every unpinned request goes to the canary
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--shadow-rates", "0-512=0", gate=gate.url
    )
    sent = {"bad": "error-body please", "good": "healthy please"}
    for rid, prompt in sent.items():
        r = rs.completion(
            router.url,
            prompt,
            headers={"x-request-id": rid, "x-user-id": rid},
            stream=stream,
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-served-by"] == "canary"
        # The user gets the answer as the upstream sent it: only the evidence changes.
        assert (b"illegal memory access" in r.content) is (rid == "bad")

    def outcomes() -> dict[str, Any]:
        return {o["request_id"]: o["error"] for o in gate.records("outcomes")}

    wait_for(lambda: set(outcomes()) == set(sent), what="both outcomes at the gate")
    assert outcomes() == {"bad": "error_body", "good": None}
    counted = rs.metric(router, "router_upstream_errors_total", variant="canary", kind="error_body")
    assert counted == 1


@pytest.mark.parametrize(
    ("chunks", "found"),
    [
        ([b'data: {"error": {"message": "x"}}\n\n', b"data: [DONE]\n\n"], True),
        ([b'data: {"id": 1}\r\n\r\ndata: {"err', b'or": {"code": 500}}\r', b"\n\r\n"], True),
        ([b'data: {"id": 1}\n', b'\ndata: {"error": "oom"}'], True),  # no blank line at the end
        ([b'data: {"error": null}\n\n'], False),
        ([b'data: {"choices": [{"text": "\\"error\\": 1"}]}\n\n'], False),
        ([b'data: {"top_logprobs": [{"\\"error\\"": -0.1, "error": -1}]}\n\n'], False),
        ([b": keep-alive\n\n", b"data: [DONE]\n\n"], False),
    ],
)
def test_an_error_event_is_found_however_the_stream_is_cut(
    chunks: list[bytes], found: bool
) -> None:
    events = ErrorEvents()
    for chunk in chunks:
        events.feed(chunk)
    assert events.finish() is found


def test_an_event_too_long_to_be_real_is_not_kept() -> None:
    events = ErrorEvents()
    events.feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 1))
    events.feed(b'"error"}\n\n')
    assert events.finish() is False
