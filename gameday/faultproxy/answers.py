"""The answers the proxy makes up itself, in the OpenAI/vLLM shapes: an error (as a JSON
body, or as an SSE event), an empty completion, and a hang's opening event.

This module must never decide timing or touch the network.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from canary_contract.errors import ErrorKind
from gameday.faultproxy.prompt import RequestFacts
from gameday.faultproxy.sse import DONE, data_event, dumps

FAULT_CODE = "simulated_fault"
ERROR_MESSAGES = {
    500: "Simulated engine failure (an 'errors' fault with error_kind http_500 is active on "
    "the fault proxy).",
    503: "Simulated overload (an 'errors' fault with error_kind http_503 is active on the "
    "fault proxy); retry later.",
    200: "Simulated engine error reported in a 200 answer (an 'errors' fault with error_kind "
    "error_body is active on the fault proxy).",
}


def error_object(status: int) -> dict[str, Any]:
    kind = ErrorKind.UNAVAILABLE if status == 503 else ErrorKind.SERVER
    return {
        "error": {
            "message": ERROR_MESSAGES[status],
            "type": kind.value,
            "param": None,
            "code": FAULT_CODE,
        }
    }


def error_body(status: int) -> bytes:
    return dumps(error_object(status))


def error_stream() -> bytes:
    """One ``data: {"error": ...}`` event then ``[DONE]``, as vLLM streams an error."""
    return data_event(error_object(200)) + DONE + b"\n\n"


def _head(facts: RequestFacts, streamed: bool) -> dict[str, Any]:
    chat = facts.route == "chat"
    if chat:
        obj = "chat.completion.chunk" if streamed else "chat.completion"
    else:
        obj = "text_completion"
    prefix = "chatcmpl-" if chat else "cmpl-"
    return {
        "id": prefix + "faultproxy-" + uuid.uuid4().hex[:16],
        "object": obj,
        "created": int(time.time()),
        "model": facts.model,
    }


def _usage(facts: RequestFacts) -> dict[str, int]:
    return {
        "prompt_tokens": facts.prompt_tokens,
        "total_tokens": facts.prompt_tokens,
        "completion_tokens": 0,
    }


def _choice(facts: RequestFacts, *, streamed: bool, finish: str | None) -> dict[str, Any]:
    if facts.route == "chat":
        if not streamed:
            message = {"role": "assistant", "content": ""}
            return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        # A stream announces the role first; its closing chunk carries no role.
        delta: dict[str, Any] = {"content": ""} if finish else {"role": "assistant", "content": ""}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish, "stop_reason": None}


def opening_event(facts: RequestFacts) -> bytes:
    """The first event of a stream, before any token: chat's role announcement, an empty
    text chunk for completions."""
    return data_event(
        {**_head(facts, True), "choices": [_choice(facts, streamed=True, finish=None)]}
    )


def empty_answer(facts: RequestFacts) -> bytes:
    """A completion without tokens (``finish_reason`` "stop", ``completion_tokens`` 0): the
    whole SSE stream when the request streams, else the JSON body."""
    if not facts.stream:
        choice = _choice(facts, streamed=False, finish="stop")
        return dumps({**_head(facts, False), "choices": [choice], "usage": _usage(facts)})
    head = _head(facts, True)
    out = b""
    if facts.route == "chat":
        first = {**head, "choices": [_choice(facts, streamed=True, finish=None)]}
        if facts.include_usage:
            first["usage"] = None
        out += data_event(first)
    last = {**head, "choices": [_choice(facts, streamed=True, finish="stop")]}
    if facts.include_usage:
        last["usage"] = None
    out += data_event(last)
    if facts.include_usage:
        out += data_event({**head, "choices": [], "usage": _usage(facts)})
    return out + DONE + b"\n\n"
