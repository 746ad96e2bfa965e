"""Reading and parsing one request body of the model server, strictly and within limits.

Every refusal is a 4xx naming the input and what to do. ``parse_request`` is plain
synchronous work so the server can run it off the event loop for big bodies
(``OFF_LOOP_BYTES``). This module must never sleep or touch the network beyond reading
the one request's body.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from canary_contract import strictjson
from canary_contract.json import JsonObject
from canarystack.common.errors import (
    BadRequest,
    PayloadTooLarge,
    body_too_large,
    parse_model,
    read_capped,
)
from canarystack.model.schemas import (
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    ChatCompletionRequest,
    CompletionRequest,
)

# The body limit per context token (a token is a word here, a few bytes of JSON) and
# the room for everything around the prompt.
BYTES_PER_TOKEN = 16
ENVELOPE_BYTES = 64 * 1024
# Bodies above this are parsed in a worker thread, so other requests keep streaming: a
# body at the default limit (320 KiB) of 64-deep arrays takes ~100 ms to parse and check,
# and a worker thread gives the GIL back to the loop every switch interval (5 ms).
OFF_LOOP_BYTES = 64 * 1024
# Caps checked before validation (pydantic would otherwise build a model per message).
MAX_MESSAGES = 2048
# Arrays and objects in one body, counted outside strings before parsing: json.loads
# builds each in C without letting another thread in (~1 us each), so 150,000 empty
# lists in 320 KiB would hold the GIL for ~150 ms even in a worker thread. 2048 chat
# messages with content parts need ~10,000.
MAX_CONTAINERS = 20_000
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
# The admin API's bodies (fault injection) are tiny.
ADMIN_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """A model server's limits on one request.

    What a client sends is bounded before it costs anything:

    - the body: at most ``Limits.body_bytes`` (default ``max_model_len`` x
      ``BYTES_PER_TOKEN`` + ``ENVELOPE_BYTES``; ``--max-body-bytes`` overrides), refused
      with a 413 from ``Content-Length`` before a byte is read, or as soon as a chunked body
      passes the limit;
    - the JSON: at most ``MAX_CONTAINERS`` arrays and objects (counted before parsing), then
      ``canary_contract.strictjson`` (no ``NaN``/``Infinity``, integers of at most 32
      digits, nesting of at most 64 levels, valid UTF-8 without lone surrogates);
    - before pydantic sees the body: at most ``MAX_MESSAGES`` messages and
      ``MAX_STOP_SEQUENCES`` stop strings of at most ``MAX_STOP_CHARS`` characters each;
    - before the prompt is tokenised: at most ``Limits.prompt_bytes`` bytes of prompt text
      (``max_model_len`` x ``BYTES_PER_TOKEN``).
    """

    body_bytes: int
    prompt_bytes: int

    @classmethod
    def for_model_len(cls, max_model_len: int, max_body_bytes: int | None = None) -> Limits:
        derived = max_model_len * BYTES_PER_TOKEN + ENVELOPE_BYTES
        return cls(
            body_bytes=derived if max_body_bytes is None else max_body_bytes,
            prompt_bytes=max_model_len * BYTES_PER_TOKEN,
        )


def _too_large(size: str, limits: Limits) -> PayloadTooLarge:
    return body_too_large(
        f"Request body is {size}; this model server accepts at most {limits.body_bytes} "
        f"bytes (sized from its context length; --max-body-bytes sets it). Send a shorter "
        "prompt or fewer messages."
    )


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The body's bytes, or a 413 as soon as it is known to exceed ``limits.body_bytes``."""
    return await read_capped(request, limits.body_bytes, lambda size: _too_large(size, limits))


@dataclass(frozen=True)
class Parsed:
    """A validated request and what the server needs from it."""

    req: CompletionRequest | ChatCompletionRequest
    words: list[str]
    top_n: int | None
    prompt_field: str
    max_tokens: int | None


