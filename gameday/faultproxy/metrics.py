"""The fault proxy's own metrics (``GET /admin/metrics``, Prometheus text), in a registry
per app so a test builds a fresh one and reads values back. The upstream's ``/metrics`` is
passed through untouched; these never mix with it.

This module must never do I/O.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "fault_proxy_requests_total",
            "Requests the proxy took (route: completion, chat, or other for every other path)",
            ["route"],
            registry=self.registry,
        )
        self.faults_applied = Counter(
            "fault_proxy_faults_applied_total",
            "Requests a fault acted on, by fault kind",
            ["kind"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "fault_proxy_upstream_errors_total",
            "Upstream failures the proxy saw (connect: not reachable; broken: broke off an answer)",
            ["reason"],
            registry=self.registry,
        )
        self.active_faults = Gauge(
            "fault_proxy_active_faults",
            "Faults active in the proxy, by kind",
            ["kind"],
            registry=self.registry,
        )
