"""What the router accepts from a client before it forwards anything: checked header
values, a bounded strict-JSON body, and a pin that may not reach a canary that is off.

Every refusal here is a 4xx naming the input, what was wrong and what to do: a client's
input must never give a 5xx, and a body must never stall the event loop that parses it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from canarystack.common.errors import BadRequest, Conflict, PayloadTooLarge, read_body
from canarystack.model.body import json_object
from canarystack.router.routing import PIN_HEADER, prompt_tokens_of
from canarystack.router.settings import (
    CHECKED_HEADERS,
    MAX_HEADER_CHARS,
    OFF_LOOP_BYTES,
)
from canarystack.router.snapshot import Snapshot
from canarystack.router.state import RouterState


def bad_header(headers: Any) -> BadRequest | None:
    """A 400 for the first checked header that is not printable ASCII, else None."""
    for name in CHECKED_HEADERS:
        for value in headers.getall(name, ()):
            if len(value) > MAX_HEADER_CHARS:
                return BadRequest(
                    f"Header {name}: {len(value)} characters is too long (at most "
                    f"{MAX_HEADER_CHARS}); send a shorter value.",
                    param=name,
                )
            if not (value.isascii() and value.isprintable()):
                return BadRequest(
                    f"Header {name}: the value is not printable ASCII (undecodable or "
                    "control characters); send printable ASCII only.",
                    param=name,
                )
    return None


def _parse_body(raw: bytes) -> tuple[dict[str, object], int]:
    """(strict JSON object, prompt tokens) or a 400 naming what is wrong. Plain
    synchronous work, so a big body can be parsed and counted off the event loop."""
    body = json_object(raw)
    return body, prompt_tokens_of(body)


async def read_json_body(request: web.Request, limit: int) -> tuple[bytes, dict[str, object], int]:
    """The request body (bytes, strict JSON object, prompt tokens): 413 above ``limit``
    bytes (``--max-body-bytes``), 400 naming what is wrong otherwise; a body above
    ``OFF_LOOP_BYTES`` is parsed and counted in a worker thread."""
    try:
        raw = await read_body(request, max_bytes=limit)
    except PayloadTooLarge as err:
        raise PayloadTooLarge(
            f"{err.message} (this router's --max-body-bytes)", code=err.code
        ) from None
    if len(raw) > OFF_LOOP_BYTES:
        body, tokens = await asyncio.get_running_loop().run_in_executor(None, _parse_body, raw)
    else:
        body, tokens = _parse_body(raw)
    return raw, body, tokens


def refuse_off_canary(st: RouterState, snap: Snapshot) -> None:
    """409 ``canary_off`` for a pin to a canary that is off (module docstring)."""
    if snap.canary_off is None:
        return
    st.metrics.canary_off_pins.inc()
    raise Conflict(
        f"The canary of release {st.settings.release!r} is off ({snap.canary_off}); a "
        f"request pinned with {PIN_HEADER}: canary is not sent to it. Pin 'baseline' or "
        "leave the header out.",
        param=PIN_HEADER,
        code="canary_off",
        extra={"phase": snap.phase, "reason": snap.canary_off},
    )
