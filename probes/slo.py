"""Chaos Toolkit probes that check SLOs over what the run recorded: users' requests
(the load records), the fault ledger and the broker's history.

    steady-state-hypothesis:
      probes:
        - type: probe
          name: baseline-ttft-p99
          tolerance:
            type: probe
            name: slo-met
            provider: {type: python, module: probes.slo, func: slo_met, arguments: {}}
          provider:
            type: python
            module: probes.slo
            func: baseline_ttft_p99_below
            arguments: {max_s: 1.5}

Each probe returns the SLO result of docs/ARCHITECTURE.md §7.1 — ``{"check", "measured",
"allowed", "unit", "ok", "detail"}`` — which the ``slo_met`` tolerance judges and the
report gathers. Check names are the keys of the experiment's ``gameday.slo`` where the
report knows them (``detection_s``, ``weights_applied_s``, ``rollback_s``,
``rollback_complete_s``).

Before the method (the steady-state hypothesis runs first) the run has no load records
and no fault yet: a probe then says so — ``measured`` null, ``ok`` true, ``detail.status``
``not_measured`` — and measures for real after the method. Once the run has injected a
fault, missing or empty records fail the check (fail-closed). Times are measured from the
reference fault: the canary's faulty kernel, else the run's first fault or pod kill.

These probes only read; they never change the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import requests

from gameday.faults import FaultEntry, FaultLedger
from gameday.targets import TargetError
from probes._broker import annotation_events, get_release, phase_events, release_events
from probes._context import Configuration, get_target
from probes._evidence import first_kill, load_state, read_records, reference_fault, run_ledger
from probes._result import Slo, failed_result, not_measured, result

__all__ = [
    "baseline_ttft_p99_below",
    "drifted_responses_at_most",
    "error_rate_below",
    "errors_only_in_flight_at_kill",
    "gate_sees_every_router",
    "no_canary_served_after",
    "no_trip",
    "rollback_complete_within",
    "slo_met",
    "trip_within",
    "weights_applied_within",
]

CLOCK_SLACK_S = 1.0
TRIPPED = ("tripped", "rolling_back", "rolled_back")

Secrets = dict[str, Any]


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _not_yet(check: str, allowed: float, unit: str) -> Slo:
    return not_measured(
        check,
        allowed,
        unit,
        "nothing to measure yet: no load has run and no fault was injected in "
        "this experiment (the hypothesis before the method); measured after the method",
    )


def _before_anything(configuration: Configuration | None, book: FaultLedger) -> bool:
    return load_state(configuration) is None and reference_fault(book) is None


def _records(
    configuration: Configuration | None, check: str, allowed: float, unit: str
) -> pd.DataFrame | Slo:
    """The run's load records, or the SLO result that says why there are none."""
    state = load_state(configuration)
    if state is None:
        if reference_fault(run_ledger(configuration)) is None:
            return _not_yet(check, allowed, unit)
        return failed_result(
            check,
            allowed,
            unit,
            "no load ran in this experiment although it injected a fault: add the "
            "probes.load control to the experiment",
        )
    if state.get("state") != "stopped":
        return failed_result(
            check,
            allowed,
            unit,
            f"the load is {state.get('state')!r}, not stopped: its records are not complete "
            f"({state.get('error') or 'no error recorded'})",
        )
    path = state.get("records")
    try:
        frame = read_records(str(path))
    except Exception as exc:  # any unreadable file is a failed check, never a crash
        return failed_result(
            check, allowed, unit, f"cannot read the load records {path}: {exc}", records=path
        )
    if frame.empty:
        return failed_result(check, allowed, unit, "the load records have no rows", records=path)
    return frame


def _fault_detail(fault: FaultEntry) -> dict[str, Any]:
    return {
        "fault": {
            "kind": fault.kind,
            "component": fault.component,
            "time": fault.time,
            "params": fault.params,
        }
    }


