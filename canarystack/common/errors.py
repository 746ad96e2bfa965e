"""JSON error responses in the OpenAI shape, for every component::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

Handlers raise ``ApiError`` (or a subclass); ``error_middleware`` turns it into a JSON
response. Anything else that escapes a handler is logged and answered with a 500 in the
same shape; a client's input must never get there (validate first, answer 4xx).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from canarystack.common.logs import get_logger

_log = get_logger("http")

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """An error a client can cause or must see, with its HTTP status."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.extra = extra or {}
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        return {"error": err, **self.extra}


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"


class Conflict(ApiError):
    status = 409
    type = "conflict_error"


class Unprocessable(ApiError):
    status = 422
    type = "invalid_request_error"


class Unavailable(ApiError):
    status = 503
    type = "service_unavailable"


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def _loc_to_param(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def from_validation_error(exc: ValidationError, what: str = "request body") -> BadRequest:
    """A 400 that names the first offending field and says what was wrong with it."""
    first = exc.errors()[0]
    # Drop pydantic's union/type tags from the location (e.g. 'function-after[...]').
    loc = tuple(p for p in first.get("loc", ()) if not (isinstance(p, str) and "[" in p))
    param = _loc_to_param(loc) or None
    msg = first.get("msg", "invalid value")
    if param:
        message = f"Invalid {what}: field '{param}': {msg}"
    else:
        message = f"Invalid {what}: {msg}"
    return BadRequest(message, param=param)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    raw = await request.read()
    if not raw:
        raise BadRequest("Request body is empty: send a JSON object.")
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise BadRequest(f"Request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("Request body is nested too deeply to be read as JSON.") from None
    if not isinstance(data, dict):
        raise BadRequest(
            f"Request body must be a JSON object, got {type(data).__name__}.",
        )
    return data


def parse_model(model: type[M], data: dict[str, Any], what: str = "request body") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, what) from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own 404/405 etc.: keep the status, use our JSON shape.
        return web.json_response(
            {
                "error": {
                    "message": f"{exc.reason}: {request.method} {request.path}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
            status=exc.status,
        )
    except Exception:
        _log.error("unhandled_error", exc_info=True, method=request.method, path=request.path)
        return web.json_response(
            {
                "error": {
                    "message": "Internal server error (logged).",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
            status=500,
        )
