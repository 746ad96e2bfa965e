"""JSON error responses in the OpenAI shape (``{"error": {"message", "type", "param",
"code"}}``) for every component, and the one strict path for JSON bodies and answers.

This module must never let a client's input reach a 500 (validate first, answer 4xx),
nor let ``NaN`` leave a component.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypedDict, TypeVar, Unpack

from aiohttp import web
from pydantic import BaseModel, ValidationError

from canary_contract import strictjson
from canary_contract.errors import ErrorKind
from canary_contract.json import JsonObject
from canarystack.common.deadlines import body_deadline, close_after_answer
from canarystack.common.error_fields import CanaryStackError, ErrorFieldArgs, ErrorFields
from canarystack.common.logs import get_logger

_log = get_logger("http")

M = TypeVar("M", bound=BaseModel)

# The default body limit of every component (create_app's client_max_size): admin, broker,
# gate and rollback bodies are small; the model server and the router pass their own.
DEFAULT_BODY_LIMIT = 1024 * 1024
# Bodies larger than this are parsed in a worker thread, off the event loop; so are
# smaller ones with more than PARSE_IN_THREAD_ITEMS separators (',' and ':'), since what
# costs is per item (strictjson checks numbers and walks every value in Python: a 1 MiB
# array of small integers takes ~300 ms; a 1 MiB prompt string ~2 ms).
PARSE_IN_THREAD_BYTES = 1024 * 1024
PARSE_IN_THREAD_ITEMS = 2048
# Bodies are read in chunks of at most this many bytes (``read_capped``).
READ_CHUNK_BYTES = 64 * 1024


class StartupError(CanaryStackError):
    """A component cannot start (a flag, a file, a folder): the message names the input
    and says what to do. Entry points print it and exit 1 (``cli.entry``)."""


class ErrorDetailJson(TypedDict):
    """The ``error`` object of an answer (``canary_contract.error_answer.ErrorDetail``)."""

    message: str
    type: str
    param: str | None
    code: str | None


class ApiError(ErrorFields):
    """An error a client can cause or must see, with its HTTP status."""

    status = 400
    type: str = ErrorKind.INVALID_REQUEST

    def __init__(
        self, message: str, *, status: int | None = None, **fields: Unpack[ErrorFieldArgs]
    ) -> None:
        super().__init__(message, **fields)
        if status is not None:
            self.status = status

    def body(self) -> dict[str, object]:
        err: ErrorDetailJson = {
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
    type = ErrorKind.AUTHENTICATION


class NotFound(ApiError):
    status = 404
    type = ErrorKind.NOT_FOUND


class Conflict(ApiError):
    status = 409
    type = ErrorKind.CONFLICT


class PayloadTooLarge(ApiError):
    status = 413
    type = ErrorKind.INVALID_REQUEST


def body_too_large(message: str, *, extra: Mapping[str, object] | None = None) -> PayloadTooLarge:
    """The 413 of a body over its limit, with code ``body_too_large``: ``message`` says
    the size, the limit and what to send instead."""
    return PayloadTooLarge(message, code="body_too_large", extra=extra)


class RequestTimeout(ApiError):
    """The client sent its request body too slowly (``deadlines``)."""

    status = 408
    type = ErrorKind.INVALID_REQUEST


class Unprocessable(ApiError):
    status = 422
    type = ErrorKind.INVALID_REQUEST


class TooManyFaults(ApiError):
    """A fault admin API's cap on active faults is reached (``faults.FaultRegistry``)."""

    status = 429
    type = ErrorKind.INVALID_REQUEST


class Unavailable(ApiError):
    status = 503
    type = ErrorKind.UNAVAILABLE


def release_not_served(name: str, served: Iterable[str], by: str, todo: str) -> NotFound:
    """The 404 of a component asked about a release it does not serve: the release, who
    does not serve it (``by``, e.g. "watched by this gate"), the releases it does serve, and
    ``todo``, what to do instead."""
    listed = ", ".join(sorted(served)) or "none"
    return NotFound(f"Release {name!r} is not {by} (it serves: {listed}); {todo}", param="release")


def _nonfinite_path(obj: Any, path: str = "$") -> str | None:
    """Where the first non-finite float sits in ``obj`` (for the log), or None."""
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{where} = {item!r}"
        if isinstance(item, Mapping):
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


