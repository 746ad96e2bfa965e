"""Declaring a component's Prometheus metrics on its own registry, one line a metric.

This module must never register into the global registry, nor rename a metric: names
are read by dashboards, probes and ``deploy/prometheus/rules.yml``.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """Declares metrics on ``registry``; each gets ``common_labels`` first, then its own
    (the model server's ``model_name``)."""

    def __init__(self, registry: CollectorRegistry, *common_labels: str) -> None:
        self.registry = registry
        self.common_labels = common_labels

    def _labels(self, labels: Sequence[str]) -> tuple[str, ...]:
        return (*self.common_labels, *labels)

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, self._labels(labels), registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, self._labels(labels), registry=self.registry)

    def histogram(
        self, name: str, documentation: str, *labels: str, buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(
            name, documentation, self._labels(labels), buckets=buckets, registry=self.registry
        )
