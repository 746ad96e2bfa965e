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
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from canarystack.common import strictjson
from canarystack.common.auth import check_admin
from canarystack.common.colour import HopLog
from canarystack.common.errors import (
    DEFAULT_BODY_LIMIT,
    error_middleware,
    json_response,
    read_json_object,
)
from canarystack.common.faults import FAULT_BODY_LIMIT, FaultRegistry
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.common.openapi import install as install_openapi

# How often expired faults are pruned (and their expiry logged) without a request.
FAULT_SWEEP_INTERVAL_S = 0.5


@dataclass
class Component:
    name: str
    version: str
    admin_token: str | None
    faults: FaultRegistry
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    log: JsonLogger | None = None
    health_extra: Callable[[], dict[str, Any]] | None = None
    started_mono: float = field(default_factory=time.monotonic)
    # The coloured requests this component saw (canarystack.common.colour; the probe reads it).
    hops: HopLog = field(default_factory=HopLog)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = get_logger(self.name)
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
    body: dict[str, Any] = {
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


def create_app(
    component: Component, *, client_max_size: int = DEFAULT_BODY_LIMIT
) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=client_max_size)
    app[COMPONENT] = component
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/admin/faults", _list_faults)
    app.router.add_post("/admin/faults", _inject_fault)
    app.router.add_delete("/admin/faults", _clear_all)
    app.router.add_delete("/admin/faults/{fault_id}", _clear_fault)
    app.cleanup_ctx.append(_sweep_faults)
    install_openapi(app)
    return app
