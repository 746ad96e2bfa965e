"""Traffic colouring on every component's app (issue #16): the middleware that sets
``request[COLOUR_KEY]``, opens the server span and records the hop, and
``GET /v1/colour/hops``, the hop log a probe reads.

This module must never let a request through uncoloured (but ``COLOUR_EXEMPT``), nor
record a hop for reading the hop log.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import SpanKind

from canarystack.common import otel
from canarystack.common.apispec import (
    INTEGER,
    NUMBER,
    STRING,
    ApiSpec,
    array,
    nullable,
    obj,
    query_int,
)
from canarystack.common.auth import presented_token, same_token
from canarystack.common.colour import (
    COLOUR_KEY,
    REQUEST_ID,
    TRACEPARENT,
    TRAFFIC_TAG,
    Colour,
    colour_of,
)
from canarystack.common.component import COMPONENT, DROP_COLOUR, Component
from canarystack.common.errors import (
    ApiError,
    BadRequest,
    Handler,
    Unauthorized,
    json_response,
)

HOPS_PATH = "/v1/colour/hops"
# Requests that are not traffic: no colour, no span, no hop (reading the hop log must not
# write to it either).
COLOUR_EXEMPT = frozenset({"/health", "/metrics", "/openapi.json", HOPS_PATH})
HOPS_DEFAULT_LIMIT = 1000
HOPS_MAX_LIMIT = 10000
MAX_SEQ = 2**62
# The status a hop records when the client went away before the answer was written.
CLIENT_GONE_STATUS = 499


def _route_of(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


@web.middleware
async def colour_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Colour every request but ``COLOUR_EXEMPT``: ``request[COLOUR_KEY]``, an OpenTelemetry
    server span (parent: the ``traceparent``; attributes ``request.id``, ``traffic.tag``),
    and a hop named after the component in ``Component.hops``, recorded on arrival with
    the route and completed with its status (null while in flight). While the
    ``drop_colour`` fault is active each request is treated as untagged."""
    if request.path in COLOUR_EXEMPT:
        return await handler(request)
    comp = request.app[COMPONENT]
    colour = colour_of(request.headers)
    if colour.tag is not None and comp.faults.get(DROP_COLOUR) is not None:
        colour = replace(colour, tag=None)
    started = time.time()
    route = _route_of(request)
    status = 500
    with otel.tracer().start_as_current_span(
        f"{request.method} {route or 'unmatched'}",
        context=otel.parent_context(colour),
        kind=SpanKind.SERVER,
        attributes=otel.attributes(colour),
    ) as span:
        colour = otel.with_span(colour, span)
        request[COLOUR_KEY] = colour
        request = _normalised(request, colour)
        # Recorded on arrival (a reader sees a request in flight), completed with its status.
        seq = comp.hops.record(comp.name, colour, started, path=route)
        try:
            response = await handler(request)
            status = response.status
            return response
        except ApiError as exc:
            status = exc.status
            raise
        except web.HTTPException as exc:
            status = exc.status
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status = CLIENT_GONE_STATUS
            raise
        finally:
            span.set_attribute("http.response.status_code", status)
            comp.hops.complete(seq, status)


