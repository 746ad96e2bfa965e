"""Chaos Toolkit activities for the hostile game day (``experiments/hostile/``).

    - type: action
      name: hostile-flood-pinned-to-the-canary
      provider:
        type: python
        module: probes.hostile
        func: flood_pinned_canary
        arguments: {duration_s: 10, rate_per_s: 20}

- ``flood_pinned_canary`` (action): sends ``gameday.hostile.CATALOGUE`` to the router,
  pinned to the canary, at a bounded rate; writes ``hostile.json`` to the run folder;
- ``hostile_input_not_5xx`` (SLO probe): how many hostile requests got a 5xx or broke
  the connection (allowed: 0);
- ``pin_canary_after_trip`` (action): sends pinned canary requests after a trip and
  writes ``pins_after_trip.json``: what answered them, and the canary's own request
  count before and after (from its ``/metrics``);
- ``pins_reach_no_canary`` (SLO probe): how many of those reached the canary (allowed: 0).

The work is in ``gameday.hostile``; these are thin adapters.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests
from chaoslib.exceptions import ActivityFailed

from gameday import hostile
from gameday.targets import Target
from probes._context import Configuration, get_target, harness_errors, positive, run_dir
from probes._result import Slo, failed_result, not_measured, result

__all__ = [
    "flood_pinned_canary",
    "hostile_input_not_5xx",
    "pin_canary_after_trip",
    "pins_reach_no_canary",
]

FLOOD_FILE = "hostile.json"
PINS_FILE = "pins_after_trip.json"
HTTP_TIMEOUT_S = 10.0
# Counted by every model server for every request its engine handled (vLLM's name).
REQUEST_COUNT_METRIC = "vllm:e2e_request_latency_seconds_count"
# Requests the canary is still working on (vLLM's names): drained before counting.
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
DRAIN_WAIT_S = 15.0
Secrets = dict[str, Any]


def _write(configuration: Configuration | None, name: str, data: dict[str, Any]) -> Path:
    path = run_dir(configuration) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    return path


def _read(configuration: Configuration | None, name: str) -> dict[str, Any] | None:
    path = run_dir(configuration) / name
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def flood_pinned_canary(
    duration_s: float = 10.0,
    rate_per_s: float = 20.0,
    max_requests: int = 2_000,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> dict[str, Any]:
    """Flood the router with hostile client input pinned to the canary; returns the
    statuses per input (also in ``hostile.json``). Never raises for what came back: the
    SLO probe ``hostile_input_not_5xx`` judges it."""
    duration = positive("duration_s", duration_s, 600.0)
    rate = positive("rate_per_s", rate_per_s, 500.0)
    count = int(positive("max_requests", max_requests, 100_000))
    with harness_errors("flooding the router with hostile input"):
        target = get_target(configuration)
        url = target.service_url("router")
    started = time.time()
    res = hostile.flood(url, duration_s=duration, rate_per_s=rate, max_requests=count)
    out = {"started_at": started, "router": url, "pin": "canary", **res.to_json()}
    _write(configuration, FLOOD_FILE, out)
    return out


def hostile_input_not_5xx(
    configuration: Configuration | None = None, secrets: Secrets | None = None
) -> Slo:
    """SLO: no hostile request got a 5xx or a broken connection (allowed 0)."""
    check, unit = "hostile_server_errors", "requests"
    data = _read(configuration, FLOOD_FILE)
    if data is None:
        return not_measured(check, 0, unit, "no hostile flood has run yet in this experiment")
    sent = int(data.get("sent") or 0)
    if sent == 0:
        return failed_result(check, 0, unit, "the hostile flood sent nothing")
    bad = data.get("server_errors") or []
    counted = sum(
        n
        for counts in (data.get("by_input") or {}).values()
        for status, n in counts.items()
        if status == "connection_failed" or status.startswith("5")
    )
    return result(
        check,
        counted,
        0,
        unit,
        counted == 0,
        sent=sent,
        by_input=data.get("by_input"),
        first_server_errors=bad[:5],
    )


def _canary_metric(target: Target, names: tuple[str, ...]) -> float:
    """Sum of the canary replicas' samples of these metrics (from their /metrics)."""
    total = 0.0
    for replica in target.replicas("model-canary"):
        text = requests.get(f"{replica.url}/metrics", timeout=HTTP_TIMEOUT_S).text
        for line in text.splitlines():
            if line.startswith(names):
                total += float(line.rsplit(" ", 1)[-1])
    return total


def _canary_request_count(target: Target) -> float:
    """The canary replicas' engine request counters, once nothing is in flight there: a
    request that started before the trip and finishes later must not count as a pin
    that reached the canary (waits at most DRAIN_WAIT_S)."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    while _canary_metric(target, IN_FLIGHT_METRICS) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return _canary_metric(target, (REQUEST_COUNT_METRIC,))


def pin_canary_after_trip(
    count: int = 20,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> dict[str, Any]:
    """Send ``count`` well-formed requests pinned to the canary; record who answered."""
    n = int(positive("count", count, 1_000))
    with harness_errors("pinning requests to the canary"):
        target = get_target(configuration)
        url = target.service_url("router") + "/v1/completions"
        try:
            before = _canary_request_count(target)
        except (requests.RequestException, ValueError) as exc:
            raise ActivityFailed(f"reading the canary's /metrics failed: {exc}") from None
        answers: list[dict[str, Any]] = []
        with requests.Session() as session:
            for i in range(n):
                body = {"model": hostile.MODEL, "prompt": f"pinned {i}", "max_tokens": 4}
                try:
                    resp = session.post(
                        url,
                        json=body,
                        headers={hostile.PIN_HEADER: "canary"},
                        timeout=HTTP_TIMEOUT_S,
                    )
                except requests.RequestException as exc:
                    answers.append({"status": None, "error": type(exc).__name__})
                    continue
                code = None
                try:
                    code = (resp.json().get("error") or {}).get("code")
                except (ValueError, AttributeError):
                    pass
                answers.append(
                    {
                        "status": resp.status_code,
                        "served_by": resp.headers.get("x-served-by"),
                        "code": code,
                    }
                )
        # The canary's counter moves when a request finishes; let one in flight land.
        time.sleep(0.5)
        try:
            after = _canary_request_count(target)
        except (requests.RequestException, ValueError) as exc:
            raise ActivityFailed(f"reading the canary's /metrics failed: {exc}") from None
    out = {
        "sent": n,
        "answers": answers,
        "canary_requests_before": before,
        "canary_requests_after": after,
    }
    _write(configuration, PINS_FILE, out)
    return out


def pins_reach_no_canary(
    configuration: Configuration | None = None, secrets: Secrets | None = None
) -> Slo:
    """SLO: after a trip, no pinned request reached the canary (allowed 0): none was
    answered by it (``x-served-by``) and its own request counter did not move."""
    check, unit = "pinned_requests_on_tripped_canary", "requests"
    data = _read(configuration, PINS_FILE)
    if data is None:
        return not_measured(check, 0, unit, "no pinned requests were sent after a trip yet")
    answers = data.get("answers") or []
    served = sum(1 for a in answers if a.get("served_by") == "canary")
    moved = float(data.get("canary_requests_after", 0)) - float(
        data.get("canary_requests_before", 0)
    )
    refused = sum(1 for a in answers if a.get("status") == 409 and a.get("code") == "canary_off")
    reached = max(served, int(moved))
    return result(
        check,
        reached,
        0,
        unit,
        reached == 0 and refused == len(answers),
        sent=len(answers),
        refused_canary_off=refused,
        served_by_canary=served,
        canary_request_counter_delta=moved,
    )