def slo_met(
    value: Slo | None = None,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> bool:
    """Tolerance: the SLO result's ``ok`` is true."""
    return bool(isinstance(value, dict) and value.get("ok") is True)


def baseline_ttft_p99_below(
    max_s: float,
    min_requests: int = 20,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """p99 time to first token of successful baseline-served requests is at most
    ``max_s`` (over at least ``min_requests`` requests)."""
    check, allowed = "baseline_ttft_p99_s", float(max_s)
    frame = _records(configuration, check, allowed, "s")
    if isinstance(frame, dict):
        return frame
    base = frame[(frame["served_by"] == "baseline") & frame["ok"] & frame["ttft_s"].notna()]
    n = len(base)
    if n < int(min_requests):
        return failed_result(
            check,
            allowed,
            "s",
            f"only {n} successful baseline requests, fewer than the {int(min_requests)} a "
            "p99 needs: raise the load or its duration",
            requests=n,
        )
    ttft = base["ttft_s"].to_numpy(dtype=float)
    p99 = float(np.quantile(ttft, 0.99))
    return result(
        check,
        p99,
        allowed,
        "s",
        p99 <= allowed,
        requests=n,
        p50_s=round(float(np.quantile(ttft, 0.5)), 6),
        max_s=round(float(ttft.max()), 6),
    )


def error_rate_below(
    max_ratio: float,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The share of failed requests (any variant) is at most ``max_ratio`` (0 means no
    failed request at all)."""
    check, allowed = "error_rate", float(max_ratio)
    frame = _records(configuration, check, allowed, "ratio")
    if isinstance(frame, dict):
        return frame
    failed = frame[~frame["ok"]]
    ratio = len(failed) / len(frame)
    kinds = failed["error_kind"].fillna("unknown").astype(str).value_counts().to_dict()
    variants = failed["served_by"].replace("", "unknown").value_counts().to_dict()
    return result(
        check,
        ratio,
        allowed,
        "ratio",
        ratio <= allowed,
        requests=len(frame),
        failed=len(failed),
        by_error_kind={str(k): int(v) for k, v in kinds.items()},
        by_variant={str(k): int(v) for k, v in variants.items()},
    )


def no_canary_served_after(
    max_s: float,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """No canary-served request started later than ``max_s`` seconds after the
    reference fault (the rollback, as users feel it)."""
    check, allowed = "rollback_s", float(max_s)
    frame = _records(configuration, check, allowed, "s")
    if isinstance(frame, dict):
        return frame
    fault = reference_fault(run_ledger(configuration))
    if fault is None:
        return failed_result(check, allowed, "s", "no fault in this run's ledger to measure from")
    canary = frame[(frame["served_by"] == "canary") & (frame["start_time"] >= fault.time)]
    last = float(canary["start_time"].max()) - fault.time if len(canary) else 0.0
    return result(
        check,
        last,
        allowed,
        "s",
        last <= allowed,
        canary_requests_after_fault=len(canary),
        canary_requests_total=int((frame["served_by"] == "canary").sum()),
        **_fault_detail(fault),
    )


def drifted_responses_at_most(
    max_count: int,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """At most ``max_count`` canary-served requests were exposed to the faulty kernel:
    started after it was injected, with a prompt at or above its token threshold."""
    check, allowed = "drifted_responses", float(max_count)
    frame = _records(configuration, check, allowed, "count")
    if isinstance(frame, dict):
        return frame
    kernel = run_ledger(configuration).first(action="inject", kind="kernel")
    if kernel is None:
        return failed_result(
            check, allowed, "count", "no kernel fault in this run's ledger: nothing to count"
        )
    threshold = int(kernel.params.get("min_prompt_tokens", 0))
    exposed = frame[
        (frame["served_by"] == "canary")
        & (frame["start_time"] >= kernel.time)
        & (frame["tokens"] >= threshold)
    ]
    count = len(exposed)
    return result(
        check,
        float(count),
        allowed,
        "count",
        count <= allowed,
        min_prompt_tokens=threshold,
        failed_among_them=int((~exposed["ok"]).sum()),
        **_fault_detail(kernel),
    )


def errors_only_in_flight_at_kill(
    grace_s: float = 1.0,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """Every failed request was in flight when the pod was killed (started before the
    kill, or within ``grace_s`` after it on a stale connection, and not finished before
    it). Measured: the failed requests the kill does not explain; allowed: 0."""
    check, allowed = "errors_not_in_flight_at_kill", 0.0
    frame = _records(configuration, check, allowed, "count")
    if isinstance(frame, dict):
        return frame
    kill = first_kill(run_ledger(configuration))
    if kill is None:
        return failed_result(check, allowed, "count", "no pod kill in this run's ledger")
    failed = frame[~frame["ok"]]
    start = failed["start_time"].to_numpy(dtype=float)
    end = start + failed["e2e_s"].fillna(np.inf).to_numpy(dtype=float)
    in_flight = (start <= kill.time + float(grace_s)) & (end >= kill.time - 0.05)
    unexplained = failed[~in_flight]
    return result(
        check,
        float(len(unexplained)),
        allowed,
        "count",
        len(unexplained) == 0,
        failed=len(failed),
        in_flight_at_kill=int(in_flight.sum()),
        kill={"replica": kill.replica, "time": kill.time},
        unexplained_start_times=[
            round(float(t) - kill.time, 3) for t in unexplained["start_time"].sort_values().head(10)
        ],
    )


def _event_time(event: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    return float(event["time"]), {}


def _broker_milestone(
    configuration: Configuration | None,
    check: str,
    max_s: float,
    what: str,
    find: Any,
    time_of: Callable[[dict[str, Any]], tuple[float, dict[str, Any]]] = _event_time,
) -> Slo:
    """``find(events, since)`` picks the event; ``time_of(event)`` says when the milestone
    happened (the event's own time unless the event records an earlier, truer one) and
    what the detail should say about it."""
    allowed = float(max_s)
    book = run_ledger(configuration)
    if _before_anything(configuration, book):
        return _not_yet(check, allowed, "s")
    fault = reference_fault(book)
    if fault is None:
        return failed_result(check, allowed, "s", "no fault in this run's ledger to measure from")
    try:
        target = get_target(configuration)
        events = release_events(target)
    except (TargetError, Exception) as exc:  # the check fails; it never crashes
        return failed_result(check, allowed, "s", f"cannot read the broker's history: {exc}")
    since = fault.time - CLOCK_SLACK_S
    hit = find(events, since)
    if hit is None:
        return failed_result(
            check,
            allowed,
            "s",
            f"no {what} in the release's history since the fault",
            **_fault_detail(fault),
        )
    when, about = time_of(hit)
    measured = when - fault.time
    return result(
        check,
        measured,
        allowed,
        "s",
        measured <= allowed,
        event_seq=hit.get("seq"),
        actor=hit.get("actor"),
        **about,
        **_fault_detail(fault),
    )


def trip_within(
    max_s: float,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The gate tripped the release at most ``max_s`` seconds after the fault."""

    def find(events: list[dict[str, Any]], since: float) -> dict[str, Any] | None:
        trips = phase_events(events, "tripped", since)
        return trips[0] if trips else None

    return _broker_milestone(configuration, "detection_s", max_s, "trip", find)


def _routers_applied_time(event: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """When canary weight 0 was in force at every live router, from the rollback
    executor's ``routers_applied`` annotation: its ``canary_off_at`` (the latest
    ``canary_off_since`` the routers reported: when the last of them stopped sending the
    canary traffic) when present, else the annotation's own time (the executor saw every
    router at its rollback revision, its and the broker's latency included)."""
    change = event.get("change")
    change = change if isinstance(change, dict) else {}
    annotated = float(event["time"])
    off = _num(change.get("canary_off_at"))
    if off is not None:
        return off, {
            "source": "canary_off_at",
            "source_text": "routers_applied annotation: canary_off_at, the latest time a live "
            "router's effective canary weight became 0 (router heartbeats)",
            "annotation_time": annotated,
            "annotation_after_off_s": round(annotated - off, 6),
        }
    return annotated, {
        "source": "annotation_time",
        "source_text": "routers_applied annotation's own time (it has no canary_off_at: a "
        "router did not report when its canary weight became 0)",
        "annotation_time": annotated,
    }


def weights_applied_within(
    max_s: float,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """Canary weight 0 was in force at every live router at most ``max_s`` seconds after
    the fault: the rollback executor's ``routers_applied`` annotation — its ``canary_off_at``
    (when the last live router stopped sending canary traffic) when present, else its own
    time. ``detail.source`` says which (``canary_off_at`` | ``annotation_time``)."""

    def find(events: list[dict[str, Any]], since: float) -> dict[str, Any] | None:
        applied = annotation_events(events, "routers_applied", since)
        return applied[0] if applied else None

    return _broker_milestone(
        configuration,
        "weights_applied_s",
        max_s,
        "routers_applied annotation",
        find,
        _routers_applied_time,
    )


def rollback_complete_within(
    max_s: float,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The release reached ``rolled_back`` at most ``max_s`` seconds after the fault."""

    def find(events: list[dict[str, Any]], since: float) -> dict[str, Any] | None:
        done = phase_events(events, "rolled_back", since)
        return done[0] if done else None

    return _broker_milestone(configuration, "rollback_complete_s", max_s, "rolled_back phase", find)


def no_trip(
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The release was not tripped since this experiment began (its load started, or
    its first fault): measured is the number of trips, allowed 0."""
    check = "no_trip"
    book = run_ledger(configuration)
    state = load_state(configuration) or {}
    fault = reference_fault(book)
    starts = [
        t for t in (_num(state.get("started_at")), fault.time if fault else None) if t is not None
    ]
    since = min(starts) - CLOCK_SLACK_S if starts else None
    try:
        target = get_target(configuration)
        if since is None:
            # Nothing has happened in this experiment yet: only the release as it is now
            # counts (an earlier experiment's trips on a shared stack are history).
            phase = str(get_release(target).get("phase"))
            trips = [{"time": None, "seq": None, "phase": phase}] if phase in TRIPPED else []
        else:
            trips = phase_events(release_events(target), "tripped", since)
    except Exception as exc:  # the check fails; it never crashes
        return failed_result(check, 0.0, "count", f"cannot read the broker's history: {exc}")
    return result(
        check,
        float(len(trips)),
        0.0,
        "count",
        not trips,
        since=since,
        trips=[{"time": t.get("time"), "seq": t.get("seq")} for t in trips[:5]],
    )


# Router health fields that say whether its samples reach the gate (canarystack router
# /health: "gate_auth" is ok | unauthorized | forbidden).
GATE_AUTH_OK = "ok"
HEALTH_TIMEOUT_S = 3.0


def _router_blindness(health: dict[str, Any]) -> str | None:
    """Why this router's samples do not reach the gate, or None when they do."""
    auth = health.get("gate_auth")
    if isinstance(auth, dict):
        auth = auth.get("status")
    if auth is not None and auth != GATE_AUTH_OK:
        return f"its sample pushes are refused by the gate ({auth})"
    queue = health.get("sample_queue")
    error = queue.get("gate_error") if isinstance(queue, dict) else None
    if isinstance(error, str) and any(code in error for code in ("401", "403")):
        return f"its sample pushes are refused by the gate ({error})"
    return None


def gate_sees_every_router(
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The gate can see: every live router's samples reach it, and the gate is not
    ``inconclusive`` (no canary sample for its no-data timeout). Measured is the number of
    routers (plus the gate itself, when inconclusive) that leave the gate blind; allowed 0.
    A blind gate never trips, so a run without this check could pass quietly."""
    check, unit = "gate_blind", "routers"
    try:
        target = get_target(configuration)
        routers = target.replicas("router")
        gate_url = f"{target.service_url('gate')}/v1/gate/{target.release}"
    except TargetError as exc:  # the check fails; it never crashes
        return failed_result(check, 0.0, unit, f"cannot find the routers and the gate: {exc}")
    blind: dict[str, str] = {}
    unreachable: list[str] = []
    for router in routers:
        try:
            health = requests.get(f"{router.url}/health", timeout=HEALTH_TIMEOUT_S).json()
        except (requests.RequestException, ValueError):
            unreachable.append(router.name)
            continue
        why = _router_blindness(health if isinstance(health, dict) else {})
        if why is not None:
            blind[router.name] = why
    try:
        gate_state = requests.get(gate_url, timeout=HEALTH_TIMEOUT_S).json().get("state")
    except (requests.RequestException, ValueError, AttributeError) as exc:
        return failed_result(check, 0.0, unit, f"cannot read the gate's state at {gate_url}: {exc}")
    if gate_state == "inconclusive":
        blind["gate"] = "the gate is inconclusive: no canary sample for its no-data timeout"
    if not routers or len(unreachable) == len(routers):
        return failed_result(
            check, 0.0, unit, "no router answered /health: whether the gate can see is unknown"
        )
    return result(
        check,
        float(len(blind)),
        0.0,
        unit,
        not blind,
        blind=blind,
        unreachable=unreachable,
        gate_state=gate_state,
        why="; ".join(f"{k}: {v}" for k, v in blind.items()) or None,
    )
