"""The judge's answers, in the shapes release engines read (docs/drift-judge.md):

- the verdict of a release (``verdict_json``): ``pass``, ``fail`` or ``inconclusive``,
  with the statistic, the bucket and the samples behind it: what an Argo Rollouts
  ``web`` metric reads with ``jsonPath: "{$.verdict}"`` and ``successCondition: result ==
  "pass"`` (``GET /v1/analysis/<release>``);
- a Flagger webhook's answer (``flagger_status``): 200 to let the canary advance, 412
  (any non-2xx halts it and counts a failed check) for ``fail`` and, unless the webhook's
  metadata says ``inconclusive: pass``, for ``inconclusive``; a 412 is the stack's error
  shape (``error.code`` ``canary_fail`` or ``canary_inconclusive``) with the verdict's
  fields beside it.

Verdicts:

- ``fail``: the release's gate tripped (drift, latency or errors beyond the noise floor,
  the gate's own statistics and thresholds); it stays ``fail`` until the canary's version
  changes or an operator resets it;
- ``inconclusive``: the judge cannot vouch for the canary yet: fewer than
  ``min_comparisons`` baseline-canary comparisons, or none for the gate's
  ``no_data_timeout_s`` (the mirror or an engine stopped);
- ``pass``: enough comparisons, recent ones, and no trip.

This module must never do I/O or read a clock: callers pass ``now`` in.
"""

from __future__ import annotations

import math
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from canary_contract.broker import Release, TripRecord
from canarystack.gate import state
from canarystack.gate.state import ReleaseGate

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS = (PASS, FAIL, INCONCLUSIVE)
# Flagger: 2xx advances the canary; any other status halts it and counts a failed check.
FLAGGER_FAIL_STATUS = 412


def release_record(name: str, revision: int, stable: str, canary: str) -> Release:
    """The release a broker would show for what the judge sees: progressing, these
    versions (the judge compares every mirrored prompt, whatever the traffic split)."""
    return state.release_record(name, revision, stable, canary, 50)


def _progress(statistic: float, threshold: float) -> float:
    """How far a detector is towards its threshold, on the log scale (1 = alarm)."""
    if not (statistic > 1 and threshold > 1 and math.isfinite(statistic)):
        return 0.0
    return math.log(statistic) / math.log(threshold)


class Strongest(TypedDict):
    """The detector closest to its threshold (``strongest``)."""

    scope: str
    test: str
    statistic: float | None
    threshold: float | None
    samples: int


class DriftMeans(TypedDict):
    """A bucket's recent baseline-canary divergence (the judge's gauges)."""

    kl_mean: float
    top1_disagreement: float


class Scoring(TypedDict):
    """How a release's comparisons are scored (``mode``) and why not teacher-forced."""

    mode: Literal["teacher-forced", "free"]
    why: str | None


class Verdict(TypedDict):
    """``GET /v1/analysis/{release}``: the verdict and the evidence behind it."""

    release: str
    stable_version: str | None
    canary_version: str | None
    comparisons: int
    noise_comparisons: int
    min_comparisons: int
    test: str | None
    bucket: str | None
    statistic: float | None
    threshold: float | None
    samples: int | None
    strongest: Strongest | None
    drift: dict[str, DriftMeans]
    scoring: Scoring | None
    trip: TripRecord | None
    verdict: str
    reason: str


class FlaggerCanary(TypedDict):
    """The canary Flagger asked about (its webhook payload's)."""

    name: str
    namespace: str
    phase: str | None


class FlaggerVerdict(Verdict):
    """The Flagger webhook's answer: the verdict and the canary that asked."""

    flagger: FlaggerCanary


def strongest(gate: ReleaseGate) -> Strongest | None:
    """The detector closest to its threshold: its scope, test, statistic (the e-value),
    threshold and samples (None before any detector has a sample)."""
    best: tuple[float, int, Strongest] | None = None
    for scope, test, det in gate.detectors():
        if det.samples == 0:
            continue
        key = (_progress(det.statistic, det.threshold), det.samples)
        entry: Strongest = {
            "scope": scope,
            "test": test,
            "statistic": _r(det.statistic),
            "threshold": _r(det.threshold),
            "samples": det.samples,
        }
        if best is None or key > best[:2]:
            best = (*key, entry)
    return None if best is None else best[2]


