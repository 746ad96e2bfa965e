"""The gate's HTTP service (docs/ARCHITECTURE.md §3): sample intake, state, metrics
(``canarystack.gate.metrics``), faults (``latency``: ``ms`` of delay before a batch is
processed). State lives in memory: a restarted gate starts fresh (watching from zero
samples) and shows a release the broker already tripped as ``tripped``.

This module must never block sample intake on the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from canarystack.broker.client import BrokerClient
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.auth import check_token, set_credentials
from canarystack.common.errors import BadRequest, NotFound, json_response, read_json_object
from canarystack.common.faults import FaultParams, FaultRegistry, LatencyMs
from canarystack.common.logs import get_logger
from canarystack.gate.api_spec import install as install_api_spec
from canarystack.gate.keys import BROKER_TOKEN, SAMPLES_TOKEN, SERVICE
from canarystack.gate.service import GateService, check_credential
from canarystack.gate.state import GateConfig

__all__ = ["SAMPLES_BODY_LIMIT", "SERVICE", "GateService", "build_app"]

# The largest body the gate reads (413 above it). A router's batch (at most 500 samples,
# ~250 B each) is ~125 KB; this bound keeps the parse, validation and tests of one batch
# to ~40 ms of event loop at most.
SAMPLES_BODY_LIMIT = 384 * 1024

_log = get_logger("gate")

FAULT_KINDS: dict[str, type[FaultParams]] = {"latency": LatencyMs}


async def _post_samples(request: web.Request) -> web.Response:
    """A router's batch: validated as a whole, field by field, before anything is counted
    (400 naming the field); a release this gate does not watch is a 404; a resend of a
    ``batch_id`` counts nothing twice."""
    service = request.app[SERVICE]
    comp = request.app[COMPONENT]
    check_token(request, request.app[SAMPLES_TOKEN], "samples credential", "--samples-token-file")
    fault = comp.faults.get("latency")
    if isinstance(fault, LatencyMs) and fault.ms > 0:
        await comp.faults.delay("latency", fault.ms / 1000.0)
    body = await read_json_object(request)
    try:
        result = await service.ingest(body)
    except (BadRequest, NotFound):
        service.batches_total.labels(result="rejected").inc()
        raise
    return json_response(result)


async def _get_gate(request: web.Request) -> web.Response:
    """State, per-bucket and per-tail statistics, noise floor, trip evidence."""
    return json_response(request.app[SERVICE].status(request.match_info["release"]))


async def _list_gates(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return json_response(
        {
            "gates": [service.status(name) for name in service.gates],
            "false_alarm_budget": service.config.budget_json(),
        }
    )


async def _background(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        service.client = BrokerClient(
            session, service.broker_url, app[BROKER_TOKEN], actor="gate", capability="trip"
        )
        limit_check = asyncio.create_task(service.check_broker_watch_limit(session))
        service._loops["credential"] = asyncio.create_task(check_credential(service))
        for name in service.gates:
            service._loops[f"watch:{name}"] = asyncio.create_task(service.watch(name))
        service._loops["tick"] = asyncio.create_task(service.tick())
        tasks = [*service._loops.values(), limit_check]
        yield
        for task in [*tasks, *service._trip_tasks.values()]:
            task.cancel()
        for task in [*tasks, *service._trip_tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def build_app(
    config: GateConfig,
    broker_url: str,
    releases: Sequence[str],
    *,
    admin_token: str | None,
    max_fault_ttl_s: float,
    watch_timeout_s: float = 30.0,
    broker_token: str | None = None,
    samples_token: str | None = None,
) -> web.Application:
    """``admin_token``: the gate's fault credential; ``broker_token``: its trip credential;
    ``samples_token``: what ``POST /v1/samples`` must carry. The last two fall back to
    ``admin_token`` (single-credential mode)."""
    faults = FaultRegistry("gate", FAULT_KINDS, max_ttl_s=max_fault_ttl_s)
    comp = Component(name="gate", version="0.1.0", admin_token=admin_token, faults=faults)
    service = GateService(comp, config, broker_url, releases, watch_timeout_s=watch_timeout_s)
    comp.health_extra = service.health
    if config.release_test:
        r = config.release_budget()
        # The per-release guarantee, stated once at start (and in GET /v1/gate).
        _log.info(
            "release_test",
            test=r["test"],
            alpha=r["alpha"],
            floor_delta=r["floor_delta"],
            false_trip_probability_per_release=r["false_trip_probability_per_release"],
            threshold=r["threshold"],
            detectors=r["detectors"],
            focus_detector=r["focus_detector"],
            focus_weight=r["weights"][r["focus_detector"]],
            merge=r["merge"],
        )
    else:
        c = config.cusum_budget()
        _log.info(
            "false_alarm_budget",
            false_trips_per_release_hour=c["false_trips_per_release_hour"],
            requested=c["requested_false_trips_per_release_hour"],
            merge=c["merge"],
            detectors=c["detectors"],
            per_detector_threshold=c["per_detector_threshold"],
            sample_rate_hz_assumed=c["sample_rate_hz_assumed"],
        )
    app = create_app(comp, client_max_size=SAMPLES_BODY_LIMIT)
    app[SERVICE] = service
    set_credentials(app, admin_token, {BROKER_TOKEN: broker_token, SAMPLES_TOKEN: samples_token})
    app.router.add_post("/v1/samples", _post_samples)
    app.router.add_get("/v1/gate", _list_gates)
    app.router.add_get("/v1/gate/{release}", _get_gate)
    install_api_spec(app)
    app.cleanup_ctx.append(_background)
    return app