def _containers(raw: bytes) -> int:
    """How many arrays and objects ``raw`` opens outside its strings (an upper bound)."""
    n = raw.count(b"[") + raw.count(b"{")
    if n <= MAX_CONTAINERS:
        return n
    outside = _JSON_STRING.sub(b"", raw)
    return outside.count(b"[") + outside.count(b"{")


def json_object(raw: bytes) -> JsonObject:
    """The strict JSON object in a client's ``raw`` body, or a 400 naming what is wrong
    (the router's intake reads its bodies with it too)."""
    if not raw.strip():
        raise BadRequest("Request body is empty: send a JSON object.")
    containers = _containers(raw)
    if containers > MAX_CONTAINERS:
        raise BadRequest(
            f"Request body holds {containers} JSON arrays and objects; at most "
            f"{MAX_CONTAINERS} are read (and at most {strictjson.MAX_DEPTH} levels deep). "
            "Send a smaller document."
        )
    try:
        data = strictjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise BadRequest(f"Request body must be a JSON object, got {type(data).__name__}.")
    return data


def _cap_list(
    data: Mapping[str, object], field: str, unit: str, cap: int, advice: str = ""
) -> None:
    """A 400 when ``data[field]`` is a list of more than ``cap`` items."""
    value = data.get(field)
    if isinstance(value, list) and len(value) > cap:
        raise BadRequest(
            f"Invalid request body: field '{field}' has {len(value)} {unit}; at most "
            f"{cap} are accepted.{advice}",
            param=field,
        )


def _precheck(data: Mapping[str, object]) -> None:
    """Caps that must hold before pydantic walks the body."""
    _cap_list(data, "messages", "messages", MAX_MESSAGES, " Merge or drop messages.")
    _cap_list(data, "stop", "sequences", MAX_STOP_SEQUENCES)
    stop = data.get("stop")
    items = stop if isinstance(stop, list) else [stop]
    for s in items:
        if isinstance(s, str) and len(s) > MAX_STOP_CHARS:
            raise BadRequest(
                f"Invalid request body: field 'stop' holds a sequence of {len(s)} "
                f"characters; each may have at most {MAX_STOP_CHARS}.",
                param="stop",
            )


def _prompt_bytes(req: CompletionRequest | ChatCompletionRequest) -> int:
    if isinstance(req, CompletionRequest):
        return len(str(req.prompt).encode())
    return sum(len(m.role.encode()) + len(str(m.content).encode()) for m in req.messages)


def parse_request(raw: bytes, kind: str, limits: Limits) -> Parsed:
    """The request of ``kind`` ("completion" or "chat") in ``raw``, validated and its
    prompt tokenised, or a 400 naming what was wrong (synchronous: may run in a thread)."""
    data = json_object(raw)
    _precheck(data)
    req: CompletionRequest | ChatCompletionRequest
    if kind == "completion":
        req = parse_model(CompletionRequest, data)
        top_n = req.logprobs
        prompt_field = "prompt"
        max_tokens = req.max_tokens
    else:
        req = parse_model(ChatCompletionRequest, data)
        top_n = (req.top_logprobs or 0) if req.logprobs else None
        prompt_field = "messages"
        max_tokens = req.max_tokens or req.max_completion_tokens
    size = _prompt_bytes(req)
    if size > limits.prompt_bytes:
        raise BadRequest(
            f"Invalid request body: field '{prompt_field}' holds {size} bytes of text; this "
            f"model server accepts at most {limits.prompt_bytes} (its context length times "
            f"{BYTES_PER_TOKEN} bytes per token). Send a shorter {prompt_field}.",
            param=prompt_field,
            code="prompt_too_large",
        )
    return Parsed(req, req.prompt_text().split(), top_n, prompt_field, max_tokens)


async def read_request(request: web.Request, kind: str, limits: Limits) -> Parsed:
    """``read_body`` then ``parse_request``; a body above ``OFF_LOOP_BYTES`` is parsed and
    tokenised in a worker thread, so other requests' streams keep flowing meanwhile."""
    raw = await read_body(request, limits)
    if len(raw) > OFF_LOOP_BYTES:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, parse_request, raw, kind, limits)
    return parse_request(raw, kind, limits)
