"""The router's long-lived state (pools, config watcher, sample queue, shadow manager,
metrics) and what one request carries through the path (``RequestContext``).

This module must never do I/O itself: the app's lifecycle (``server.py``) starts and
stops what it holds.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, replace
from typing import NotRequired, Protocol, TypedDict

import aiohttp
from aiohttp import web

from canary_contract.buckets import bucket_labels
from canarystack.common.app import Component
from canarystack.common.colour import Colour
from canarystack.common.logs import JsonLogger
from canarystack.router.collector import Collector
from canarystack.router.config import ConfigWatcher
from canarystack.router.metrics import RouterMetrics
from canarystack.router.proxy import Pool, Upstream
from canarystack.router.records import OutcomeRecord, SampleRecord
from canarystack.router.routing import Variant
from canarystack.router.samples import GatePusher, SampleQueue
from canarystack.router.settings import GATE_RECOVERY_S, RouterSettings
from canarystack.router.shadow import ShadowManager, ShadowStats
from canarystack.router.snapshot import Snapshot, SnapshotJson
from canarystack.router.streams import Place, StreamCaps


class RequestShadow(Protocol):
    """What the request path uses of a sampled request's shadow comparisons
    (``canarystack.router.shadow_session``'s ``ShadowSession``, which imports this module):
    its pairs, the collector that reads the user's answer, and the three moments it hears of.
    """

    @property
    def pairs(self) -> list[str]: ...
    @property
    def collector(self) -> Collector: ...
    def answer_started(self, t_send: float) -> None: ...
    def primary_finished(self, *, relayed: bool, t_send: float) -> None: ...
    def outcome(self, record: OutcomeRecord) -> None: ...


class SampleQueueHealth(TypedDict):
    length: int
    dropped_total: int
    gate_error: str | None
    unaccepted_s: float


class RouterHealth(TypedDict):
    """A router's ``/health``: the keys after ``instance_port`` only where they apply (a
    broker, a gate, shadowing, a sample queue; ``status`` and the rest while degraded)."""

    router_id: str
    release: str
    config: SnapshotJson
    last_seen_revision: int
    broker_watch_errors: int
    pools: dict[str, list[dict[str, object]]]
    instance_port: int | None
    broker_auth: NotRequired[str]
    broker_auth_error: NotRequired[str | None]
    gate_auth: NotRequired[str]
    gate_auth_error: NotRequired[str | None]
    shadow_inflight: NotRequired[int]
    sample_queue: NotRequired[SampleQueueHealth]
    # Always there, set after the optional keys above (so NotRequired where built).
    streams: NotRequired[dict[str, object]]
    gate_failsafe: NotRequired[str | None]
    status: NotRequired[str]
    degraded_reasons: NotRequired[list[str]]
    serving: NotRequired[bool]


@dataclass
class Attempt:
    """What the upstream answered for one request (after replica retries)."""

    resp: aiohttp.ClientResponse
    upstream: Upstream
    variant: Variant
    fallback: bool


@dataclass
class RequestContext:
    """One request on its way through the router; ``_finish`` logs and reports it."""

    colour: Colour  # the request's colour (its id, trace and tag): every hop carries it
    traceparent: str  # as the client sent it (when valid), else this hop's; for the log
    t0: float
    variant: Variant | None = None
    pinned: bool = False
    fallback: bool = False
    upstream: str | None = None
    bucket: str | None = None
    prompt_tokens: int = 0
    stream: bool = False
    status: int = 0
    ttft_s: float | None = None  # from arrival, for users and metrics
    upstream_ttft_s: float | None = None  # from send, for the gate
    error: str | None = None
    # The upstream's x-model-version and x-dependency ("ok" | "degraded", None: not sent).
    model_version: str = ""
    dependency: str | None = None
    # This request's shadow comparisons, when it was sampled (``shadow_session.py``).
    shadow: RequestShadow | None = None
    # Its place under the concurrency caps (``streams.py``), given back when it ends.
    place: Place | None = None

    @property
    def request_id(self) -> str:
        return self.colour.request_id

    @property
    def shadow_pairs(self) -> list[str]:
        return self.shadow.pairs if self.shadow is not None else []


class RouterState:
    def __init__(self, settings: RouterSettings, comp: Component) -> None:
        self.settings = settings
        self.comp = comp
        assert comp.log is not None
        self.log: JsonLogger = comp.log
        self.metrics = RouterMetrics(comp)
        self.pools: dict[str, Pool] = {
            "baseline": Pool.from_urls("baseline", settings.baseline_urls),
            "canary": Pool.from_urls("canary", settings.canary_urls),
        }
        self.session: aiohttp.ClientSession | None = None
        self.control: aiohttp.ClientSession | None = None
        self.queue: SampleQueue | None = None
        self.pusher: GatePusher | None = None
        self.shadow: ShadowManager | None = None
        if settings.shadow is not None:
            m = self.metrics
            self.shadow = ShadowManager(
                settings.shadow,
                ShadowStats(
                    on_request=lambda pair, result: m.shadow_requests.labels(
                        pair=pair, result=result
                    ).inc(),
                    on_comparison=lambda pair, bucket: m.shadow_comparisons.labels(
                        pair=pair, bucket=bucket
                    ).inc(),
                ),
            )
        self.config = ConfigWatcher(
            None,
            release=settings.release,
            router_id=settings.router_id,
            state_dir=settings.state_dir,
            heartbeat_s=settings.heartbeat_s,
            watch_timeout_s=settings.watch_timeout_s,
            is_stale=lambda: comp.faults.get("stale_config") is not None,
            on_error=lambda kind: self.metrics.watch_errors.labels(kind=kind).inc(),
            on_heartbeat_error=self.metrics.heartbeat_errors.inc,
            on_apply=self.metrics.on_apply,
            on_auth_error=lambda status: self.metrics.auth_errors.labels(
                peer="broker", status=str(status)
            ).inc(),
            failsafe_s=settings.watch_error_failsafe_s,
        )
        self.caps = StreamCaps(settings.max_client_streams, settings.max_pool_streams)
        self.gate_off: str | None = None  # why the dead-man switch holds the canary off
        self.rng = random.Random()
        # Same labels as canary_contract.buckets.bucket_of, computed once.
        self.bucket_labels = bucket_labels(settings.edges)

    def bucket_of(self, prompt_tokens: int) -> str:
        return self.bucket_labels[bisect.bisect_right(self.settings.edges, prompt_tokens)]

    @property
    def upstream_session(self) -> aiohttp.ClientSession:
        assert self.session is not None, "router not started"
        return self.session

    def gate_off_reason(self) -> str | None:
        """The dead-man switch: why the canary is off because the gate has not accepted
        samples for ``gate_deadman_s`` (posts failing, timing out or refused while samples
        wait), else None. A change is logged once."""
        reason = None
        pusher, limit_s = self.pusher, self.settings.gate_deadman_s
        if pusher is not None and pusher.unaccepted_s() >= limit_s:
            reason = (
                f"gate unreachable: it has not accepted samples for "
                f"{pusher.unaccepted_s():.0f} s (over --gate-deadman-s {limit_s:g}; last "
                f"error: {pusher.last_error})"
            )
        elif pusher is not None and pusher.last_outage_s >= limit_s:
            back_s = pusher.accepting_s()
            if back_s is not None and back_s < GATE_RECOVERY_S:
                reason = (
                    f"gate unreachable for {pusher.last_outage_s:.0f} s, accepting again for "
                    f"{back_s:.1f} s: the canary stays off {GATE_RECOVERY_S:g} s more, so a "
                    "trip in the samples it missed lands first"
                )
        if (reason is None) != (self.gate_off is None):
            self.metrics.gate_failsafe.set(0 if reason is None else 1)
            if reason is not None:
                self.log.error("gate_failsafe_on", reason=reason, canary_weight=0.0)
            else:
                self.log.info("gate_failsafe_off", reason="the gate accepts samples again")
        self.gate_off = reason
        return reason

    def snapshot(self) -> Snapshot:
        """The config a request sees: the broker's (``config.current``), with the canary
        at 0 % while the gate dead-man switch holds it off (pins refused, naming why)."""
        snap = self.config.current
        reason = self.gate_off_reason()
        if reason is None:
            return snap
        return replace(
            snap,
            weight_pct=0.0,
            canary_off=reason,
            canary_off_since=snap.canary_off_since or snap.applied_at,
        )

    def health(self) -> RouterHealth:
        snap = self.config.current
        out: RouterHealth = {
            "router_id": self.settings.router_id,
            "release": self.settings.release,
            "config": snap.to_json(),
            "last_seen_revision": self.config.last_seen_revision,
            "broker_watch_errors": self.config.watch_errors,
            "pools": {v: p.to_json() for v, p in self.pools.items()},
            "instance_port": self.settings.instance_port,
        }
        if self.settings.broker_url:
            out["broker_auth"] = self.config.broker_auth
            out["broker_auth_error"] = (
                self.config.auth_error if self.config.broker_auth != "ok" else None
            )
        if self.pusher is not None:
            out["gate_auth"] = self.pusher.auth
            out["gate_auth_error"] = self.pusher.auth_error if self.pusher.auth != "ok" else None
        if self.shadow is not None:
            out["shadow_inflight"] = self.shadow.inflight
        if self.queue is not None:
            out["sample_queue"] = {
                "length": len(self.queue),
                "dropped_total": self.queue.dropped_total,
                "gate_error": self.pusher.last_error if self.pusher else None,
                "unaccepted_s": round(self.pusher.unaccepted_s(), 3) if self.pusher else 0.0,
            }
        out["streams"] = self.caps.to_json()
        gate_off = self.gate_off_reason()
        out["gate_failsafe"] = gate_off
        if gate_off is not None:
            # Degraded, but serving: the baseline is fine, so HTTP 200 keeps this router in
            # its Service (a 503 would turn a gate outage into a user outage).
            out["status"] = "degraded"
            out["degraded_reasons"] = [gate_off]
            out["serving"] = True
        return out

    def push(self, kind: str, record: SampleRecord) -> None:
        if self.queue is not None:
            self.queue.put(kind, record)


STATE: web.AppKey[RouterState] = web.AppKey("router_state", RouterState)
