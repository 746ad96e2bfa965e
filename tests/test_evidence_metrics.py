"""``gameday.evidence.checks.metric_total``: the canary's engine counters as the hostile
pin probe reads them from its ``/metrics``."""

from __future__ import annotations

import pytest

from gameday.evidence.checks import metric_total

TEXT = """# HELP vllm:num_requests_running Requests running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model="m"} 2.0
vllm:num_requests_waiting{model="m"} 1
vllm:e2e_request_latency_seconds_count{model="m"} 17.0
vllm:e2e_request_latency_seconds_count{model="n"} 3
vllm:e2e_request_latency_seconds_sum{model="m"} 4.5
"""


def test_every_label_set_of_the_named_metrics_is_summed_and_nothing_else() -> None:
    running = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    assert metric_total(TEXT, running) == 3.0
    assert metric_total(TEXT, ("vllm:e2e_request_latency_seconds_count",)) == 20.0
    assert metric_total(TEXT, ("vllm:absent",)) == 0.0


def test_a_sample_line_without_a_number_is_named() -> None:
    with pytest.raises(ValueError, match="vllm:num_requests_running 12abc"):
        metric_total("vllm:num_requests_running 12abc\n", ("vllm:num_requests_running",))
