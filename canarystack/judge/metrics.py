"""The judge's scrape-time metrics, read from its gates when ``/metrics`` is scraped: the
verdict per release, the recent drift per release and bucket, the e-value of every
detector against its threshold, and the queue in front of the engines. Prometheus rules
over them: ``deploy/judge/rules.yml``.

This module must never change a gate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from canarystack.judge.verdict import VERDICTS

if TYPE_CHECKING:
    from canarystack.judge.service import Judge


class JudgeCollector(Collector):
    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    def collect(self) -> Iterator[Metric]:
        j = self.judge
        verdict = GaugeMetricFamily(
            "canary_judge_verdict",
            "1 for the release's current verdict (pass, fail, inconclusive)",
            labels=["release", "verdict"],
        )
        comparisons = GaugeMetricFamily(
            "canary_judge_release_comparisons",
            "Baseline-canary comparisons the release's verdict rests on",
            labels=["release"],
        )
        kl = GaugeMetricFamily(
            "canary_judge_drift_kl",
            "Mean KL (nats, clipped) of the last baseline-canary comparisons per bucket",
            labels=["release", "bucket"],
        )
        top1 = GaugeMetricFamily(
            "canary_judge_drift_top1_disagreement",
            "Mean top-1 disagreement of the last baseline-canary comparisons per bucket",
            labels=["release", "bucket"],
        )
        e_value = GaugeMetricFamily(
            "canary_judge_e_value",
            "Each detector's statistic (e-CUSUM, or the release e-process' wealth) per "
            "release, scope (bucket or tail) and test",
            labels=["release", "scope", "test"],
        )
        threshold = GaugeMetricFamily(
            "canary_judge_e_threshold",
            "The statistic at which each detector trips the release",
            labels=["release", "scope", "test"],
        )
        queue = GaugeMetricFamily(
            "canary_judge_queue_depth", "Judged requests waiting for a worker"
        )
        inflight = GaugeMetricFamily(
            "canary_judge_inflight", "Comparisons whose engine answers are awaited"
        )
        for name, gate in j.gates.items():
            answer = j.verdict(name)
            for v in VERDICTS:
                verdict.add_metric([name, v], 1.0 if answer["verdict"] == v else 0.0)
            comparisons.add_metric([name], float(answer["comparisons"]))
            for bucket, d in j.drift[name].items():
                kl.add_metric([name, bucket], d.kl.mean())
                top1.add_metric([name, bucket], d.top1_disagreement.mean())
            for scope, test, det in gate.detectors():
                e_value.add_metric([name, scope, test], det.statistic)
                threshold.add_metric([name, scope, test], det.threshold)
        queue.add_metric([], j.queue.qsize())
        inflight.add_metric([], j.inflight)
        yield from (verdict, comparisons, kl, top1, e_value, threshold, queue, inflight)
