"""What the broker and the rollback executor accept from the wire, and what they send back.

This module must never do blocking I/O or accept a value it cannot store and send back.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

from aiohttp import web

from canary_contract import strictjson
from canary_contract.json import JsonObject
from canarystack.common.errors import BadRequest, PayloadTooLarge, body_too_large, read_capped

# The broker's largest body is a version manifest (a few KiB); 256 KiB leaves room.
BROKER_MAX_BODY_BYTES = 256 * 1024
# The rollback executor's only body is {"reason": "..."} (at most 4000 characters).
ROLLBACK_MAX_BODY_BYTES = 16 * 1024
# Bodies up to this size are parsed on the event loop (~10 ms at worst); larger ones in a
# thread.
INLINE_PARSE_BYTES = 16 * 1024
# SQLite stores integers as signed 64-bit; anything larger cannot be compared or stored.
MAX_INT64 = 2**63 - 1

_INT_RE = re.compile(r"^-?[0-9]{1,20}$")
_FLOAT_RE = re.compile(r"^[0-9]{1,12}(\.[0-9]{0,12})?([eE][-+]?[0-9]{1,3})?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _too_large(max_bytes: int, given: str) -> PayloadTooLarge:
    return body_too_large(
        f"Request body is {given}, over this endpoint's limit of {max_bytes} bytes "
        f"({max_bytes // 1024} KiB); send a smaller body (the limit is fixed, the bodies "
        "of this API are small).",
        extra={"max_bytes": max_bytes},
    )


async def read_bytes(request: web.Request, max_bytes: int) -> bytes:
    """The raw body, or 413 when it is (or says it is) longer than ``max_bytes``."""
    return await read_capped(request, max_bytes, lambda given: _too_large(max_bytes, given))


def parse_object(raw: bytes) -> JsonObject:
    """Strict JSON that must be an object, or a 400 naming what was wrong."""
    try:
        data = strictjson.loads(raw)
    except ValueError as exc:  # StrictJsonError
        raise BadRequest(
            f"Request body is not valid JSON: {exc}. Send one JSON object (finite numbers, "
            f"integers of at most {strictjson.MAX_INT_DIGITS} digits, at most "
            f"{strictjson.MAX_DEPTH} levels deep, UTF-8).",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise BadRequest(
            f"Request body must be a JSON object, got {type(data).__name__}.",
            code="invalid_json",
        )
    return data


async def _parse(raw: bytes) -> JsonObject:
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse_object(raw)
    return await asyncio.get_running_loop().run_in_executor(None, parse_object, raw)


async def read_json_object(request: web.Request, max_bytes: int) -> JsonObject:
    """The body as a JSON object, read by every handler that takes one.

    A ``Content-Length`` above ``max_bytes`` is refused with 413 *before* a byte is read,
    a body that turns out longer while being read likewise, and the bytes are parsed with
    ``strictjson`` (no ``NaN``/``Infinity``, integers of at most 32 digits, nesting of at
    most 64 levels, valid UTF-8 without lone surrogates) -> 400 naming what was wrong.
    Strict parsing costs a Python call per number (256 KiB of small integers takes ~200 ms
    on a busy 2-core box), so a body above ``INLINE_PARSE_BYTES`` is parsed on a worker
    thread: the event loop keeps answering long-polls and heartbeats meanwhile.
    """
    raw = await read_bytes(request, max_bytes)
    if not raw.strip():
        raise BadRequest("Request body is empty: send a JSON object.")
    return await _parse(raw)


async def read_optional_object(request: web.Request, max_bytes: int) -> JsonObject | None:
    """Like ``read_json_object`` but an empty body is ``None`` (the body is optional)."""
    raw = await read_bytes(request, max_bytes)
    if not raw.strip():
        return None
    return await _parse(raw)


def json_response(
    data: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer written strictly: a non-finite number raises instead of leaving (it
    would be a bug; the error middleware logs it and answers 500 for that one request)."""
    return web.json_response(data, status=status, headers=headers, dumps=strictjson.dumps)


def query_int(
    request: web.Request,
    name: str,
    default: int | None,
    *,
    minimum: int = 0,
    maximum: int = MAX_INT64,
) -> int:
    """An integer query parameter in ``[minimum, maximum]``, or 400 naming it and the range.
    Digits only: no ``+``, ``_``, spaces or non-ASCII digits."""
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise BadRequest(
                f"Query parameter '{name}' is required: give a whole number from {minimum} "
                f"to {maximum}.",
                param=name,
            )
        return default
    if not _INT_RE.match(raw):
        raise BadRequest(
            f"Query parameter '{name}' must be a whole number from {minimum} to {maximum} "
            f"(digits only), got {raw[:40]!r}.",
            param=name,
        )
    value = int(raw)
    if not minimum <= value <= maximum:
        raise BadRequest(
            f"Query parameter '{name}' is {raw[:40]}, out of range: give a whole number from "
            f"{minimum} to {maximum}.",
            param=name,
        )
    return value


def query_float(raw: str) -> float:
    """A decimal number (``12``, ``0.5``, ``1e-3``, as ``f"{x:g}"`` writes it); NaN when it
    is anything else (``inf``, ``nan``, ``1_0``, spaces, non-ASCII digits) or overflows."""
    if not _FLOAT_RE.match(raw):
        return math.nan
    value = float(raw)
    return value if math.isfinite(value) else math.nan


def header_text(request: web.Request, name: str, max_chars: int = 200) -> str:
    """A header's value stripped, or 400 when it cannot be stored (too long, control
    characters, or bytes that are not UTF-8). Empty when absent."""
    value = request.headers.get(name, "").strip()
    if not value:
        return ""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            f"Header '{name}' is not valid UTF-8 text; send plain text (e.g. your name).",
            param=name,
        ) from None
    if len(value) > max_chars or _CONTROL.search(value):
        raise BadRequest(
            f"Header '{name}' must be at most {max_chars} characters without control "
            f"characters, got {len(value)} characters.",
            param=name,
        )
    return value
