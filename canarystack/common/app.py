"""The base aiohttp application every component builds on: ``create_app(component)``.

This module must never answer with what JSON cannot carry (``NaN``): every answer is
written with ``errors.json_response``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from canary_contract import strictjson
from canarystack.common import otel
from canarystack.common.colour_http import (
    HOPS_PATH,
    colour_hops,
    colour_middleware,
    describe_colour,
    echo_request_id,
)
from canarystack.common.component import COMPONENT, DROP_COLOUR, Component
from canarystack.common.errors import (
    DEFAULT_BODY_LIMIT,
    error_middleware,
    json_response,
    read_json_object,
)
from canarystack.common.faults import FAULT_BODY_LIMIT
from canarystack.common.openapi import add_describer
from canarystack.common.openapi import install as install_openapi

__all__ = ["COMPONENT", "DROP_COLOUR", "Component", "create_app"]

# How often expired faults are pruned (and their expiry logged) without a request.
FAULT_SWEEP_INTERVAL_S = 0.5


async def _health(request: web.Request) -> web.Response:
    comp = request.app[COMPONENT]
    body: dict[str, object] = {
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
    # "serving": degraded, yet still answering its users (the router without its gate
    # serves the baseline): 200, so a readiness probe keeps it in its Service.
    serving = body.get("serving") is True and reason is None
    status = 200 if body.get("status") == "ok" or serving else 503
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
    answer = fault.to_json(time.monotonic())
    answer["replaced"] = list(fault.replaced)
    return json_response(answer, status=201)


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


def create_app(
    component: Component, *, client_max_size: int = DEFAULT_BODY_LIMIT
) -> web.Application:
    """An app with ``GET /health`` (``{"status", "component", "version", "pid",
    "uptime_s"}`` and ``health_extra``'s fields; 503 when degraded), ``GET /metrics`` (the
    component's own registry, with ``canarystack_active_faults{kind}``), ``/admin/faults``
    (``canarystack.common.faults``, admin token, bodies at most ``FAULT_BODY_LIMIT`` bytes,
    each key once), JSON errors (``canarystack.common.errors``), traffic colouring and
    ``GET /v1/colour/hops`` (``canarystack.common.colour_http``) and ``/openapi.json``.
    Bodies are limited by ``client_max_size`` (default 1 MiB; the model server and the
    router size theirs from their context length). The component adds its own routes."""
    otel.setup(component.name)
    app = web.Application(
        middlewares=[error_middleware, colour_middleware], client_max_size=client_max_size
    )
    app[COMPONENT] = component
    app.on_response_prepare.append(echo_request_id)
    app.router.add_get(HOPS_PATH, colour_hops)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/admin/faults", _list_faults)
    app.router.add_post("/admin/faults", _inject_fault)
    app.router.add_delete("/admin/faults", _clear_all)
    app.router.add_delete("/admin/faults/{fault_id}", _clear_fault)
    app.cleanup_ctx.append(_sweep_faults)
    install_openapi(app, component)
    add_describer(app, describe_colour)
    return app