_SERVER_ERROR = {
    "error": {
        "message": "Internal server error (logged).",
        "type": ErrorKind.SERVER.value,
        "param": None,
        "code": None,
    }
}


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """``data`` as a JSON answer written with ``strictjson.dumps``.

    A value that cannot be written strictly (``NaN``, ``Infinity``, an object JSON does
    not know) is a bug in the component, never something to send: it is logged with where
    it sits and this one answer becomes a 500 in the error shape.
    """
    try:
        text = strictjson.dumps(data)
    except (ValueError, TypeError) as exc:
        _log.error(
            "unwritable_response",
            error=str(exc),
            where=_nonfinite_path(data),
            status=status,
        )
        text = strictjson.dumps(_SERVER_ERROR)
        status = 500
    return web.Response(text=text, status=status, headers=headers, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return json_response(err.body(), status=err.status)


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


def _too_large(limit: int, got: str, what: str) -> PayloadTooLarge:
    return body_too_large(
        f"{what} is too large: {got}, the limit here is {limit} bytes. "
        "Send a smaller body (fewer or shorter items)."
    )


async def read_capped(
    request: web.Request, limit: int, too_large: Callable[[str], ApiError]
) -> bytes:
    """The raw body, at most ``limit`` bytes, for every component's body reader: raises
    ``too_large("N bytes (Content-Length)")`` when ``Content-Length`` says more, before a
    byte is read, and ``too_large("more than LIMIT bytes")`` as soon as the bytes read
    pass the limit (chunked or compressed bodies); 408 when the whole body takes longer
    than the body deadline (``deadlines.body_deadline``), and the connection is closed."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(f"{declared} bytes (Content-Length)")
    body = bytearray()
    deadline_s = body_deadline(request)
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.content.iter_chunked(READ_CHUNK_BYTES):
                body += chunk
                if len(body) > limit:
                    raise too_large(f"more than {limit} bytes")
    except TimeoutError:
        close_after_answer(request)
        _log.info("body_timeout", timeout_s=deadline_s, got_bytes=len(body), path=request.path)
        raise RequestTimeout(
            f"The request body did not arrive within {deadline_s:g} s (got {len(body)} bytes "
            "so far): send the whole body at once, on a new connection."
        ) from None
    except ConnectionResetError:  # the client hung up mid-body: its doing, not a 500
        close_after_answer(request)
        _log.info("body_cut", got_bytes=len(body), path=request.path)
        raise BadRequest(
            f"The connection closed before the whole request body arrived (got {len(body)} "
            "bytes): send the whole body, and keep the connection open for the answer."
        ) from None
    return bytes(body)


async def read_body(
    request: web.Request, *, max_bytes: int | None = None, what: str = "Request body"
) -> bytes:
    """The raw body, at most ``max_bytes`` (default: the app's ``client_max_size``).

    ``Content-Length`` is checked before a byte is read, and the bytes read are counted
    as they arrive (chunked or compressed bodies): past the limit is a 413 at once.
    """
    limit = request.client_max_size if max_bytes is None else max_bytes
    try:
        declared = request.content_length
    except ValueError:  # the HTTP parser refuses most of these first
        raise BadRequest("The Content-Length header is not a number.") from None
    if declared is not None and declared > limit:
        raise _too_large(limit, f"{declared} bytes", what)
    cached = getattr(request, "_read_bytes", None)  # read before by the handler
    if cached is not None:
        if len(cached) > limit:
            raise _too_large(limit, f"{len(cached)} bytes", what)
        return bytes(cached)
    # Content-Length is checked above: read_capped only says "more than LIMIT bytes" here.
    raw = await read_capped(request, limit, lambda got: _too_large(limit, got, what))
    # Keep request.read()/json() working for a handler that reads the body again.
    try:
        request._read_bytes = raw
    except AttributeError:  # pragma: no cover - a future aiohttp without the cache
        pass
    return raw


def _costly(raw: bytes) -> bool:
    """Whether parsing ``raw`` could hold the loop for more than about a millisecond (a
    C-speed count: separators inside strings only make it pick the thread more often)."""
    if len(raw) > PARSE_IN_THREAD_BYTES:
        return True
    return raw.count(b",") + raw.count(b":") > PARSE_IN_THREAD_ITEMS


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise BadRequest(
                f"Request body has the key {key!r} twice: send each field once.", param=key
            )
        seen[key] = value
    return seen


async def read_json_object(
    request: web.Request,
    *,
    max_bytes: int | None = None,
    unique_keys: bool = False,
    what: str = "Request body",
) -> JsonObject:
    """The request body as a JSON object, or a 4xx saying why it is not one. Parsed with
    ``strictjson.loads`` (no NaN/Infinity, bounded integers and nesting, valid UTF-8); a
    body above ``PARSE_IN_THREAD_BYTES``, or with many items, in a worker thread so it
    never stalls the loop (``bench/event_loop_stall.py`` measures what is left).

    413 above ``max_bytes`` (default: the app's ``client_max_size``), 400 for an empty
    body, anything ``strictjson.loads`` refuses, or a value that is not an object; with
    ``unique_keys`` also for an object that repeats a key (which value would win is
    otherwise up to the parser).
    """
    raw = await read_body(request, max_bytes=max_bytes, what=what)
    if not raw.strip():
        raise BadRequest(f"{what} is empty: send a JSON object.")
    try:
        if _costly(raw):
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, strictjson.loads, raw)
        else:
            data = strictjson.loads(raw)
    except ValueError as exc:  # StrictJsonError
        raise BadRequest(f"{what} is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise BadRequest(
            f"{what} must be a JSON object, got {_json_type(data)}.",
        )
    if unique_keys:
        # Already strictly parsed and small (callers use it for small bodies only).
        json.loads(raw, object_pairs_hook=_refuse_duplicates)
    return data


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def parse_model(model: type[M], data: Mapping[str, object], what: str = "request body") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, what) from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A raised ``ApiError`` becomes its JSON answer; anything else that escapes a handler
    is logged and answered 500 in the same shape."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:  # request.read() past client_max_size
            message = (
                f"Request body is too large ({exc.text}): send a smaller body "
                f"to {request.method} {request.path}."
            )
        else:
            # aiohttp's own 404/405 etc.: keep the status, use our JSON shape.
            message = f"{exc.reason}: {request.method} {request.path}"
        return json_response(
            {
                "error": {
                    "message": message,
                    "type": ErrorKind.INVALID_REQUEST.value,
                    "param": None,
                    "code": None,
                }
            },
            status=exc.status,
        )
    except Exception:
        _log.error("unhandled_error", exc_info=True, method=request.method, path=request.path)
        return json_response(_SERVER_ERROR, status=500)
