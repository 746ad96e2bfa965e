"""``gameday.evidence.trips``: what the gate probes (``probes.gate``) say about a trip —
how long after the fault it came, why a release that had to trip has not, and why one
that must not trip did."""

from __future__ import annotations

from canary_contract.json import JsonObject
from gameday.evidence.faults import ReferenceFault
from gameday.evidence.trips import not_tripped_yet, seconds_to_trip, unexpected_trip, wrong_test
from gameday.observers.broker import gate_line

TRIP: JsonObject = {
    "time": 112.5,
    "change": {
        "phase": {"old": "progressing", "new": "tripped"},
        "trip": {"test": "drift", "bucket": "2k-4k", "statistic": 0.31, "threshold": 0.05,
                 "samples": 48},
    },
}  # fmt: skip


def test_the_gate_line_names_its_state_comparisons_and_trip_status() -> None:
    state: JsonObject = {
        "state": "watching",
        "buckets": {"0-2k": {"comparisons": 12}, "2k-4k": {"comparisons": 0}, "odd": 3},
        "trip_status": "idle",
    }
    assert gate_line(state) == (
        "the gate is 'watching' with comparisons per bucket {'0-2k': 12, '2k-4k': 0}, "
        "trip_status 'idle'"
    )
    # An answer without buckets (or with a malformed list) still gives a line.
    for buckets in (None, [1, 2]):
        assert "per bucket {}" in gate_line({"state": "inconclusive", "buckets": buckets})


def test_the_seconds_to_the_trip_are_from_the_fault_to_its_event() -> None:
    assert seconds_to_trip(TRIP, 100.0, now=130.0) == 12.5
    # Off, but no trip event since the fault: the time it was seen off.
    assert seconds_to_trip(None, 100.0, now=103.14159) == 3.142


def test_a_trip_that_has_not_come_names_the_phase_fault_and_gate() -> None:
    fault = ReferenceFault({"time": 100.0, "kind": "kernel", "component": "model-canary"}, "why")
    why = not_tripped_yet(20, "default", "progressing", fault, now=121.04, gate="the gate is x")
    assert why == (
        "expected the gate to trip within 20 s, but release 'default' is still 'progressing' "
        "21.0 s after the kernel fault on model-canary; the gate is x"
    )


def test_an_unexpected_trip_names_the_gates_evidence_and_when() -> None:
    assert unexpected_trip("default", "progressing", None, 100.0) is None
    why = unexpected_trip("default", "tripped", TRIP, 100.0)
    assert why == (
        "expected no trip (a fault shared by both variants must not look like a bad canary), "
        "but the gate tripped release 'default' +12.50 s from the fault, on test drift, "
        "bucket 2k-4k, statistic 0.31 vs threshold 0.05, 48 samples"
    )
    # No fault to time it from: no time; a phase that keeps the canary off: the phase.
    assert "release 'default' on test drift" in str(unexpected_trip("default", "x", TRIP, None))
    off = unexpected_trip("default", "rolled_back", None, 100.0)
    assert off is not None and off.endswith("tripped release 'default' on phase is 'rolled_back'")


def test_a_trip_on_another_test_than_the_one_required_does_not_count() -> None:
    """vLLM's bad build must be caught on its answers (GAMEDAY_TRIP_TEST=drift, #28)."""
    assert wrong_test(TRIP, "drift", 12.5) is None
    assert wrong_test(TRIP, "", 12.5) is None  # nothing required: any test
    latency: JsonObject = {**TRIP, "change": {"trip": {"test": "latency", "bucket": "0-2k"}}}
    assert wrong_test(latency, "drift", 3.25) == (
        "the gate tripped 3.25 s after the fault, but on the 'latency' test, not 'drift' as "
        "this experiment requires (its trip_test, GAMEDAY_TRIP_TEST): test latency, bucket "
        "0-2k, statistic None vs threshold None, None samples"
    )
    assert "on the None test" in (wrong_test(None, "drift", 1.0) or "")
