"""The router's Prometheus metrics, on the component's own registry.

Names and labels are part of the router's interface (dashboards, the harness and the
game-day probes read them): never rename one.
"""

from __future__ import annotations

from typing import Any

from canarystack.common.app import Component
from canarystack.common.metrics import Metrics
from canarystack.router.snapshot import Snapshot

TTFT_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class RouterMetrics:
    def __init__(self, comp: Component) -> None:
        m = Metrics(comp.registry)
        self.requests = m.counter(
            "router_requests_total",
            "Requests answered, by variant and HTTP status",
            "variant",
            "status",
        )
        self.ttft = m.histogram(
            "router_ttft_seconds",
            "Time from request arrival to the first response byte sent, by variant",
            "variant",
            buckets=TTFT_BUCKETS_S,
        )
        self.upstream_errors = m.counter(
            "router_upstream_errors_total",
            "Upstream failures by variant and kind (connect, http_5xx, broken_stream, ...)",
            "variant",
            "kind",
        )
        self.fallbacks = m.counter(
            "router_canary_fallbacks_total",
            "Unpinned canary requests served by the baseline because the canary pool was down",
        )
        self.config_revision = m.gauge(
            "router_config_revision", "Revision of the applied release config"
        )
        self.canary_weight = m.gauge(
            "router_canary_weight_percent", "Effective canary weight applied (0 when fail-safe)"
        )
        self.config_from_cache = m.gauge(
            "router_config_from_cache", "1 while the applied config came from the on-disk cache"
        )
        self.watch_errors = m.counter(
            "router_broker_watch_errors_total", "Failed broker watch/get calls, by kind", "kind"
        )
        self.heartbeat_errors = m.counter(
            "router_broker_heartbeat_errors_total", "Failed heartbeats"
        )
        self.shadow_requests = m.counter(
            "router_shadow_requests_total",
            "Shadow copies by pair and result (ok, error, dropped_cap, ...)",
            "pair",
            "result",
        )
        self.shadow_comparisons = m.counter(
            "router_shadow_comparisons_total",
            "Comparisons computed, by pair and bucket",
            "pair",
            "bucket",
        )
        self.samples_dropped = m.counter(
            "router_samples_dropped_total",
            "Records dropped because the sample queue was full, by kind",
            "kind",
        )
        self.gate_pushes = m.counter(
            "router_gate_pushes_total", "Batch pushes to the gate, by result", "result"
        )
        self.sample_queue_len = m.gauge(
            "router_sample_queue_length", "Records waiting for the gate"
        )
        self.auth_errors = m.counter(
            "router_auth_errors_total",
            "Calls the gate or the broker refused with 401/403, by peer and status",
            "peer",
            "status",
        )
        self.canary_off_pins = m.counter(
            "router_canary_off_pins_total",
            "Requests pinned to a canary that is off, answered 409 canary_off",
        )
        self.both_failed = m.counter(
            "router_both_failed_total",
            "Error outcomes not pushed because both variants failed on the same input",
        )
        self.outcomes_skipped = m.counter(
            "router_outcomes_skipped_total",
            "Outcomes not pushed to the gate because they are no canary evidence, by reason "
            "(dependency_degraded: the answer was made without the shared dependency)",
            "reason",
        )
        self.client_stalls = m.counter(
            "router_client_stalls_total",
            "Streams cancelled because the client stopped reading (a write blocked past "
            "the client write deadline); their upstreams were released",
        )
        self.streams_refused = m.counter(
            "router_streams_refused_total",
            "Requests answered 429 above a concurrency cap, by cap (client, pool)",
            "cap",
        )
        self.gate_failsafe = m.gauge(
            "router_gate_failsafe",
            "1 while the gate dead-man switch holds the canary at 0 % (the gate has not "
            "accepted samples for --gate-deadman-s), else 0",
        )
        # Pre-bound children for the hot path (labels() is a dict lookup plus a lock).
        self._req: dict[tuple[str, int], Any] = {}
        self._ttft = {v: self.ttft.labels(variant=v) for v in ("baseline", "canary")}

    def count_request(self, variant: str, status: int) -> None:
        key = (variant, status)
        child = self._req.get(key)
        if child is None:
            child = self._req[key] = self.requests.labels(variant=variant, status=str(status))
        child.inc()

    def observe_ttft(self, variant: str, seconds: float) -> None:
        self._ttft[variant].observe(seconds)

    def on_apply(self, snap: Snapshot) -> None:
        self.config_revision.set(snap.revision)
        self.canary_weight.set(snap.weight_pct)
        self.config_from_cache.set(1 if snap.source == "cache" else 0)
