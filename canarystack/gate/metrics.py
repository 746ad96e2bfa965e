"""The gate's scrape-time metrics: per scope and test the e-CUSUM statistic and threshold,
samples per bucket, noise floors, the false-alarm budget, the state and the reasons the
gate is degraded, read from the gates when ``/metrics`` is scraped.

This module must never change a gate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from canarystack.gate.state import STATES, ReleaseGate


class GateSource(Protocol):
    """What the collector reads of the gate service (``canarystack.gate.service``'s
    ``GateService``, which registers it): its gates and why its health is degraded."""

    @property
    def gates(self) -> Mapping[str, ReleaseGate]: ...
    def degraded_reasons(self) -> list[str]: ...


class GateCollector(Collector):
    """Reads the gates' current statistics at scrape time."""

    def __init__(self, service: GateSource) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        stat = GaugeMetricFamily(
            "canarystack_gate_statistic",
            "e-CUSUM statistic per release, scope (bucket or tail) and test",
            labels=["release", "scope", "test"],
        )
        thr = GaugeMetricFamily(
            "canarystack_gate_threshold",
            "Alarm threshold of each test (e-CUSUM: average run length bound, samples; "
            "release test: the wealth that trips the release alone)",
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
        degraded = GaugeMetricFamily(
            "canarystack_gate_degraded",
            "1 for each reason the gate's health is degraded now",
            labels=["reason"],
        )
        fallbacks = CounterMetricFamily(
            "canarystack_gate_noise_floor_fallbacks",
            "Comparisons tested against a noise floor borrowed from another scope "
            "(source: the scope it came from, or none), per release and scope",
            labels=["release", "scope", "source"],
        )
        budget = GaugeMetricFamily(
            "canarystack_gate_false_trips_per_release_hour",
            "False-alarm budget the thresholds guarantee (union bound, at the assumed rate)",
            labels=["release"],
        )
        release_stat = GaugeMetricFamily(
            "canarystack_gate_release_statistic",
            "--test release-eprocess: the release's weighted average of e-processes (it "
            "trips at 1/alpha)",
            labels=["release"],
        )
        release_level = GaugeMetricFamily(
            "canarystack_gate_false_trip_probability_per_release",
            "--test release-eprocess: the stated bound on P(any false trip during the "
            "release), alpha + the floors' delta",
            labels=["release"],
        )
        for reason in self.service.degraded_reasons():
            degraded.add_metric([reason], 1.0)
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
                bucket_samples.add_metric(
                    [name, label, "canary_outcomes_untested_error_surge"], b.error_surge_skips
                )
            for scope, floor in gate.noise_json().items():
                # A release test's floor that is not finite reads null: NaN here.
                kl, top1 = floor["kl"], floor["top1_disagreement"]
                noise.add_metric([name, scope, "kl"], math.nan if kl is None else kl)
                noise.add_metric(
                    [name, scope, "top1_disagreement"], math.nan if top1 is None else top1
                )
            for (scope, source), count in gate.noise_fallbacks.items():
                fallbacks.add_metric([name, scope, source], count)
            rt = gate.release_test
            if rt is None:
                budget.add_metric(
                    [name], gate.config.cusum_budget()["false_trips_per_release_hour"]
                )
            else:
                release_stat.add_metric([name], rt.statistic())
                release_level.add_metric([name], gate.config.alpha + gate.config.floor_delta)
            current = gate.state(now)
            for s in STATES:
                state.add_metric([name, s], 1.0 if s == current else 0.0)
        yield from (stat, thr, n, bucket_samples, noise, fallbacks, budget, state, degraded)
        yield from (release_stat, release_level)
