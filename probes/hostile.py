"""Chaos Toolkit activities for the hostile game day (``experiments/hostile/``): a flood of
hostile input pinned to the canary, pins sent after a trip, and the SLO probes that judge
them (each allows 0).

The work is in ``gameday.hostile``; these are thin adapters.
"""

from __future__ import annotations

import time

from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday import hostile
from gameday.api import ApiError, StackApi
from gameday.evidence import checks
from gameday.evidence.slo import Slo
from gameday.run.collect import read_json
from probes._context import (
    Configuration,
    Secrets,
    on_target,
    positive,
    run_dir,
    stack_api,
    write_run_json,
)

__all__ = [
    "flood_pinned_canary",
    "hostile_input_not_5xx",
    "pin_canary_after_trip",
    "pins_reach_no_canary",
]

FLOOD_FILE = "hostile.json"
PINS_FILE = "pins_after_trip.json"
# Counted by every model server for every request its engine handled (vLLM's name).
REQUEST_COUNT_METRIC = "vllm:e2e_request_latency_seconds_count"
# Requests the canary is still working on (vLLM's names): drained before counting.
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
DRAIN_WAIT_S = 15.0


def _read(configuration: Configuration | None, name: str) -> JsonObject | None:
    return read_json(run_dir(configuration) / name)


def flood_pinned_canary(
    duration_s: float = 10.0,
    rate_per_s: float = 20.0,
    max_requests: int = 2_000,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """Flood the router with hostile client input pinned to the canary; returns the
    statuses per input (also in ``hostile.json``). Never raises for what came back: the
    SLO probe ``hostile_input_not_5xx`` judges it.

    It sends ``gameday.hostile.CATALOGUE`` to the router at a bounded rate::

        - type: action
          name: hostile-flood-pinned-to-the-canary
          provider: {type: python, module: probes.hostile, func: flood_pinned_canary,
                     arguments: {duration_s: 10, rate_per_s: 20}}
    """
    duration = positive("duration_s", duration_s, 600.0)
    rate = positive("rate_per_s", rate_per_s, 500.0)
    count = int(positive("max_requests", max_requests, 100_000))
    with on_target(configuration, "flooding the router with hostile input") as target:
        url = target.service_url("router")
    started = time.time()
    res = hostile.flood(url, duration_s=duration, rate_per_s=rate, max_requests=count)
    out = {"started_at": started, "router": url, "pin": "canary", **res.to_json()}
    write_run_json(configuration, FLOOD_FILE, out)
    return out


def hostile_input_not_5xx(
    configuration: Configuration | None = None, secrets: Secrets | None = None
) -> Slo:
    """SLO: no hostile request got a 5xx or a broken connection (allowed 0)."""
    return checks.hostile_server_errors(_read(configuration, FLOOD_FILE))


def _canary_metric(api: StackApi, names: tuple[str, ...]) -> float:
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
        raise ActivityFailed(f"the canary's {exc}") from None


def _canary_request_count(api: StackApi) -> float:
    """The canary replicas' engine request counters, once nothing is in flight there: a
    request that started before the trip and finishes later must not count as a pin
    that reached the canary (waits at most DRAIN_WAIT_S)."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    while _canary_metric(api, IN_FLIGHT_METRICS) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return _canary_metric(api, (REQUEST_COUNT_METRIC,))


def pin_canary_after_trip(
    count: int = 20,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """Send ``count`` well-formed requests pinned to the canary; record who answered.

    ``pins_after_trip.json`` holds what answered them, and the canary's own request count
    before and after (from its ``/metrics``).
    """
    n = int(positive("count", count, 1_000))
    with stack_api(configuration, "pinning requests to the canary") as api:
        before = _canary_request_count(api)
        answers: list[JsonObject] = []
        for i in range(n):
            body = {"model": hostile.MODEL, "prompt": f"pinned {i}", "max_tokens": 4}
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
        # The canary's counter moves when a request finishes; let one in flight land.
        time.sleep(0.5)
        after = _canary_request_count(api)
    out = {
        "sent": n,
        "answers": answers,
        "canary_requests_before": before,
        "canary_requests_after": after,
    }
    write_run_json(configuration, PINS_FILE, out)
    return out


def pins_reach_no_canary(
    configuration: Configuration | None = None, secrets: Secrets | None = None
) -> Slo:
    """SLO: after a trip, no pinned request reached the canary (allowed 0): none was
    answered by it (``x-served-by``) and its own request counter did not move."""
    return checks.pinned_requests_on_tripped_canary(_read(configuration, PINS_FILE))