def _normalised(request: web.Request, colour: Colour) -> web.Request:
    """``request`` with the colour's headers, so a handler that reads them sees what the
    hop log records: the request id made up for a missing or malformed one, this hop's
    ``traceparent`` when the caller sent no usable one, no ``x-traffic-tag`` when it is
    dropped (malformed, or the ``drop_colour`` fault). Unchanged requests are not copied."""
    headers = request.headers
    want: dict[str, str | None] = {REQUEST_ID: colour.request_id, TRAFFIC_TAG: colour.tag}
    if colour.parent_span_id is None:
        want[TRACEPARENT] = colour.traceparent
    changes = {
        name: value
        for name, value in want.items()
        if headers.getall(name, []) != ([] if value is None else [value])
    }
    if not changes:
        return request
    new = CIMultiDict(headers)
    for name, value in changes.items():
        new.popall(name, None)
        if value is not None:
            new[name] = value
    try:
        return request.clone(headers=new)
    except UnicodeEncodeError:
        # Another header holds bytes that do not decode (kept as surrogate escapes, which
        # a copy cannot re-encode): the handler gets the request as sent, and refuses it.
        return request


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every coloured answer names its request id (a handler that set one keeps it)."""
    colour = request.get(COLOUR_KEY)
    if isinstance(colour, Colour) and REQUEST_ID not in response.headers:
        response.headers[REQUEST_ID] = colour.request_id


def _check_hops_reader(request: web.Request, comp: Component) -> None:
    if comp.admin_token is None:
        raise Unauthorized(
            f"{HOPS_PATH} is disabled: this process was started without an admin token. "
            "Restart it with CANARYSTACK_ADMIN_TOKEN set or with --admin-token-file."
        )
    given = presented_token(request, "admin credential")
    if not same_token(given, comp.admin_token):
        raise Unauthorized(
            f"Wrong credential in the Authorization header: {HOPS_PATH} takes this "
            "component's admin credential (the local stack's: "
            "<state>/credentials/faults-<role>)."
        )


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    values = request.query.getall(name, [])
    if not values:
        return default
    if len(values) > 1:
        raise BadRequest(f"Query parameter {name!r} was given {len(values)} times: give it once.")
    raw = values[0].strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20 or not low <= int(raw) <= high:
        raise BadRequest(
            f"Query parameter {name!r} is {values[0][:40]!r}: give an integer from {low} "
            f"to {high}.",
            param=name,
        )
    return int(raw)


async def colour_hops(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    _check_hops_reader(request, comp)
    after = _int_param(request, "after_seq", 0, 0, MAX_SEQ)
    limit = _int_param(request, "limit", HOPS_DEFAULT_LIMIT, 1, HOPS_MAX_LIMIT)
    hops, first = comp.hops.since(after, limit)
    return json_response(
        {
            "component": comp.name,
            "pid": os.getpid(),
            "started_at": round(time.time() - (time.monotonic() - comp.started_mono), 3),
            "hops": [hop.as_json(seq) for seq, hop in hops],
            "first_seq": first,
            "last_seq": comp.hops.last_seq,
            "next_after_seq": hops[-1][0] if hops else after,
            "lost": first > after + 1,
        }
    )


HOP_SCHEMA = obj(
    ("seq", "hop", "request_id", "trace_id", "tag", "at"),
    seq=INTEGER,
    hop=STRING,
    request_id=STRING,
    trace_id={"type": "string", "pattern": "^[0-9a-f]{32}$"},
    tag=nullable(STRING),
    at=NUMBER,
    status=nullable(INTEGER),
    path=nullable(STRING),
)


def describe_colour(spec: ApiSpec, app: web.Application) -> None:
    hop = spec.named("ColourHop", HOP_SCHEMA)
    spec.routes("colour").get(
        HOPS_PATH,
        summary="The coloured requests this component saw (request id, trace id, tag), paged.",
        description="Oldest first. Page with after_seq = the answer's next_after_seq; "
        "first_seq above after_seq + 1 (lost: true) means older hops were overwritten.",
        admin=True,
        params=[
            query_int("after_seq", "hops with a seq above this (default 0)", maximum=MAX_SEQ),
            query_int(
                "limit",
                f"at most this many (default {HOPS_DEFAULT_LIMIT})",
                minimum=1,
                maximum=HOPS_MAX_LIMIT,
            ),
        ],
        ok=obj(
            ("hops", "first_seq", "next_after_seq"),
            component=STRING,
            pid=INTEGER,
            started_at=NUMBER,
            hops=array(hop),
            first_seq=INTEGER,
            last_seq=INTEGER,
            next_after_seq=INTEGER,
            lost={"type": "boolean"},
        ),
    )
