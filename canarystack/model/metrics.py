"""The model server's Prometheus metrics, under vLLM's names with a ``model_name`` label,
so dashboards and alerts written for vLLM read the simulator unchanged.

This module must never register into the global registry: a component passes its own.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from canarystack.common.metrics import Metrics

# vLLM's buckets, with a few finer ones at the bottom where the simulator's defaults live.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort")


class ModelMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        running: Callable[[], float],
        waiting: Callable[[], float],
    ) -> None:
        m = Metrics(registry, "model_name")
        self.ttft_s = m.histogram(
            "vllm:time_to_first_token_seconds",
            "Time from receiving a request to its first token",
            buckets=TTFT_BUCKETS_S,
        ).labels(model_name=model_name)
        self.itl_s = m.histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            buckets=ITL_BUCKETS_S,
        ).labels(model_name=model_name)
        self.e2e_s = m.histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from receiving a request to its last token",
            buckets=E2E_BUCKETS_S,
        ).labels(model_name=model_name)
        success = m.counter(
            "vllm:request_success", "Finished requests, by finish reason", "finished_reason"
        )
        self.success = {
            r: success.labels(model_name=model_name, finished_reason=r) for r in FINISHED_REASONS
        }
        m.gauge("vllm:num_requests_running", "Requests holding a sequence slot").labels(
            model_name=model_name
        ).set_function(running)
        m.gauge("vllm:num_requests_waiting", "Requests queued for a sequence slot").labels(
            model_name=model_name
        ).set_function(waiting)
        self.prompt_tokens = m.counter("vllm:prompt_tokens", "Prompt tokens processed").labels(
            model_name=model_name
        )
        self.generation_tokens = m.counter("vllm:generation_tokens", "Tokens generated").labels(
            model_name=model_name
        )
