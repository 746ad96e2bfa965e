"""Reading the llama.cpp engine's answers: stream events, error bodies, usage.

This module must never re-write an answer that is not strict JSON as if it were sound:
it is relayed as the engine wrote it, and recorded (``ENGINE_INVALID_JSON``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypedDict

from canary_contract import strictjson

SEPARATORS = (b"\r\n\r\n", b"\n\n")
# What request_done says of an engine answer that is not strict JSON (a NaN or Infinity
# logprob, broken bytes): relayed as the engine wrote it, so the router and the oracle
# see it and count it as a broken canary; never re-written as if it were sound.
ENGINE_INVALID_JSON = "engine_invalid_json"


@dataclass
class StreamState:
    """What one relayed stream has shown so far."""

    chat: bool
    include_usage: bool
    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    first_id: str | None = None
    created: int | None = None
    model: str | None = None
    invalid: str | None = None  # why an event was not strict JSON (the first one)


def take_events(buf: bytes, state: StreamState) -> tuple[bytes, bool, bytes]:
    """The whole SSE events at the start of ``buf`` -> (bytes to send, whether any
    carries a token, the incomplete rest)."""
    out = b""
    content = False
    while True:
        cut = min(
            ((i, sep) for sep in SEPARATORS if (i := buf.find(sep)) >= 0),
            default=None,
        )
        if cut is None:
            return out, content, buf
        i, sep = cut
        event, buf = buf[:i], buf[i + len(sep) :]
        data, has_content = translate_event(event, state)
        out += data + (sep if data else b"")
        content = content or has_content


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageChunk(TypedDict):
    """The ``usage`` chunk of a stream (OpenAI's shape: no choices, the counts)."""

    id: str | None
    object: str
    created: int | None
    model: str | None
    choices: list[object]
    usage: Usage


def _usage_chunk(state: StreamState) -> bytes:
    """The ``usage`` chunk llama.cpp's server does not send (prompt tokens counted by the
    pod, completion tokens = the content events relayed)."""
    usage: UsageChunk = {
        "id": state.first_id,
        "object": "chat.completion.chunk" if state.chat else "text_completion",
        "created": state.created,
        "model": state.model,
        "choices": [],
        "usage": {
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": state.completion_tokens,
            "total_tokens": state.prompt_tokens + state.completion_tokens,
        },
    }
    return b"data: " + strictjson.dumps_bytes(usage) + b"\n\n"


def translate_event(event: bytes, state: StreamState) -> tuple[bytes, bool]:
    """One SSE event from the engine -> (bytes to send, whether it carries a token)."""
    payload = None
    for line in event.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            payload = line[5:].strip()
    if payload is None:
        return event, False
    if payload == b"[DONE]":
        state.done = True
        if not state.include_usage:
            return event, False
        return _usage_chunk(state) + event, False
    try:
        obj = strictjson.loads(payload)
    except ValueError as exc:  # StrictJsonError: relayed as is, and recorded
        if state.invalid is None:
            state.invalid = str(exc)
        try:  # read leniently only to count the token it may carry
            obj = json.loads(payload)
        except ValueError:
            return event, False
    if not isinstance(obj, dict):
        return event, False
    if state.first_id is None:
        state.first_id, state.created, state.model = (
            obj.get("id"),
            obj.get("created"),
            obj.get("model"),
        )
    has_token = False
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if state.chat:
            delta = choice.get("delta") or {}
            has_token = has_token or bool(delta.get("content"))
        else:
            has_token = has_token or bool(choice.get("text") or choice.get("logprobs"))
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]
    if has_token:
        state.completion_tokens += 1
    return event, has_token


def engine_error_body(status: int, raw: bytes) -> dict[str, object]:
    """The engine's error answer as the client gets it: its own JSON object, or one
    that says the engine's body was not a JSON object."""
    try:
        body = strictjson.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {
        "error": {
            "message": f"The llama.cpp engine answered HTTP {status} with a body "
            "that is not a JSON object; see this pod's engine_error log line.",
            "type": "engine_error",
            "param": None,
            "code": f"engine_http_{status}",
        }
    }