def _r(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def _decision(
    gate: ReleaseGate,
    now_mono: float,
    comparisons: int,
    min_comparisons: int,
    top: Strongest | None,
) -> tuple[str, str]:
    """(verdict, reason) of a gate that has not tripped."""
    if comparisons < min_comparisons:
        return INCONCLUSIVE, (
            f"{comparisons} baseline-canary comparisons so far, fewer than the "
            f"{min_comparisons} a verdict needs: mirror more traffic to the judge, or wait"
        )
    if gate.check_no_data(now_mono):
        return INCONCLUSIVE, (
            f"no baseline-canary comparison for {gate.config.no_data_timeout_s:g} s: is the "
            "mirror still sending, and do both engines answer?"
        )
    return PASS, (
        f"{comparisons} comparisons, no test tripped (strongest: "
        f"{top['test'] if top else '-'} in {top['scope'] if top else '-'})"
    )


def verdict_json(
    gate: ReleaseGate,
    now_mono: float,
    min_comparisons: int,
    drift: dict[str, DriftMeans],
    scoring: Scoring | None = None,
) -> Verdict:
    """The release's verdict with the evidence behind it (module docstring); ``scoring``:
    how its comparisons are scored (``mode``) and why not teacher-forced (``why``)."""
    # Since the canary version was set (or the last reset): the buckets start afresh.
    comparisons = sum(b.comparisons for b in gate.buckets.values())
    top = strongest(gate)
    trip = gate.trip
    # What the verdict names: the trip's test, else the strongest detector (or nothing).
    named: tuple[str | None, str | None, float | None, float | None, int | None]
    if trip is not None:
        named = (
            trip["test"],
            trip["bucket"],
            trip["statistic"],
            trip["threshold"],
            trip["samples"],
        )
        decided = (
            FAIL,
            (
                f"the {trip['test']} test tripped in bucket {trip['bucket']}: "
                f"statistic {trip['statistic']} reached {trip['threshold']} over "
                f"{trip['samples']} samples"
            ),
        )
    else:
        named = (None, None, None, None, None)
        if top is not None:
            named = (top["test"], top["scope"], top["statistic"], top["threshold"], top["samples"])
        decided = _decision(gate, now_mono, comparisons, min_comparisons, top)
    test, bucket, statistic, threshold, samples = named
    return {
        "release": gate.name,
        "stable_version": gate.stable_version,
        "canary_version": gate.canary_version,
        "comparisons": comparisons,
        "noise_comparisons": sum(b.noise_comparisons for b in gate.buckets.values()),
        "min_comparisons": min_comparisons,
        "test": test,
        "bucket": bucket,
        "statistic": statistic,
        "threshold": threshold,
        "samples": samples,
        "strongest": top,
        "drift": drift,
        "scoring": scoring,
        "trip": trip,
        "verdict": decided[0],
        "reason": decided[1],
    }


class FlaggerPayload(BaseModel):
    """What Flagger POSTs to a webhook (docs.flagger.app/usage/webhooks; Flagger's
    ``CanaryWebhookPayload``): the canary's name and namespace, its phase, the checksum of
    its configuration and the webhook's ``metadata``. The judge reads ``metadata.release``
    (default: the canary's name) and ``metadata.inconclusive`` (``fail``, the default, or
    ``pass``)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=253)
    phase: str | None = Field(default=None, max_length=64)
    checksum: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None

    @property
    def release(self) -> str:
        return (self.metadata or {}).get("release") or self.name

    @property
    def inconclusive_passes(self) -> bool:
        return (self.metadata or {}).get("inconclusive", "fail") == "pass"


def flagger_status(answer: Verdict, inconclusive_passes: bool) -> int:
    """200 (advance) or ``FLAGGER_FAIL_STATUS`` (halt, count a failed check)."""
    v = answer["verdict"]
    if v == PASS or (v == INCONCLUSIVE and inconclusive_passes):
        return 200
    return FLAGGER_FAIL_STATUS
