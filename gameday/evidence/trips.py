"""The gate's trip as the gate probes judge it: how long after the fault the release
tripped, why a release that had to trip did not (yet), and why one that must not trip did.

Pure: the broker's events and phase and the gate's state in, figures and sentences out
(``probes.gate`` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping

from canary_contract.phases import is_canary_off
from gameday.evidence.events import event_time, trip_evidence_text, trip_test
from gameday.evidence.faults import ReferenceFault


def seconds_to_trip(trip: Mapping[str, object] | None, fault_time: float, now: float) -> float:
    """Seconds from the fault to the event that tripped the release, to the millisecond
    (to ``now`` when the release is off but its history holds no trip since the fault)."""
    trip_time = event_time(trip) if trip else now
    return round(trip_time - fault_time, 3)


def wrong_test(trip: Mapping[str, object] | None, test: str, took: float) -> str | None:
    """Why a trip ``took`` seconds after the fault does not count when the experiment
    requires the ``test`` (e.g. ``drift``: a bad build caught on its answers, not on
    latency by luck); None when it counts or nothing is required."""
    if not test:
        return None
    tripped_on = trip_test(trip)
    if tripped_on == test:
        return None
    return (
        f"the gate tripped {took:g} s after the fault, but on the {tripped_on!r} test, not "
        f"{test!r} as this experiment requires (its trip_test, GAMEDAY_TRIP_TEST): "
        f"{trip_evidence_text(trip) if trip else 'no trip event since the fault'}"
    )


def not_tripped_yet(
    deadline_s: float, release: str, phase: str, fault: ReferenceFault, now: float, gate: str
) -> str:
    """Why a release that had to trip within ``deadline_s`` has not: its phase ``now``,
    the fault it had to trip on and ``gate`` (``GateObserver.summary``, or why there is none)."""
    return (
        f"expected the gate to trip within {float(deadline_s):g} s, but release "
        f"{release!r} is still {phase!r} {now - fault.time:.1f} s "
        f"after the {fault.entry['kind']} fault on {fault.entry['component']}; {gate}"
    )


def unexpected_trip(
    release: str, phase: str, trip: Mapping[str, object] | None, fault_time: float | None
) -> str | None:
    """Why a release that must not trip did (None: it did not): ``trip``, the first trip
    event since the experiment began, named with the gate's evidence (and its time from
    the fault, when there was one), or a ``phase`` that keeps the canary off."""
    if not trip and not is_canary_off(phase):
        return None
    when = ""
    if trip and fault_time is not None:
        when = f" {event_time(trip) - fault_time:+.2f} s from the fault,"
    evidence = trip_evidence_text(trip) if trip else f"phase is {phase!r}"
    return (
        "expected no trip (a fault shared by both variants must not look like a "
        f"bad canary), but the gate tripped release {release!r}{when} on {evidence}"
    )
