"""The gate's service: the gates of the watched releases and the tasks that keep them in
step with the broker (docs/ARCHITECTURE.md §4). Over 400 lines because ``GateService`` is
the one owner of the loops and their health (intake, trip writers, watches, tick, degraded
reasons), which share its fields; its metrics and HTTP stand alone.

This module must never block sample intake on the broker, and never trip a release the
broker does not show as progressing with the canary the samples were about.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

import aiohttp

from canary_contract.broker import Release, TripRecord
from canarystack.broker.client import (
    BrokerClient,
    BrokerRequestError,
    FollowEvent,
    FollowKind,
)
from canarystack.common.app import Component
from canarystack.common.colour import Colour
from canarystack.common.errors import BadRequest, parse_model, release_not_served
from canarystack.common.logs import get_logger
from canarystack.common.metrics import Metrics
from canarystack.gate.metrics import GateCollector
from canarystack.gate.scopes import Ingested
from canarystack.gate.state import (
    BatchRefused,
    GateConfig,
    GateJson,
    GateState,
    ReleaseGate,
    SampleBatch,
    TripStatus,
)
from canarystack.gate.tripper import write_trip

# Module-level so tests can shorten them.
TICK_S = 0.25
WATCH_BACKOFF_S = 0.1
WATCH_MAX_BACKOFF_S = 2.0
MISSING_RELEASE_RETRY_S = 1.0
# The lowest long-poll timeout the gate lowers itself to when the broker refuses its own.
MIN_WATCH_TIMEOUT_S = 1.0
CREDENTIAL_CHECK_S = 30.0

_log = get_logger("gate")


class Accepted(TypedDict):
    comparisons: int
    noise_comparisons: int
    outcomes: int


class SamplesAnswer(TypedDict):
    """``POST /v1/samples``'s answer: what the batch added, and the gate's state after."""

    release: str
    accepted: Accepted
    ignored: dict[str, int]
    duplicate: bool
    batch_id: str | None
    state: GateState


class GateHealth(TypedDict):
    """The gate's fields of ``/health``; ``watch_timeout_lowered_from`` only when the
    watch timeout was lowered, ``status`` and ``degraded_reasons`` only while degraded."""

    releases: dict[str, GateState]
    broker_auth: str
    broker_auth_error: str | None
    watch_timeout_s: float
    loop_errors: dict[str, str]
    watch_timeout_lowered_from: NotRequired[float]
    status: NotRequired[str]
    degraded_reasons: NotRequired[list[str]]


class GateService:
    """The gates of the watched releases and the tasks that keep them in step.

    One watch task per release follows the broker (``BrokerClient.follow``) and keeps the
    gate's view of phase, weights, revision and canary version; a new canary version
    resets the release's state. A trip decision is written by ``canarystack.gate.tripper``
    in its own task, so intake never waits on the broker. Each coloured sample of an
    accepted batch is a ``gate_sample`` hop.
    """

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
        self._loops: dict[str, asyncio.Task[None]] = {}  # "watch:<release>", "tick"
        self._loop_errors: dict[str, str] = {}  # loop -> last error, until it succeeds
        self._states: dict[str, str] = {}
        self.broker_auth = "ok"  # ok | unauthorized | forbidden (the last trip write)
        self.broker_auth_error: str | None = None
        self.watch_timeout_lowered_from: float | None = None
        self.client: BrokerClient | None = None
        m = Metrics(component.registry)
        self.samples_total = m.counter(
            "canarystack_gate_samples", "Samples received, by release and kind", "release", "kind"
        )
        self.ignored_total = m.counter(
            "canarystack_gate_ignored_samples",
            "Samples not tested, by release and reason",
            "release",
            "reason",
        )
        self.batches_total = m.counter(
            "canarystack_gate_batches", "Sample batches, by result", "result"
        )
        self.router_dropped_total = m.counter(
            "canarystack_gate_router_dropped_samples",
            "Samples the routers reported dropping (full queue)",
            "release",
        )
        self.trips_total = m.counter(
            "canarystack_gate_trips", "Trips written to the broker", "release", "test", "bucket"
        )
        self.watch_errors_total = m.counter(
            "canarystack_gate_watch_errors",
            "Errors of the gate's broker watch and tick loops, by loop and error kind",
            "loop",
            "error",
        )
        self.broker_auth_errors_total = m.counter(
            "canarystack_gate_broker_auth_errors",
            "Broker refusals (401/403) of the gate's credential, by release and status",
            "release",
            "status",
        )
        self.degraded_total = m.counter(
            "canarystack_gate_degraded_transitions",
            "Times the gate's health went from ok to degraded, by reason",
            "reason",
        )
        reg = component.registry
        self._last_reasons: set[str] = set()
        reg.register(GateCollector(self))

    # -- intake ----------------------------------------------------------------------
    async def ingest(self, body: Mapping[str, object]) -> SamplesAnswer:
        batch = parse_model(SampleBatch, body, what="sample batch")
        gate = self.gates.get(batch.release)
        if gate is None:
            raise release_not_served(
                batch.release,
                self.gates,
                "watched by this gate",
                f"start the gate with --release {batch.release} or send the router's samples "
                "to the gate that watches it.",
            )
        try:
            got = gate.ingest(batch, time.monotonic(), time.time())
        except BatchRefused as exc:
            raise BadRequest(exc.message, param=exc.param) from None
        if got.duplicate:
            self.batches_total.labels(result="duplicate").inc()
            return {
                "release": gate.name,
                "accepted": {"comparisons": 0, "noise_comparisons": 0, "outcomes": 0},
                "ignored": {},
                "duplicate": True,
                "batch_id": batch.batch_id,
                "state": gate.state(time.monotonic()),
            }
        self._count(batch, got)
        self._record_hops(batch)
        if gate.trip is not None and gate.trip_status is TripStatus.PENDING:
            self._start_trip(gate)
        return {
            "release": gate.name,
            "accepted": {
                "comparisons": got.comparisons,
                "noise_comparisons": got.noise_comparisons,
                "outcomes": got.outcomes,
            },
            "ignored": got.ignored,
            "duplicate": False,
            "batch_id": batch.batch_id,
            "state": gate.state(time.monotonic()),
        }

    def _record_hops(self, batch: SampleBatch) -> None:
        """A ``gate_sample`` hop for each coloured sample of an accepted batch (the gate saw
        that request's sample), for the colouring probe (``GET /v1/hops``)."""
        now = time.time()
        hops = self.component.hops
        for sample in (*batch.comparisons, *batch.outcomes):
            if sample.request_id is None or sample.trace_id is None:
                continue
            colour = Colour(
                request_id=sample.request_id,
                trace_id=sample.trace_id,
                span_id=secrets.token_hex(8),
                parent_span_id=None,
                tag=sample.tag,
            )
            hops.record("gate_sample", colour, now)

    def _count(self, batch: SampleBatch, got: Ingested) -> None:
        name = batch.release
        self.batches_total.labels(result="accepted").inc()
        counts = (
            ("comparisons", got.comparisons),
            ("noise_comparisons", got.noise_comparisons),
            ("outcomes", got.outcomes),
        )
        for kind, count in counts:
            if count:
                self.samples_total.labels(release=name, kind=kind).inc(count)
        for reason, n in got.ignored.items():
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
        gate.trip_status = TripStatus.WRITING
        gate.trip_status_reason = None
        _log.info("trip_decided", release=gate.name, trip=gate.trip)
        self._trip_tasks[gate.name] = asyncio.create_task(self._write_trip(gate))

    async def _write_trip(self, gate: ReleaseGate) -> None:
        assert self.client is not None
        evidence = gate.trip
        assert evidence is not None
        canary_version = gate.canary_version
        loop = f"trip:{gate.name}"
        known = gate.release
        backoff = WATCH_BACKOFF_S
        while True:
            try:
                result = await write_trip(
                    self.client,
                    gate.name,
                    evidence,
                    canary_version,
                    known,
                    on_release=lambda rel: gate.on_release(rel, time.monotonic()),
                    on_auth=lambda exc: self._on_auth(gate, evidence, exc),
                    log=_log,
                )
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. a broker answer we cannot read: never lose it
                _log.error("trip_write_error", release=gate.name, error=repr(exc), exc_info=True)
                self._loop_failed(loop, type(exc).__name__, repr(exc))
                if gate.trip is not evidence:
                    self._loop_ok(loop)
                    return
                known = None
                await asyncio.sleep(backoff)
                backoff = min(WATCH_MAX_BACKOFF_S, backoff * 2)
        self._loop_ok(loop)
        if gate.trip is not evidence:  # reset meanwhile (new canary): nothing to record
            return
        if result.written:
            self._on_auth(gate, evidence, None)
            gate.trip_status = TripStatus.WRITTEN
            gate.trip_status_reason = None
            gate.trip_revision = None if result.release is None else result.release.revision
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
            gate.abandon_trip(result.reason)
            _log.warning("trip_abandoned", release=gate.name, reason=result.reason)

    def _on_auth(
        self, gate: ReleaseGate, evidence: TripRecord, exc: BrokerRequestError | None
    ) -> None:
        """The broker accepted (None) or refused (401/403) the gate's credential."""
        if exc is None:
            if self.broker_auth != "ok":
                _log.info("broker_auth_ok", release=gate.name)
            self.broker_auth = "ok"
            self.broker_auth_error = None
            return
        self.broker_auth = "unauthorized" if exc.status == 401 else "forbidden"
        self.broker_auth_error = exc.message
        self.broker_auth_errors_total.labels(release=gate.name, status=str(exc.status)).inc()
        if gate.trip is evidence:
            gate.trip_status_reason = (
                f"the broker refuses the gate's credential ({exc.status}): retrying until it "
                "works; give the gate the trip credential (--broker-token-file)"
            )

    # -- broker watch ----------------------------------------------------------------
    def _on_release(self, gate: ReleaseGate, release: Release | None) -> None:
        gate.on_release(release, time.monotonic())
        if gate.trip is not None and gate.trip_status is TripStatus.PENDING:
            self._start_trip(gate)

    def _loop_failed(self, loop: str, kind: str, error: str) -> None:
        self.watch_errors_total.labels(loop=loop, error=kind).inc()
        self._loop_errors[loop] = f"{kind}: {error}"[:500]

    def _loop_ok(self, loop: str) -> None:
        if self._loop_errors.pop(loop, None) is not None:
            _log.info("loop_recovered", loop=loop)

    async def watch(self, name: str) -> None:
        """Keep ``name``'s release in view; survives any error.

        Fail closed: the watch and tick loops survive any exception (logged, counted in
        ``canarystack_gate_watch_errors_total``, retried with backoff); a watch the broker
        refuses (4xx) falls back to plain reads and, when it refuses the long-poll timeout,
        the gate lowers ``--watch-timeout-s`` to what the broker allows.
        """
        gate = self.gates[name]
        assert self.client is not None
        loop = f"watch:{name}"
        follower = self.client.follow(
            name,
            lambda: self.watch_timeout_s,
            backoff_s=WATCH_BACKOFF_S,
            max_backoff_s=WATCH_MAX_BACKOFF_S,
            missing_retry_s=MISSING_RELEASE_RETRY_S,
        )
        async for event in follower:
            try:
                self._on_follow(gate, loop, event)
            except Exception as exc:  # a bug or a broker answer we cannot read: never die
                _log.error("watch_error", release=name, error=repr(exc), exc_info=True)
                self._loop_failed(loop, type(exc).__name__, repr(exc))
                follower.retry()

    def _on_follow(self, gate: ReleaseGate, loop: str, event: FollowEvent) -> None:
        name = gate.name
        if event.kind is FollowKind.RELEASE:
            self._on_release(gate, event.release)
            if event.long_poll:  # a plain read working says nothing about the watch
                self._loop_ok(loop)
        elif event.kind is FollowKind.NOT_FOUND:
            self._on_release(gate, None)
            self._loop_ok(loop)
        elif event.kind is FollowKind.UNAVAILABLE:
            # Down or slow: a broker restart is routine; retried, logged, counted.
            _log.warning("broker_unavailable", release=name, error=str(event.error))
            self.watch_errors_total.labels(loop=loop, error="unavailable").inc()
        elif event.kind is FollowKind.REFUSED and isinstance(event.error, BrokerRequestError):
            # The broker refuses the watch itself: read plainly meanwhile (the follower
            # does), and adapt when what it refuses is our long-poll timeout.
            exc = event.error
            _log.error(
                "watch_refused",
                release=name,
                status=exc.status,
                param=exc.param,
                error=exc.message,
                watch_timeout_s=self.watch_timeout_s,
            )
            self._loop_failed(loop, f"refused_{exc.status}", exc.message)
            if exc.status == 400 and exc.param == "timeout_s":
                self._lower_watch_timeout(name)
        else:  # an answer that is not a release, or a bug
            kind = type(event.error).__name__ if event.kind is FollowKind.ERROR else "bad_answer"
            _log.error("watch_error", release=name, error=repr(event.error))
            self._loop_failed(loop, kind, repr(event.error))

    async def check_broker_watch_limit(self, session: aiohttp.ClientSession) -> None:
        """At start: a ``--watch-timeout-s`` above the broker's ``max_watch_s`` (in its
        ``/health``) would have every watch refused; lower it at once, loudly. A broker
        that does not answer or say is left to the watch loop (which adapts the same way).
        """
        try:
            async with session.get(
                self.broker_url.rstrip("/") + "/health", timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                body = await resp.json(content_type=None)
        except Exception as exc:  # best effort: the watch loop copes without it
            _log.info("broker_watch_limit_unknown", error=repr(exc))
            return
        limit = body.get("max_watch_s") if isinstance(body, dict) else None
        if (
            isinstance(limit, (int, float))
            and not isinstance(limit, bool)
            and 0 < limit < self.watch_timeout_s
        ):
            old = self.watch_timeout_s
            self.watch_timeout_lowered_from = old
            self.watch_timeout_s = max(MIN_WATCH_TIMEOUT_S, float(limit))
            _log.warning(
                "watch_timeout_lowered",
                watch_timeout_s=self.watch_timeout_s,
                previous=old,
                hint=f"the broker's --max-watch-s is {limit:g}, below the gate's "
                "--watch-timeout-s; start the gate with a --watch-timeout-s the broker allows",
            )

    def _lower_watch_timeout(self, name: str) -> None:
        old = self.watch_timeout_s
        new = max(MIN_WATCH_TIMEOUT_S, old / 2)
        if new >= old:
            return
        if self.watch_timeout_lowered_from is None:
            self.watch_timeout_lowered_from = old
        self.watch_timeout_s = new
        _log.warning(
            "watch_timeout_lowered",
            release=name,
            watch_timeout_s=new,
            previous=old,
            hint="the broker's --max-watch-s is below the gate's --watch-timeout-s; "
            "start the gate with a --watch-timeout-s the broker allows",
        )

    async def tick(self) -> None:
        """No-data checks and state-change logs, a few times a second; survives errors."""
        while True:
            try:
                self._tick_once()
                self._loop_ok("tick")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.error("tick_error", error=repr(exc), exc_info=True)
                self._loop_failed("tick", type(exc).__name__, repr(exc))
            await asyncio.sleep(TICK_S)

    def _tick_once(self) -> None:
        now = time.monotonic()
        for gate in self.gates.values():
            state = gate.state(now)
            if state == "inconclusive" and gate.trip is None and gate.trippable():
                if self.config.trip_on_no_data:
                    gate.decide_no_data(now, time.time())
                elif gate.check_blind(now):
                    gate.decide_blind(now, time.time())
                if gate.trip is not None:
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
        self.degraded_reasons()  # counts ok -> degraded transitions without a scrape

    def degraded_reasons(self) -> list[str]:
        """Why the gate cannot be trusted now (empty: ok): a statistic is not finite, a
        loop died or keeps failing, or the broker refuses the gate's credential (a trip
        then stays ``writing``, retried until it lands)."""
        reasons: list[str] = []
        for gate in self.gates.values():
            reasons.extend(f"{p}:{gate.name}" for p in gate.problems())
        for loop, task in self._loops.items():
            if task.done() and not task.cancelled():
                reasons.append(f"loop_died:{loop}")
        reasons.extend(f"loop_failing:{loop}" for loop in sorted(self._loop_errors))
        if self.broker_auth != "ok":
            reasons.append(f"broker_auth_{self.broker_auth}")
        current = set(reasons)
        for reason in current - self._last_reasons:
            self.degraded_total.labels(reason=reason.split(":", 1)[0]).inc()
            _log.error("gate_degraded", reason=reason)
        self._last_reasons = current
        return reasons

    def health(self) -> GateHealth:
        reasons = self.degraded_reasons()
        now = time.monotonic()
        body: GateHealth = {
            "releases": {name: gate.state(now) for name, gate in self.gates.items()},
            "broker_auth": self.broker_auth,
            "broker_auth_error": self.broker_auth_error,
            "watch_timeout_s": self.watch_timeout_s,
            "loop_errors": dict(self._loop_errors),
        }
        if self.watch_timeout_lowered_from is not None:
            body["watch_timeout_lowered_from"] = self.watch_timeout_lowered_from
        if reasons:
            body["status"] = "degraded"
            body["degraded_reasons"] = reasons
        return body

    def status(self, name: str) -> GateJson:
        gate = self.gates.get(name)
        if gate is None:
            raise release_not_served(
                name, self.gates, "watched by this gate", "ask the gate that watches it."
            )
        return gate.to_json(time.monotonic())


async def check_credential(service: GateService) -> None:
    """At start and every CREDENTIAL_CHECK_S: does the broker grant our credential
    ``trip`` (``GET /v1/whoami``)? A gate holding the wrong one must say so (degraded)
    before the trip it could not write, not after."""
    while True:
        client = service.client
        if client is not None:
            try:
                await client.check_credential()
                if service.broker_auth != "ok":
                    _log.info("broker_auth_ok", check="whoami")
                service.broker_auth, service.broker_auth_error = "ok", None
            except BrokerRequestError as exc:
                if exc.status in (401, 403):
                    if service.broker_auth == "ok":
                        _log.error("broker_auth_refused", status=exc.status, error=exc.message)
                    service.broker_auth = "unauthorized" if exc.status == 401 else "forbidden"
                    service.broker_auth_error = exc.message
            except Exception as exc:  # unreachable broker: the watch loop reports it
                _log.info("credential_check_failed", error=repr(exc))
        await asyncio.sleep(CREDENTIAL_CHECK_S)
