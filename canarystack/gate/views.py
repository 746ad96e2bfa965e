"""What a ``ReleaseGate``'s parts show (``GET /v1/gate/{release}``): its scopes' detectors,
its noise floors, and its false-alarm budget against the sample rate it sees (with
``--test release-eprocess``: the release test's alpha, delta, weights, detectors and
frozen floors, ``canarystack.gate.release_test``). ``ReleaseGate.to_json``
(``canarystack.gate.state``) puts them together with the gate's own fields.

This module must never change a gate: it only reads the parts it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from typing import TypedDict

from canarystack.gate.config import FalseAlarmBudget, GateConfig
from canarystack.gate.release_test import ReleaseFloorJson, ReleaseTest
from canarystack.gate.scopes import BucketScope, DriftScope
from canarystack.gate.stats import Detector, ECusumJson, EProcessJson

# ``ReleaseGate.noise_of``: a scope's (kl floor, top-1 floor, the scope it came from).
NoiseOf = Callable[[DriftScope], tuple[float, float, str]]
# A detector's numbers: the release test's when it runs, else the e-CUSUM's.
DetectorJson = ECusumJson | EProcessJson


class NoiseFloorJson(TypedDict):
    """A scope's live noise floor (the default test)."""

    kl: float
    top1_disagreement: float
    source: str
    borrowed_from: str | None
    fallback_comparisons: int
    samples: int
    kl_mean: float


class DriftJson(TypedDict):
    kl: DetectorJson
    top1_disagreement: DetectorJson


class BucketJson(TypedDict):
    """A bucket's sample counts and detectors (drift from its own scope)."""

    comparisons: int
    noise_comparisons: int
    outcomes: dict[str, int]
    errors_seen: dict[str, int]
    error_surge_skips: int
    drift: DriftJson
    latency: DetectorJson
    errors: DetectorJson


class TailJson(TypedDict):
    """A tested pooled scope (a tail, ``all``): its buckets, comparisons and detectors."""

    buckets: list[str]
    comparisons: int
    drift: DriftJson


def noise_json(
    drift: Mapping[str, DriftScope], rt: ReleaseTest | None, noise_of: NoiseOf
) -> dict[str, NoiseFloorJson] | dict[str, ReleaseFloorJson]:
    if rt is not None:
        # The release test's floors (confidence sequences, frozen per release), in the
        # same keys, so a reader of the default test's floor reads these.
        return {name: rt.floor_json(name) for name in drift}
    out: dict[str, NoiseFloorJson] = {}
    for scope in drift.values():
        kl, top1, source = noise_of(scope)
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


def budget_json(
    config: GateConfig, detectors: Iterable[tuple[str, str, Detector]], rt: ReleaseTest | None
) -> FalseAlarmBudget:
    """The configured budget and whether the observed sample rate (of the running
    ``detectors``) keeps within the rate it assumes (if not, the guarantee does not hold at
    this traffic). The release test assumes no rate: its guarantee holds at any (``rt`` is
    None exactly when the configuration runs the e-CUSUM)."""
    rates = [r for _, _, d in detectors if (r := d.sample_rate_hz()) is not None]
    observed = max(rates) if rates else None
    shown = round(observed, 3) if observed is not None else None
    if rt is not None:
        release = config.release_budget()
        release["observed_max_sample_rate_hz"] = shown
        return release
    cusum = config.cusum_budget()
    cusum["observed_max_sample_rate_hz"] = shown
    cusum["within_assumed_rate"] = (
        None if observed is None else observed <= config.budget_sample_rate_hz
    )
    return cusum


def _detector_json(rt: ReleaseTest | None, scope: str, test: str, det: Detector) -> DetectorJson:
    """A detector's numbers: the release test's when it runs, else the e-CUSUM's."""
    return rt.detectors[f"{scope}:{test}"].to_json() if rt is not None else det.to_json()


def buckets_json(
    buckets: Mapping[str, BucketScope], drift: Mapping[str, DriftScope], rt: ReleaseTest | None
) -> dict[str, BucketJson]:
    """Per bucket: its sample counts and its detectors (drift from its own scope)."""
    out: dict[str, BucketJson] = {}
    for label, b in buckets.items():
        d = drift[label]
        out[label] = {
            "comparisons": b.comparisons,
            "noise_comparisons": b.noise_comparisons,
            "outcomes": dict(b.outcomes),
            "errors_seen": dict(b.errors_seen),
            "error_surge_skips": b.error_surge_skips,
            "drift": {
                "kl": _detector_json(rt, label, "drift_kl", d.kl),
                "top1_disagreement": _detector_json(rt, label, "drift_top1", d.top1),
            },
            "latency": _detector_json(rt, label, "latency", b.latency),
            "errors": _detector_json(rt, label, "errors", b.errors),
        }
    return out


def tails_json(
    drift: Mapping[str, DriftScope], tested: Set[str], rt: ReleaseTest | None
) -> dict[str, TailJson]:
    """Per tested pooled scope (a tail, ``all``): its buckets, comparisons and detectors."""
    return {
        name: {
            "buckets": list(s.members),
            "comparisons": s.comparisons,
            "drift": {
                "kl": _detector_json(rt, name, "drift_kl", s.kl),
                "top1_disagreement": _detector_json(rt, name, "drift_top1", s.top1),
            },
        }
        for name, s in drift.items()
        if len(s.members) > 1 and name in tested
    }
