"""A trip's record: the evidence the gate writes to the broker when a detector reaches its
threshold (or, with ``--trip-on-no-data``, when no canary sample came), and the example
colours of the samples behind it.

This module must never do I/O or read a clock: the caller stamps ``tripped_at``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from canary_contract.broker import MAX_TRIP_COLOURS, TripEvidence, TripRecord, trip_json
from canarystack.gate.config import GateConfig
from canarystack.gate.scopes import (
    ALL_SCOPE,
    Alarm,
    BucketScope,
    DriftScope,
)


def trip_record(fields: Mapping[str, object]) -> TripRecord:
    """A trip's evidence built as the contract's ``TripEvidence`` (so the gate never holds
    or sends a trip the broker's PATCH would refuse, and every builder below gives the same
    shape), written back as the JSON the gate keeps, serves and sends."""
    return trip_json(TripEvidence.from_wire(dict(fields)))


def drift_detail(
    scope: DriftScope, metric: str, noise: float, noise_source: str, tolerance: float
) -> dict[str, object]:
    return {
        "metric": metric,
        "scope": scope.name,
        "pooled_buckets": list(scope.members),
        "noise_floor": round(noise, 6),
        "noise_source": noise_source,
        "tolerance": tolerance,
    }


def bucket_detail(
    test: str, bucket: str, config: GateConfig, extra: Mapping[str, object]
) -> dict[str, object]:
    detail: dict[str, object] = {"scope": bucket, "pooled_buckets": [bucket]}
    if test == "latency":
        detail.update(
            metric="canary_slower_share",
            latency_ratio=config.latency_ratio,
            latency_slack_s=config.latency_slack_s,
        )
    else:
        detail.update(metric="canary_error_rate")
    detail.update(extra)
    return detail


def strongest_member(drift: Mapping[str, DriftScope], scope: DriftScope, metric: str) -> str:
    """The member bucket of ``scope`` with the strongest evidence of its own (highest
    statistic, then highest run mean): a tail trip names it as ``bucket`` and lists the
    pooled buckets in ``detail``."""
    if len(scope.members) == 1:
        return scope.members[0]

    def strength(label: str) -> tuple[float, float]:
        own = drift[label]
        det = own.kl if metric == "kl_mean" else own.top1
        run = det.run_sum / det.run_samples if det.run_samples and det.log_m > 0 else 0.0
        return (det.log_m, run)

    return max(scope.members, key=strength)


def trip_colours(
    buckets: Mapping[str, BucketScope], members: Sequence[str], kind: str
) -> list[dict[str, str | None]]:
    """The colours of the (at most ``MAX_TRIP_COLOURS``) most recent samples of ``kind``
    in ``members`` behind a trip, oldest first: examples a person can follow end to end.
    ``kind`` is what moved the detector (drift: baseline-canary comparisons; latency: the
    paired comparisons or the canary outcomes; errors: the failed canary outcomes); a
    no-data trip has none."""
    kept = [entry for b in members for entry in buckets[b].colours[kind]]
    kept.sort(key=lambda entry: entry[0])
    return [dict(record) for _, record in kept[-MAX_TRIP_COLOURS:]]


def alarm_evidence(
    alarm: Alarm, canary_version: str | None, stable_version: str | None
) -> TripRecord:
    """The evidence of a detector that reached its threshold (``tripped_at`` still 0)."""
    det = alarm.detector
    first = det.run_first_time if det.run_first_time is not None else 0.0
    last = det.run_last_time if det.run_last_time is not None else first
    run_mean = det.run_sum / det.run_samples if det.run_samples else None
    detail = {
        "method": "e-CUSUM (betting e-values)",
        "arl_lower_bound_samples": det.threshold,
        "null_mean": round(det.last_m0, 6) if det.last_m0 is not None else None,
        "run_mean": round(run_mean, 6) if run_mean is not None else None,
        "bet_fraction": det.bet_fraction,
        "test_samples": det.samples,
        "canary_version": canary_version,
        "stable_version": stable_version,
        **alarm.detail,
    }
    return trip_record(
        {
            "test": alarm.test,
            "bucket": alarm.bucket,
            "statistic": round(det.statistic, 6),
            "threshold": float(det.threshold),
            "samples": det.run_samples,
            "first_sample_time": first,
            "last_sample_time": max(first, last),
            "tripped_at": 0.0,  # set by the caller with its wall clock
            "detail": detail,
            "colours": alarm.colours,
        }
    )


def no_data_evidence(
    waited: float,
    now_wall: float,
    timeout_s: float,
    canary_weight: float,
    canary_version: str | None,
) -> TripRecord:
    """The evidence of a trip for lack of data (``--trip-on-no-data``)."""
    return trip_record(
        {
            "test": "no_data",
            "bucket": ALL_SCOPE,
            "statistic": round(waited, 3),
            "threshold": timeout_s,
            "samples": 0,
            "first_sample_time": now_wall - waited,
            "last_sample_time": now_wall,
            "tripped_at": now_wall,
            "detail": {
                "reason": "no_data",
                "message": f"canary weight {canary_weight:g} but no canary sample for "
                f"{waited:.1f} s (--trip-on-no-data)",
                "canary_version": canary_version,
            },
            "colours": [],  # no sample is behind a trip for lack of samples
        }
    )


def gate_blind_evidence(
    waited: float,
    now_wall: float,
    failsafe_s: float,
    canary_weight: float,
    canary_version: str | None,
    baseline_outcomes: int,
    expected: float,
) -> TripRecord:
    """The evidence of the gate-blind fail-safe (``--blind-failsafe-s``): the canary took
    traffic (the baseline's share says so) but no canary sample reached the gate."""
    out = no_data_evidence(waited, now_wall, failsafe_s, canary_weight, canary_version)
    out["detail"] = {
        "reason": "gate_blind",
        "message": f"gate blind: canary weight {canary_weight:g} % and {baseline_outcomes} "
        f"baseline outcomes (about {expected:.0f} canary ones expected) but no canary "
        f"sample for {waited:.1f} s (--blind-failsafe-s {failsafe_s:g}): canary to 0 %",
        "canary_version": canary_version,
        "baseline_outcomes": baseline_outcomes,
        "expected_canary_samples": round(expected, 3),
    }
    return out
