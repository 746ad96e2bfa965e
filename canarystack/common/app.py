"""The base aiohttp application every component builds on.

``create_app(component)`` gives an app with:

- ``GET /health``  -> ``{"status": "ok", "component", "version", "pid", "uptime_s"}``
  (a component can add fields or report "degraded" through ``health_extra``; a
  ``health_extra`` that raises or returns a value JSON cannot carry, such as ``NaN``,
  makes the answer 503 "degraded" with the reason in ``degraded_reasons``: the
  component cannot tell it is well, so it does not say so)
- ``GET /metrics`` -> Prometheus text from the component's own ``CollectorRegistry``,
  including ``canarystack_active_faults{kind}``
- ``/admin/faults`` -> the fault API of ``canarystack.common.faults`` (admin token;
  bodies at most ``FAULT_BODY_LIMIT`` bytes, each key once)
- JSON error responses (``canarystack.common.errors``); every answer here is written
  with ``errors.json_response`` (strict JSON, never ``NaN``)
- traffic colouring (``canarystack.common.colour``, issue #16): on every request but
  ``COLOUR_EXEMPT`` the colour middleware sets ``request[COLOUR_KEY]``, opens an
  OpenTelemetry server span (``canarystack.common.otel``; parent: the ``traceparent``;
  attributes ``request.id``, ``traffic.tag``), echoes ``x-request-id`` on the answer and
  records a hop named after the component's role in ``Component.hops`` (on arrival, with
  the route; its status once the handler is done: null while the request is in flight)
- ``GET /v1/colour/hops?after_seq=N&limit=L`` -> that hop log, paged (the component's
  admin credential: it names clients' request ids and tags)
- the ``drop_colour`` fault on every component: while it is active the middleware treats
  each incoming request as untagged (what a hop that loses the tag does; the colouring
  probe must catch it)

Bodies are limited by ``client_max_size`` (default ``DEFAULT_BODY_LIMIT``, 1 MiB: admin,
broker, gate and rollback bodies are small); the model server and the router pass a
limit sized from their context length.

The component adds its own routes to the returned app. The ``Component`` object is
stored at ``app[COMPONENT]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import SpanKind
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from canary_contract.json import JsonObject
from canarystack.common import otel, strictjson
from canarystack.common.apispec import (
    INTEGER,
    NUMBER,
    STRING,
    ApiSpec,
    json_body,
    nullable,
    obj,
    query_int,
)
from canarystack.common.auth import check_admin, presented_token, same_token
from canarystack.common.colour import (
    COLOUR_KEY,
    REQUEST_ID,
    TRACEPARENT,
    TRAFFIC_TAG,
    Colour,
    HopLog,
    colour_of,
)
from canarystack.common.errors import (
    DEFAULT_BODY_LIMIT,
    ApiError,
    BadRequest,
    Handler,
    Unauthorized,
    error_middleware,
    json_response,
    read_json_object,
)
from canarystack.common.faults import FAULT_BODY_LIMIT, FaultRegistry, NoParams
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.common.openapi import add_describer
from canarystack.common.openapi import install as install_openapi

# How often expired faults are pruned (and their expiry logged) without a request.
FAULT_SWEEP_INTERVAL_S = 0.5
# The fault every component has: incoming requests are treated as untagged while it lasts.
DROP_COLOUR = "drop_colour"
HOPS_PATH = "/v1/colour/hops"
# Requests that are not traffic: no colour, no span, no hop (reading the hop log must not
# write to it either).
COLOUR_EXEMPT = frozenset({"/health", "/metrics", "/openapi.json", HOPS_PATH})
HOPS_DEFAULT_LIMIT = 1000
HOPS_MAX_LIMIT = 10000
MAX_SEQ = 2**62
# The status a hop records when the client went away before the answer was written.
CLIENT_GONE_STATUS = 499


@dataclass
class Component:
    name: str
    version: str
    admin_token: str | None
    faults: FaultRegistry
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    log: JsonLogger | None = None
    health_extra: Callable[[], JsonObject] | None = None
    started_mono: float = field(default_factory=time.monotonic)
    # The coloured requests this component saw (canarystack.common.colour; the probe reads it).
    hops: HopLog = field(default_factory=HopLog)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = get_logger(self.name)
        # Every component can lose the tag on purpose (the colour-dropped game day).
        self.faults.kinds.setdefault(DROP_COLOUR, NoParams)
        gauge = Gauge(
            "canarystack_active_faults",
            "Faults active in this process, by kind",
            ["kind"],
            registry=self.registry,
        )
        for kind in self.faults.kinds:
            gauge.labels(kind=kind).set_function(self._fault_counter(kind))

    def _fault_counter(self, kind: str) -> Callable[[], float]:
        return lambda: float(self.faults.count(kind))

    def require_admin(self, request: web.Request) -> None:
        check_admin(request, self.admin_token)


COMPONENT: web.AppKey[Component] = web.AppKey("component", Component)


async def _health(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    body: JsonObject = {
        "status": "ok",
        "component": comp.name,
        "version": comp.version,
        "pid": os.getpid(),
        "uptime_s": round(time.monotonic() - comp.started_mono, 3),
    }
    reason: str | None = None
    if comp.health_extra is not None:
        try:
            extra = dict(comp.health_extra())
            strictjson.dumps(extra)  # a NaN here is a statistic gone bad: say so
        except Exception as exc:  # the health answer must still come
            assert comp.log is not None
            comp.log.error("health_check_failed", error=f"{type(exc).__name__}: {exc}")
            reason = f"health check failed: {type(exc).__name__}: {exc}"
        else:
            body.update(extra)
    if reason is not None:
        body["status"] = "degraded"
        body["degraded_reasons"] = [reason]
    status = 200 if body.get("status") == "ok" else 503
    return json_response(body, status=status)


async def _metrics(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    resp = web.Response(body=generate_latest(comp.registry))
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def _list_faults(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    comp.require_admin(request)
    return json_response({"faults": comp.faults.to_json()})


async def _inject_fault(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    comp.require_admin(request)
    body = await read_json_object(
        request, max_bytes=FAULT_BODY_LIMIT, unique_keys=True, what="Fault body"
    )
    actor = request.headers.get("x-actor", "admin")
    fault = comp.faults.inject(body, actor=actor)
    return json_response(fault.to_json(time.monotonic()), status=201)


async def _clear_fault(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    comp.require_admin(request)
    actor = request.headers.get("x-actor", "admin")
    fault = comp.faults.clear(request.match_info["fault_id"], actor=actor)
    return json_response({"cleared": [fault.to_json(time.monotonic())]})


async def _clear_all(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    comp.require_admin(request)
    actor = request.headers.get("x-actor", "admin")
    now = time.monotonic()
    return json_response({"cleared": [f.to_json(now) for f in comp.faults.clear_all(actor=actor)]})


async def _sweep_faults(app: web.Application) -> AsyncIterator[None]:
    comp = app[COMPONENT]

    async def loop() -> None:
        while True:
            await asyncio.sleep(FAULT_SWEEP_INTERVAL_S)
            comp.faults.active()  # prunes and logs expiry

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# -- traffic colouring ------------------------------------------------------------------
def _route_of(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


@web.middleware
async def colour_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
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


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
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


async def _colour_hops(request: web.Request) -> web.Response:
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


def _describe_colour(spec: ApiSpec, app: web.Application) -> None:
    hop = spec.named("ColourHop", HOP_SCHEMA)
    spec.add(
        "get",
        HOPS_PATH,
        summary="The coloured requests this component saw (request id, trace id, tag), paged.",
        description="Oldest first. Page with after_seq = the answer's next_after_seq; "
        "first_seq above after_seq + 1 (lost: true) means older hops were overwritten.",
        tag="colour",
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
        responses={
            200: json_body(
                obj(
                    ("hops", "first_seq", "next_after_seq"),
                    component=STRING,
                    pid=INTEGER,
                    started_at=NUMBER,
                    hops={"type": "array", "items": hop},
                    first_seq=INTEGER,
                    last_seq=INTEGER,
                    next_after_seq=INTEGER,
                    lost={"type": "boolean"},
                )
            )
        },
    )


def create_app(
    component: Component, *, client_max_size: int = DEFAULT_BODY_LIMIT
) -> web.Application:
    otel.setup(component.name)
    app = web.Application(
        middlewares=[error_middleware, colour_middleware], client_max_size=client_max_size
    )
    app[COMPONENT] = component
    app.on_response_prepare.append(_echo_request_id)
    app.router.add_get(HOPS_PATH, _colour_hops)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/admin/faults", _list_faults)
    app.router.add_post("/admin/faults", _inject_fault)
    app.router.add_delete("/admin/faults", _clear_all)
    app.router.add_delete("/admin/faults/{fault_id}", _clear_fault)
    app.cleanup_ctx.append(_sweep_faults)
    install_openapi(app, component)
    add_describer(app, _describe_colour)
    return app
