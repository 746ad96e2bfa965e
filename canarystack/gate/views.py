"""What a ``ReleaseGate`` shows: its state and statistics as JSON (``GET /v1/gate/{release}``),
its noise floors, and its false-alarm budget against the sample rate it sees (with
``--test release-eprocess``: the release test's alpha, delta, weights, detectors and
frozen floors, ``canarystack.gate.release_test``).

This module must never change a gate: it only reads one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_contract.json import JsonObject

if TYPE_CHECKING:
    from canarystack.gate.state import ReleaseGate
    from canarystack.gate.stats import Detector


def noise_json(gate: ReleaseGate) -> JsonObject:
    rt = gate.release_test
    if rt is not None:
        # The release test's floors (confidence sequences, frozen per release), in the
        # same keys, so a reader of the default test's floor reads these.
        return {name: rt.floor_json(name) for name in gate.drift}
    out: JsonObject = {}
    for scope in gate.drift.values():
        kl, top1, source = gate.noise_of(scope)
        out[scope.name] = {
            "kl": round(kl, 6),
            "top1_disagreement": round(top1, 6),
            "source": source,
            # Another scope's floor (or "none": no floor at all, 0) stands in for this
            # one's: too few baseline-baseline comparisons of its own.
            "borrowed_from": None if source == scope.name else source,
            "fallback_comparisons": scope.fallbacks,
            "samples": len(scope.noise_kl),
            "kl_mean": round(scope.noise_kl.mean(), 6),
        }
    return out


def budget_json(gate: ReleaseGate) -> JsonObject:
    """The configured budget and whether the observed sample rate keeps within the
    rate it assumes (if not, the guarantee does not hold at this traffic). The release
    test assumes no rate: its guarantee holds at any."""
    out = gate.config.budget_json()
    rates = [r for _, _, d in gate.detectors() if (r := d.sample_rate_hz()) is not None]
    observed = max(rates) if rates else None
    out["observed_max_sample_rate_hz"] = round(observed, 3) if observed is not None else None
    if gate.release_test is None:
        out["within_assumed_rate"] = (
            None if observed is None else observed <= gate.config.budget_sample_rate_hz
        )
    return out


def _detector_json(gate: ReleaseGate, scope: str, test: str, det: Detector) -> JsonObject:
    """A detector's numbers: the release test's when it runs, else the e-CUSUM's."""
    rt = gate.release_test
    return rt.detectors[f"{scope}:{test}"].to_json() if rt is not None else det.to_json()


def gate_json(gate: ReleaseGate, now_mono: float) -> JsonObject:
    buckets: JsonObject = {}
    for label, b in gate.buckets.items():
        d = gate.drift[label]
        buckets[label] = {
            "comparisons": b.comparisons,
            "noise_comparisons": b.noise_comparisons,
            "outcomes": dict(b.outcomes),
            "errors_seen": dict(b.errors_seen),
            "drift": {
                "kl": _detector_json(gate, label, "drift_kl", d.kl),
                "top1_disagreement": _detector_json(gate, label, "drift_top1", d.top1),
            },
            "latency": _detector_json(gate, label, "latency", b.latency),
            "errors": _detector_json(gate, label, "errors", b.errors),
        }
    tails = {
        name: {
            "buckets": list(s.members),
            "comparisons": s.comparisons,
            "drift": {
                "kl": _detector_json(gate, name, "drift_kl", s.kl),
                "top1_disagreement": _detector_json(gate, name, "drift_top1", s.top1),
            },
        }
        for name, s in gate.drift.items()
        if len(s.members) > 1 and name in gate.tested
    }
    no_data_for = None
    since = gate.last_canary_sample_mono or gate.watch_start_mono
    if since is not None and gate.canary_live():
        no_data_for = round(now_mono - since, 3)
    return {
        "release": gate.name,
        "state": gate.state(now_mono),
        "revision": gate.revision,
        "phase": gate.phase,
        "canary_version": gate.canary_version,
        "canary_weight": gate.canary_weight,
        "buckets": buckets,
        "tails": tails,
        "noise_floor": noise_json(gate),
        "false_alarm_budget": budget_json(gate),
        "test": gate.config.test,
        "release_test": None if gate.release_test is None else gate.release_test.to_json(),
        "trip": gate.trip if gate.trip is not None else gate.broker_trip(),
        "trip_source": "gate"
        if gate.trip is not None
        else ("broker" if gate.broker_trip() is not None else None),
        "trip_status": None if gate.trip_status is None else gate.trip_status.value,
        "trip_status_reason": gate.trip_status_reason,
        "trip_revision": gate.trip_revision,
        "seconds_since_canary_sample": no_data_for,
        "samples": gate.totals.to_json(),
        "router_dropped": gate.router_dropped,
        "duplicate_batches": gate.duplicate_batches,
        "resets": gate.resets,
        "problems": gate.problems(),
    }
