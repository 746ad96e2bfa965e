"""The fault proxy's errors and how they are answered: the OpenAI error shape
(``{"error": {"message", "type", "param", "code"}}``), like every component of the stack.

::

    ProxyError                 an answer the proxy gives on purpose (status, message)
    ├── BadRequest        400  bad admin input (JSON, kind, ttl_s, params)
    ├── Unauthorized      401  missing or wrong credential
    ├── NotFound          404  no such active fault
    ├── PayloadTooLarge   413  an admin body over its limit
    ├── TooManyFaults     429  the cap on active faults is reached
    └── UpstreamError     502  the upstream could not be reached or broke off

This module must never let a client's input reach a 500.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from canary_contract.errors import ErrorKind
from gameday.errors import GamedayError


class ProxyError(GamedayError):
    status = 400
    type: str = ErrorKind.INVALID_REQUEST.value

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(ProxyError):
    status = 400


class Unauthorized(ProxyError):
    status = 401
    type = ErrorKind.AUTHENTICATION.value


class NotFound(ProxyError):
    status = 404
    type = ErrorKind.NOT_FOUND.value


class PayloadTooLarge(ProxyError):
    status = 413


class TooManyFaults(ProxyError):
    status = 429


class UpstreamError(ProxyError):
    status = 502
    type = ErrorKind.UNAVAILABLE.value


def json_answer(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, allow_nan=False), status=status, content_type="application/json"
    )


def from_validation_error(exc: ValidationError, what: str) -> BadRequest:
    """A 400 naming the first offending field of ``what`` and what was wrong with it."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith("function"))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown parameter (check the spelling; docs/fault-proxy.md lists them)"
    message = f"Invalid {what}: field '{loc}': {msg}" if loc else f"Invalid {what}: {msg}"
    return BadRequest(message, param=loc or None)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A raised ``ProxyError`` becomes its JSON answer; aiohttp's own 4xx keep their status
    in the same shape."""
    try:
        return await handler(request)
    except ProxyError as err:
        return json_answer(err.body(), status=err.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        shaped = ProxyError(f"{exc.reason}: {request.method} {request.path}")
        return json_answer(shaped.body(), status=exc.status)
