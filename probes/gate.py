"""Chaos Toolkit probes of the canary gate: did it trip, and how long after the fault.

    - type: probe
      name: gate-trips
      provider:
        type: python
        module: probes.gate
        func: wait_for_trip
        arguments: {deadline_s: 20}

``wait_for_trip`` returns the seconds from the experiment's reference fault (the faulty
kernel, else the first fault or pod kill in the run's ledger) to the broker event that
set the phase to ``tripped``; it gives up at its deadline, because Chaos Toolkit does not
time out Python activities. ``gate_did_not_trip`` watches for a while and raises at the
first trip, with the gate's evidence. Both read the broker (and the gate's own state for
the messages); neither changes anything.
"""

from __future__ import annotations

import time
from typing import Any

import requests
from chaoslib.exceptions import ActivityFailed

from gameday.targets import Target, TargetError
from probes._broker import get_release, phase_events, release_events
from probes._context import Configuration, get_target, harness_errors
from probes._evidence import load_state, reference_fault, run_ledger

__all__ = ["gate_did_not_trip", "wait_for_trip"]

HTTP_TIMEOUT_S = 3.0
MAX_WAIT_S = 600.0
TRIPPED_PHASES = ("tripped", "rolling_back", "rolled_back")
# Broker and harness clocks are the same machine's here; allow a little skew elsewhere.
CLOCK_SLACK_S = 1.0

Secrets = dict[str, Any]


def gate_summary(target: Target) -> str:
    """One line on what the gate has seen (best effort, for failure messages)."""
    try:
        url = f"{target.service_url('gate')}/v1/gate/{target.release}"
        body = requests.get(url, timeout=HTTP_TIMEOUT_S).json()
    except (requests.RequestException, ValueError, TargetError) as exc:
        return f"the gate's state is unknown ({exc.__class__.__name__})"
    buckets = body.get("buckets") or {}
    comparisons = {name: b.get("comparisons") for name, b in buckets.items() if isinstance(b, dict)}
    return (
        f"the gate is {body.get('state')!r} with comparisons per bucket {comparisons}, "
        f"trip_status {body.get('trip_status')!r}"
    )


def _evidence_text(event: dict[str, Any]) -> str:
    change = event.get("change") or {}
    trip = change.get("trip")
    if isinstance(trip, dict) and "new" in trip:
        trip = trip["new"]
    if not isinstance(trip, dict):
        return "no evidence recorded"
    return (
        f"test {trip.get('test')}, bucket {trip.get('bucket')}, statistic "
        f"{trip.get('statistic')} vs threshold {trip.get('threshold')}, "
        f"{trip.get('samples')} samples"
    )


def wait_for_trip(
    deadline_s: float = 30.0,
    poll_s: float = 0.1,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> float:
    """Wait until the gate has tripped the release; returns the seconds from the
    reference fault to the trip. Raises after ``deadline_s`` seconds of waiting."""
    t0 = time.monotonic()
    deadline = t0 + min(max(float(deadline_s), 0.0), MAX_WAIT_S)
    with harness_errors("waiting for the gate to trip"):
        target = get_target(configuration)
        fault = reference_fault(run_ledger(configuration))
        if fault is None:
            raise ActivityFailed(
                "expected a fault in this run's ledger to time the trip from, found none: "
                "inject one (probes.faults) before waiting for the trip"
            )
        phase = "unknown"
        while True:
            try:
                phase = str(get_release(target).get("phase"))
            except ActivityFailed as exc:  # a broker being restarted: keep waiting
                phase = f"unreadable ({exc})"
            if phase in TRIPPED_PHASES:
                trips = phase_events(
                    release_events(target), "tripped", since=fault.time - CLOCK_SLACK_S
                )
                trip_time = float(trips[0]["time"]) if trips else time.time()
                return round(trip_time - fault.time, 3)
            if time.monotonic() >= deadline:
                raise ActivityFailed(
                    f"expected the gate to trip within {float(deadline_s):g} s, but release "
                    f"{target.release!r} is still {phase!r} "
                    f"{time.time() - fault.time:.1f} s after the {fault.kind} fault on "
                    f"{fault.component}; {gate_summary(target)}"
                )
            time.sleep(max(0.02, float(poll_s)))


def gate_did_not_trip(
    observe_s: float = 0.0,
    poll_s: float = 0.5,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> bool:
    """True when the release stayed untripped for ``observe_s`` seconds (and no trip
    happened since the experiment's load started); raises at the first trip."""
    end = time.monotonic() + min(max(float(observe_s), 0.0), MAX_WAIT_S)
    with harness_errors("watching the gate"):
        target = get_target(configuration)
        state = load_state(configuration) or {}
        fault = reference_fault(run_ledger(configuration))
        since_values = [
            t
            for t in (state.get("started_at"), fault.time if fault else None)
            if isinstance(t, int | float)
        ]
        since = min(since_values) - CLOCK_SLACK_S if since_values else None
        while True:
            release = get_release(target)
            trips = phase_events(release_events(target), "tripped", since=since)
            phase = str(release.get("phase"))
            if trips or phase in TRIPPED_PHASES:
                when = ""
                if trips and fault is not None:
                    when = f" {float(trips[0]['time']) - fault.time:+.2f} s from the fault,"
                evidence = _evidence_text(trips[0]) if trips else f"phase is {phase!r}"
                raise ActivityFailed(
                    "expected no trip (a fault shared by both variants must not look like a "
                    f"bad canary), but the gate tripped release {target.release!r}{when} "
                    f"on {evidence}"
                )
            if time.monotonic() >= end:
                return True
            time.sleep(max(0.05, float(poll_s)))
