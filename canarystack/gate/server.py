"""The gate's HTTP service: sample intake, state, metrics, and the broker watch.

- ``POST /v1/samples`` (admin): a router's batch (docs/ARCHITECTURE.md §3). Validated
  field by field (400 naming the field); a release this gate does not watch is a 404.
- ``GET /v1/gate/{release}``: state, per-bucket and per-tail statistics, noise floor,
  trip evidence. ``GET /v1/gate``: every watched release.
- ``/metrics``: per scope and test the e-CUSUM statistic and threshold, samples per
  bucket, noise floors, the state, trips.
- Faults: ``latency`` (``ms`` of delay before a batch is processed).

One watch task per release long-polls the broker (``?after=REV``) and keeps the gate's
view of phase, weights, revision and canary version; a new canary version resets the
release's state. A trip decision is written by ``canarystack.gate.tripper`` in its own
task, so intake never waits on the broker.

State lives in memory: a restarted gate starts fresh (watching from zero samples) and
shows a release the broker already tripped as ``tripped``.

This module must never block sample intake on the broker, and never trip a release the
broker does not show as progressing with the canary the samples were about.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from canarystack.broker.client import BrokerClient, BrokerNotFound, BrokerUnavailable
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.errors import BadRequest, NotFound, parse_model, read_json_object
from canarystack.common.faults import FaultParams, FaultRegistry, LatencyMs
from canarystack.common.logs import get_logger
from canarystack.gate.state import STATES, GateConfig, ReleaseGate, SampleBatch, check_buckets
from canarystack.gate.tripper import write_trip

Json = dict[str, Any]

# Module-level so tests can shorten them.
TICK_S = 0.25
WATCH_BACKOFF_S = 0.1
WATCH_MAX_BACKOFF_S = 2.0
MISSING_RELEASE_RETRY_S = 1.0

_log = get_logger("gate")


FAULT_KINDS: dict[str, type[FaultParams]] = {"latency": LatencyMs}


class GateService:
    """The gates of the watched releases and the tasks that keep them in step."""

    def __init__(
        self,
        component: Component,
        config: GateConfig,
        broker_url: str,
        releases: Sequence[str],
        *,
        watch_timeout_s: float = 30.0,
    ) -> None:
        self.component = component
        self.config = config
        self.broker_url = broker_url
        self.watch_timeout_s = watch_timeout_s
        self.gates: dict[str, ReleaseGate] = {name: ReleaseGate(name, config) for name in releases}
        self._trip_tasks: dict[str, asyncio.Task[None]] = {}
        self._states: dict[str, str] = {}
        self.client: BrokerClient | None = None
        reg = component.registry
        self.samples_total = Counter(
            "canarystack_gate_samples",
            "Samples received, by release and kind",
            ["release", "kind"],
            registry=reg,
        )
        self.ignored_total = Counter(
            "canarystack_gate_ignored_samples",
            "Samples not tested, by release and reason",
            ["release", "reason"],
            registry=reg,
        )
        self.batches_total = Counter(
            "canarystack_gate_batches", "Sample batches, by result", ["result"], registry=reg
        )
        self.router_dropped_total = Counter(
            "canarystack_gate_router_dropped_samples",
            "Samples the routers reported dropping (full queue)",
            ["release"],
            registry=reg,
        )
        self.trips_total = Counter(
            "canarystack_gate_trips",
            "Trips written to the broker",
            ["release", "test", "bucket"],
            registry=reg,
        )
        reg.register(_GateCollector(self))

    # -- intake ----------------------------------------------------------------------
    async def ingest(self, body: Json) -> Json:
        batch = parse_model(SampleBatch, body, what="sample batch")
        gate = self.gates.get(batch.release)
        if gate is None:
            watched = ", ".join(sorted(self.gates))
            raise NotFound(
                f"Release {batch.release!r} is not watched by this gate (watching: {watched}); "
                f"start the gate with --release {batch.release} or send the router's samples "
                "to the gate that watches it.",
                param="release",
            )
        unknown = check_buckets(batch, self.config.labels)
        if unknown is not None:
            param, label = unknown
            raise BadRequest(
                f"Unknown bucket {label!r} in {param}: this gate's buckets are "
                f"{', '.join(self.config.labels)}; start the gate and the routers with the "
                "same --bucket-edges.",
                param=param,
            )
        got = gate.ingest(batch, time.monotonic(), time.time())
        self._count(batch, got.to_json())
        if gate.trip is not None and gate.trip_status == "pending":
            self._start_trip(gate)
        return {
            "release": gate.name,
            "accepted": {
                "comparisons": got.comparisons,
                "noise_comparisons": got.noise_comparisons,
                "outcomes": got.outcomes,
            },
            "ignored": got.ignored,
            "state": gate.state(time.monotonic()),
        }

    def _count(self, batch: SampleBatch, got: Json) -> None:
        name = batch.release
        self.batches_total.labels(result="accepted").inc()
        for kind in ("comparisons", "noise_comparisons", "outcomes"):
            if got[kind]:
                self.samples_total.labels(release=name, kind=kind).inc(got[kind])
        for reason, n in got["ignored"].items():
            self.ignored_total.labels(release=name, reason=reason).inc(n)
        if batch.dropped:
            self.router_dropped_total.labels(release=name).inc(batch.dropped)

    # -- trips -----------------------------------------------------------------------
    def _start_trip(self, gate: ReleaseGate) -> None:
        task = self._trip_tasks.get(gate.name)
        if task is not None and not task.done():
            return
        if gate.trip is None:
            return
        if not gate.trip.get("tripped_at"):
            gate.trip["tripped_at"] = time.time()
        gate.trip_status = "writing"
        _log.info("trip_decided", release=gate.name, trip=gate.trip)
        self._trip_tasks[gate.name] = asyncio.create_task(self._write_trip(gate))

    async def _write_trip(self, gate: ReleaseGate) -> None:
        assert self.client is not None
        evidence = gate.trip
        assert evidence is not None
        result = await write_trip(
            self.client,
            gate.name,
            evidence,
            gate.canary_version,
            gate.release,
            on_release=lambda rel: gate.on_release(rel, time.monotonic()),
            log=_log,
        )
        if gate.trip is not evidence:  # reset meanwhile (new canary): nothing to record
            return
        if result.written:
            gate.trip_status = "written"
            gate.trip_revision = None if result.release is None else result.release["revision"]
            self.trips_total.labels(
                release=gate.name, test=evidence["test"], bucket=evidence["bucket"]
            ).inc()
            _log.info(
                "trip_written",
                release=gate.name,
                revision=gate.trip_revision,
                attempts=result.attempts,
                delay_s=round(time.time() - evidence["tripped_at"], 4),
            )
        else:
            gate.trip_status = f"abandoned: {result.reason}"
            _log.warning("trip_abandoned", release=gate.name, reason=result.reason)

    # -- broker watch ----------------------------------------------------------------
    def _on_release(self, gate: ReleaseGate, release: Json | None) -> None:
        gate.on_release(release, time.monotonic())
        if gate.trip is not None and gate.trip_status == "pending":
            self._start_trip(gate)

    async def watch(self, name: str) -> None:
        gate = self.gates[name]
        assert self.client is not None
        backoff = WATCH_BACKOFF_S
        fresh = True
        while True:
            try:
                if fresh or gate.release is None:
                    release = await self.client.get_release(name)
                else:
                    release = await self.client.watch(
                        name, after=int(gate.revision or 0), timeout_s=self.watch_timeout_s
                    )
                fresh = False
                backoff = WATCH_BACKOFF_S
                self._on_release(gate, release)
            except BrokerNotFound:
                self._on_release(gate, None)
                fresh = True
                await asyncio.sleep(MISSING_RELEASE_RETRY_S)
            except BrokerUnavailable as exc:
                _log.warning("broker_unavailable", release=name, error=str(exc))
                fresh = True
                await asyncio.sleep(backoff)
                backoff = min(WATCH_MAX_BACKOFF_S, backoff * 2)

    async def tick(self) -> None:
        """No-data checks and state-change logs, a few times a second."""
        while True:
            now = time.monotonic()
            for gate in self.gates.values():
                state = gate.state(now)
                if (
                    state == "inconclusive"
                    and self.config.trip_on_no_data
                    and gate.trip is None
                    and gate.trippable()
                ):
                    gate.decide_no_data(now, time.time())
                    self._start_trip(gate)
                    state = gate.state(now)
                if self._states.get(gate.name) != state:
                    _log.info(
                        "gate_state",
                        release=gate.name,
                        state=state,
                        previous=self._states.get(gate.name),
                        revision=gate.revision,
                        canary_version=gate.canary_version,
                    )
                    self._states[gate.name] = state
            await asyncio.sleep(TICK_S)

    def status(self, name: str) -> Json:
        gate = self.gates.get(name)
        if gate is None:
            raise NotFound(
                f"Release {name!r} is not watched by this gate; it watches "
                f"{', '.join(sorted(self.gates))}.",
                param="release",
            )
        return gate.to_json(time.monotonic())


class _GateCollector(Collector):
    """Reads the gates' current statistics at scrape time."""

    def __init__(self, service: GateService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        stat = GaugeMetricFamily(
            "canarystack_gate_statistic",
            "e-CUSUM statistic per release, scope (bucket or tail) and test",
            labels=["release", "scope", "test"],
        )
        thr = GaugeMetricFamily(
            "canarystack_gate_threshold",
            "Alarm threshold of each test (average run length bound, samples)",
            labels=["release", "scope", "test"],
        )
        n = GaugeMetricFamily(
            "canarystack_gate_test_samples",
            "Samples each test has seen since the canary version was set",
            labels=["release", "scope", "test"],
        )
        bucket_samples = GaugeMetricFamily(
            "canarystack_gate_bucket_samples",
            "Samples per bucket since the canary version was set, by kind",
            labels=["release", "bucket", "kind"],
        )
        noise = GaugeMetricFamily(
            "canarystack_gate_noise_floor",
            "Live noise floor (baseline-baseline) per scope and metric",
            labels=["release", "scope", "metric"],
        )
        state = GaugeMetricFamily(
            "canarystack_gate_state",
            "1 for the release's current state",
            labels=["release", "state"],
        )
        now = time.monotonic()
        for name, gate in self.service.gates.items():
            for scope, test, det in gate.detectors():
                stat.add_metric([name, scope, test], det.statistic)
                thr.add_metric([name, scope, test], det.threshold)
                n.add_metric([name, scope, test], det.samples)
            for label, b in gate.buckets.items():
                bucket_samples.add_metric([name, label, "comparisons"], b.comparisons)
                bucket_samples.add_metric([name, label, "noise_comparisons"], b.noise_comparisons)
                for variant, count in b.outcomes.items():
                    bucket_samples.add_metric([name, label, f"outcomes_{variant}"], count)
            for scope, floor in gate.noise_json().items():
                noise.add_metric([name, scope, "kl"], floor["kl"])
                noise.add_metric([name, scope, "top1_disagreement"], floor["top1_disagreement"])
            current = gate.state(now)
            for s in STATES:
                state.add_metric([name, s], 1.0 if s == current else 0.0)
        yield from (stat, thr, n, bucket_samples, noise, state)


SERVICE: web.AppKey[GateService] = web.AppKey("gate_service", GateService)


async def _post_samples(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    comp = request.app[COMPONENT]
    comp.require_admin(request)
    fault = comp.faults.get("latency")
    if isinstance(fault, LatencyMs) and fault.ms > 0:
        await asyncio.sleep(fault.ms / 1000.0)
    body = await read_json_object(request)
    try:
        result = await service.ingest(body)
    except (BadRequest, NotFound):
        service.batches_total.labels(result="rejected").inc()
        raise
    return web.json_response(result)


async def _get_gate(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].status(request.match_info["release"]))


async def _list_gates(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response({"gates": [service.status(name) for name in service.gates]})


async def _background(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    comp = app[COMPONENT]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        service.client = BrokerClient(session, service.broker_url, comp.admin_token, actor="gate")
        tasks = [asyncio.create_task(service.watch(name)) for name in service.gates]
        tasks.append(asyncio.create_task(service.tick()))
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
) -> web.Application:
    faults = FaultRegistry("gate", FAULT_KINDS, max_ttl_s=max_fault_ttl_s)
    comp = Component(name="gate", version="0.1.0", admin_token=admin_token, faults=faults)
    service = GateService(comp, config, broker_url, releases, watch_timeout_s=watch_timeout_s)
    comp.health_extra = lambda: {
        "releases": {name: gate.state(time.monotonic()) for name, gate in service.gates.items()}
    }
    app = create_app(comp)
    app[SERVICE] = service
    app.router.add_post("/v1/samples", _post_samples)
    app.router.add_get("/v1/gate", _list_gates)
    app.router.add_get("/v1/gate/{release}", _get_gate)
    app.cleanup_ctx.append(_background)
    return app
