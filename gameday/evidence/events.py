"""The broker's release history: which events change the phase, which annotate.

Broker events carry changes as ``{"phase": {"old": ..., "new": ...}}`` (docs/ARCHITECTURE.md
§2), flattened keys such as ``weights.canary``, or plain ``{"phase": "tripped"}``; all
three are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

# An event as the caller holds it (decoded JSON, or a record's ``to_wire``): each function
# reads it as a mapping and hands back the caller's own objects.
EventT = TypeVar("EventT", bound=Mapping[str, object])


def new_value(change: Any, key: str) -> Any:
    """The value an event's change sets ``key`` to (None when it does not)."""
    if not isinstance(change, dict):
        return None
    if key in change:
        value = change[key]
        if isinstance(value, dict) and "new" in value and set(value) <= {"old", "new"}:
            return value["new"]
        return value
    head, _, tail = key.partition(".")
    if tail and isinstance(change.get(head), dict):
        return new_value(change[head], tail)
    return None


def event_time(event: Mapping[str, object]) -> float:
    """An event's epoch seconds (0 when it has none: it sorts first, never in a window)."""
    t = event.get("time")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else 0.0


def _since(events: Iterable[EventT], since: float | None) -> list[EventT]:
    return [e for e in events if since is None or event_time(e) >= since]


def phase_events(events: Iterable[EventT], phase: str, since: float | None = None) -> list[EventT]:
    """Events that set the release's phase to ``phase`` (at or after ``since``)."""
    return [e for e in _since(events, since) if new_value(e.get("change"), "phase") == phase]


def first_phase(events: Iterable[EventT], phase: str, since: float | None = None) -> EventT | None:
    """The first event that sets the phase to ``phase`` (at or after ``since``)."""
    found = phase_events(events, phase, since)
    return found[0] if found else None


def annotation_events(
    events: Iterable[EventT], name: str, since: float | None = None
) -> list[EventT]:
    """The harness's or an executor's annotations called ``name`` (at or after ``since``)."""
    return [
        e
        for e in _since(events, since)
        if isinstance(change := e.get("change"), dict) and change.get("annotation") == name
    ]


def trips_between(events: Iterable[Mapping[str, object]], start: float, end: float) -> int:
    """How many events inside [start, end] set the phase to ``tripped``."""
    return sum(1 for e in phase_events(events, "tripped", start) if event_time(e) <= end)


def trip_test(event: Mapping[str, object] | None) -> str | None:
    """The test a trip event names (``drift``, ``latency``, ``errors``...), or None."""
    trip = new_value(event.get("change"), "trip") if event else None
    test = trip.get("test") if isinstance(trip, dict) else None
    return test if isinstance(test, str) else None


def trip_evidence_text(event: Mapping[str, object]) -> str:
    """What a trip event says the gate saw: test, bucket, statistic vs threshold, samples."""
    trip = new_value(event.get("change"), "trip")
    if not isinstance(trip, dict):
        return "no evidence recorded"
    return (
        f"test {trip.get('test')}, bucket {trip.get('bucket')}, statistic "
        f"{trip.get('statistic')} vs threshold {trip.get('threshold')}, "
        f"{trip.get('samples')} samples"
    )
