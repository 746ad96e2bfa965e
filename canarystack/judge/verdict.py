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

from pydantic import BaseModel, ConfigDict, Field

from canary_contract.json import JsonObject
from canarystack.gate.state import ReleaseGate

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS = (PASS, FAIL, INCONCLUSIVE)
# Flagger: 2xx advances the canary; any other status halts it and counts a failed check.
FLAGGER_FAIL_STATUS = 412


def release_json(name: str, revision: int, stable: str, canary: str) -> JsonObject:
    """The release a broker would show for what the judge sees: progressing, these
    versions (the judge compares every mirrored prompt, whatever the traffic split)."""
    return {
        "name": name,
        "phase": "progressing",
        "revision": revision,
        "stable": {"version": stable},
        "canary": {"version": canary},
        "weights": {"baseline": 50, "canary": 50},
    }


def _progress(statistic: float, threshold: float) -> float:
    """How far a detector is towards its threshold, on the log scale (1 = alarm)."""
    if not (statistic > 1 and threshold > 1 and math.isfinite(statistic)):
        return 0.0
    return math.log(statistic) / math.log(threshold)


def strongest(gate: ReleaseGate) -> JsonObject | None:
    """The detector closest to its threshold: its scope, test, statistic (the e-value),
    threshold and samples (None before any detector has a sample)."""
    best: tuple[float, int, JsonObject] | None = None
    for scope, test, det in gate.detectors():
        if det.samples == 0:
            continue
        key = (_progress(det.statistic, det.threshold), det.samples)
        entry: JsonObject = {
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


def verdict_json(
    gate: ReleaseGate, now_mono: float, min_comparisons: int, drift: dict[str, JsonObject]
) -> JsonObject:
    """The release's verdict with the evidence behind it (module docstring)."""
    # Since the canary version was set (or the last reset): the buckets start afresh.
    comparisons = sum(b.comparisons for b in gate.buckets.values())
    top = strongest(gate)
    out: JsonObject = {
        "release": gate.name,
        "stable_version": gate.stable_version,
        "canary_version": gate.canary_version,
        "comparisons": comparisons,
        "noise_comparisons": sum(b.noise_comparisons for b in gate.buckets.values()),
        "min_comparisons": min_comparisons,
        "test": None,
        "bucket": None,
        "statistic": None,
        "threshold": None,
        "samples": None,
        "strongest": top,
        "drift": drift,
        "trip": gate.trip,
    }
    if gate.trip is not None:
        trip = gate.trip
        out.update(
            verdict=FAIL,
            test=trip.get("test"),
            bucket=trip.get("bucket"),
            statistic=trip.get("statistic"),
            threshold=trip.get("threshold"),
            samples=trip.get("samples"),
            reason=(
                f"the {trip.get('test')} test tripped in bucket {trip.get('bucket')}: "
                f"statistic {trip.get('statistic')} reached {trip.get('threshold')} over "
                f"{trip.get('samples')} samples"
            ),
        )
        return out
    if top is not None:
        out.update(
            test=top["test"],
            bucket=top["scope"],
            statistic=top["statistic"],
            threshold=top["threshold"],
            samples=top["samples"],
        )
    if comparisons < min_comparisons:
        out["verdict"] = INCONCLUSIVE
        out["reason"] = (
            f"{comparisons} baseline-canary comparisons so far, fewer than the "
            f"{min_comparisons} a verdict needs: mirror more traffic to the judge, or wait"
        )
    elif gate.check_no_data(now_mono):
        out["verdict"] = INCONCLUSIVE
        out["reason"] = (
            f"no baseline-canary comparison for {gate.config.no_data_timeout_s:g} s: is the "
            "mirror still sending, and do both engines answer?"
        )
    else:
        out["verdict"] = PASS
        out["reason"] = (
            f"{comparisons} comparisons, no test tripped (strongest: "
            f"{top['test'] if top else '-'} in {top['scope'] if top else '-'})"
        )
    return out


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


def flagger_status(answer: JsonObject, inconclusive_passes: bool) -> int:
    """200 (advance) or ``FLAGGER_FAIL_STATUS`` (halt, count a failed check)."""
    v = answer["verdict"]
    if v == PASS or (v == INCONCLUSIVE and inconclusive_passes):
        return 200
    return FLAGGER_FAIL_STATUS
