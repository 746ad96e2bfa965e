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

from canarystack.judge.answers import VERDICTS

if TYPE_CHECKING:
    from canarystack.judge.service import Judge


# name -> (help, labels) of every gauge the collector yields, in order.
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "canary_judge_verdict": (
        "1 for the release's current verdict (pass, fail, inconclusive)",
        ("release", "verdict"),
    ),
    "canary_judge_release_comparisons": (
        "Baseline-canary comparisons the release's verdict rests on",
        ("release",),
    ),
    "canary_judge_drift_kl": (
        "Mean KL (nats, clipped) of the last baseline-canary comparisons per bucket",
        ("release", "bucket"),
    ),
    "canary_judge_drift_top1_disagreement": (
        "Mean top-1 disagreement of the last baseline-canary comparisons per bucket",
        ("release", "bucket"),
    ),
    "canary_judge_e_value": (
        "Each detector's statistic (e-CUSUM, or the release e-process' wealth) per release, "
        "scope (bucket or tail) and test",
        ("release", "scope", "test"),
    ),
    "canary_judge_e_threshold": (
        "The statistic at which each detector trips the release",
        ("release", "scope", "test"),
    ),
    "canary_judge_queue_depth": ("Judged requests waiting for a worker", ()),
    "canary_judge_inflight": ("Comparisons whose engine answers are awaited", ()),
}


class JudgeCollector(Collector):
    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    def collect(self) -> Iterator[Metric]:
        j = self.judge
        g = {
            name: GaugeMetricFamily(name, doc, labels=list(labels))
            for name, (doc, labels) in GAUGES.items()
        }
        for name, gate in j.gates.items():
            answer = j.verdict(name)
            for v in VERDICTS:
                g["canary_judge_verdict"].add_metric([name, v], float(answer["verdict"] == v))
            g["canary_judge_release_comparisons"].add_metric([name], float(answer["comparisons"]))
            for bucket, d in j.drift[name].items():
                g["canary_judge_drift_kl"].add_metric([name, bucket], d.kl.mean())
                g["canary_judge_drift_top1_disagreement"].add_metric(
                    [name, bucket], d.top1_disagreement.mean()
                )
            for scope, test, det in gate.detectors():
                g["canary_judge_e_value"].add_metric([name, scope, test], det.statistic)
                g["canary_judge_e_threshold"].add_metric([name, scope, test], det.threshold)
        g["canary_judge_queue_depth"].add_metric([], j.queue.qsize())
        g["canary_judge_inflight"].add_metric([], j.inflight)
        yield from g.values()
