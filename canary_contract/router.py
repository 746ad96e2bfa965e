"""What a router reports about itself (``GET /health`` on a router): the config it
applies, where that came from, and whether its broker and gate accept it."""

from __future__ import annotations

import enum
from typing import ClassVar

from canary_contract._record import Flag, Int, Number, Record, Text
from canary_contract.json import JsonObject


class ConfigSource(enum.StrEnum):
    """Where a router's applied config came from."""

    BROKER = "broker"
    CACHE = "cache"  # the router's file cache: the broker was not reachable at start
    NONE = "none"  # no config yet: the canary gets nothing
    FAILSAFE = "failsafe"  # the broker stopped answering: the canary gets nothing


class PeerAuth(enum.StrEnum):
    """The last answer a router's broker or gate gave its credential."""

    OK = "ok"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"


class RouterConfig(Record):
    """The config a router applies now. ``canary_off_since`` is the router's clock at the
    apply that made the effective weight 0 (null while above 0); ``canary_off`` says why
    a pin to the canary is refused (null while pins may pass)."""

    revision: Int
    phase: Text | None
    effective_canary_weight: Number
    source: ConfigSource
    stable_version: Text | None
    canary_version: Text | None
    applied_at: Number
    canary_off_since: Number | None
    canary_off: Text | None


class Upstream(Record):
    url: Text
    up: Flag
    connect_failures: Int


class SampleQueueState(Record):
    length: Int
    dropped_total: Int
    gate_error: Text | None


class RouterState(Record):
    """A router's ``/health`` answer. The broker and gate fields are present only when
    the router has a broker or a gate (``None`` here, left out on the wire)."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset(
        {"broker_auth", "gate_auth", "shadow_inflight", "sample_queue", "degraded_reasons"}
    )

    status: Text
    component: Text
    version: Text
    pid: Int
    uptime_s: Number
    router_id: Text
    release: Text
    config: RouterConfig
    last_seen_revision: Int
    broker_watch_errors: Int
    pools: dict[str, tuple[Upstream, ...]]
    instance_port: Int | None
    broker_auth: PeerAuth | None = None
    broker_auth_error: Text | None = None
    gate_auth: PeerAuth | None = None
    gate_auth_error: Text | None = None
    shadow_inflight: Int | None = None
    sample_queue: SampleQueueState | None = None
    degraded_reasons: tuple[Text, ...] | None = None

    def to_wire(self) -> JsonObject:
        out = super().to_wire()
        # The *_error fields come with their auth field and only then (null while "ok").
        for peer in ("broker", "gate"):
            if f"{peer}_auth" not in out:
                out.pop(f"{peer}_auth_error", None)
        return out

    @property
    def canary_weight(self) -> float:
        return self.config.effective_canary_weight
