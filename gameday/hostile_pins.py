"""Requests pinned to the canary after a trip (the hostile game day): who answered each,
and the canary's own engine request counter before and after, so a pin that reached the
canary shows even when the router does not say (``gameday.evidence.checks`` judges it).

It sends only well-formed completions through the target's router (``gameday.api``) and
reads the canary replicas' ``/metrics``.
"""

from __future__ import annotations

import time

from gameday import hostile
from gameday.api import ApiError, StackApi
from gameday.errors import GamedayError
from gameday.evidence import checks

__all__ = ["PinError", "pins_after_trip"]

# Counted by every model server for every request its engine handled (vLLM's name).
REQUEST_COUNT_METRIC = "vllm:e2e_request_latency_seconds_count"
# Requests the canary is still working on (vLLM's names): drained before counting.
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
DRAIN_WAIT_S = 15.0
# The canary's counter moves when a request finishes: time for one in flight to land.
LAND_S = 0.5


class PinError(GamedayError, ValueError):
    """The canary's ``/metrics`` cannot be read as numbers; the message is whole."""


def canary_metric(api: StackApi, names: tuple[str, ...]) -> float:
    """Sum of the canary replicas' samples of these metrics (from their /metrics)."""
    try:
        return sum(
            (
                checks.metric_total(api.metrics_text(replica.url), names)
                for replica in api.target.replicas("model-canary")
            ),
            0.0,
        )
    except ValueError as exc:
        raise PinError(f"the canary's {exc}") from None


def canary_request_count(api: StackApi) -> float:
    """The canary replicas' engine request counters, once nothing is in flight there: a
    request that started before the trip and finishes later must not count as a pin
    that reached the canary (waits at most DRAIN_WAIT_S)."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    while canary_metric(api, IN_FLIGHT_METRICS) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return canary_metric(api, (REQUEST_COUNT_METRIC,))


def pins_after_trip(api: StackApi, n: int) -> checks.PinsAfterTrip:
    """Send ``n`` well-formed requests pinned to the canary: what answered each, and the
    canary's request count before and after. ``ApiError`` when a replica cannot be read,
    ``PinError`` when its counters are not numbers."""
    before = canary_request_count(api)
    answers: list[checks.PinAnswer | checks.PinUnanswered] = []
    for i in range(n):
        model = getattr(api.target, "model_name", None) or hostile.MODEL
        body = {"model": model, "prompt": f"pinned {i}", "max_tokens": 4}
        try:
            resp = api.completion(body, {hostile.PIN_HEADER: "canary"})
        except ApiError as exc:
            answers.append({"status": None, "error": exc.cause})
            continue
        try:
            said = resp.json()
        except ValueError:
            said = None
        served = resp.headers.get("x-served-by")
        answers.append(checks.pin_answer(resp.status_code, said, served))
    time.sleep(LAND_S)
    after = canary_request_count(api)
    return {
        "sent": n,
        "answers": answers,
        "canary_requests_before": before,
        "canary_requests_after": after,
    }
