"""An experiment's key figures for summary.json: requests, errors, TTFT, drift, the trip.

Must never decide a verdict: figures are shown, the checks decide.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np

from gameday.report.jsonfields import rounded
from gameday.report.loader import ExperimentData
from gameday.report.noise import ExperimentNoiseJson
from gameday.report.timeline import Timeline, records_after


class KeyFigures(TypedDict):
    """An experiment's ``figures`` in summary.json, in this order (the HTML lists them)."""

    requests: int
    failed_requests: int
    error_rate: float | None
    requests_by_variant: dict[str, int]
    ttft_p50_s: dict[str, float | None]
    ttft_p99_s: dict[str, float | None]
    canary_requests_after_fault: int
    canary_requests_after_trip: int
    oracle_pairs: int
    oracle_kl_max: float | None
    time_to_trip_s: float | None
    # From result.json's evidence, when it has them (copied as gameday run wrote them).
    records_by_worker: NotRequired[dict[str, int]]
    gate_evidence: NotRequired[dict[str, object]]
    load_generator: NotRequired[dict[str, object]]
    trip: NotRequired[dict[str, object]]  # from the trip evidence
    noise_floor: NotRequired[ExperimentNoiseJson]  # added by gameday.report.build


def key_figures(exp: ExperimentData, timeline: Timeline) -> KeyFigures:
    rec = exp.records
    ok = rec["ok"].to_numpy(dtype=bool)
    variant = rec["served_by"].astype("category")
    good = rec.loc[ok & rec["ttft_s"].notna().to_numpy(), ["served_by", "ttft_s"]]
    by = good.groupby(good["served_by"].astype("category"), observed=True)["ttft_s"]
    fault = timeline.milestone("fault_injected").time
    trip = timeline.milestone("gate_tripped").time
    ora = exp.oracle
    kl = ora["kl_mean"].to_numpy(dtype=float)
    fig: KeyFigures = {
        "requests": len(rec),
        "failed_requests": int((~ok).sum()),
        "error_rate": rounded((~ok).mean()) if len(rec) else None,
        "requests_by_variant": {
            str(k): int(v) for k, v in variant.value_counts(dropna=False).items() if v
        },
        "ttft_p50_s": {str(k): rounded(v) for k, v in by.quantile(0.5).items()},
        "ttft_p99_s": {str(k): rounded(v) for k, v in by.quantile(0.99).items()},
        "canary_requests_after_fault": records_after(rec, fault, "canary"),
        "canary_requests_after_trip": records_after(rec, trip, "canary"),
        "oracle_pairs": len(ora),
        "oracle_kl_max": rounded(np.nanmax(kl)) if len(kl) and np.isfinite(kl).any() else None,
        "time_to_trip_s": rounded(timeline.time_to_trip_s),
    }
    # What the gate saw and how the load generator did (gameday run's evidence, #14).
    evidence = (exp.result or {}).get("evidence")
    evidence = evidence if isinstance(evidence, dict) else {}
    gate, load = evidence.get("gate"), evidence.get("load")
    workers = evidence.get("load_workers")
    if isinstance(workers, dict) and workers:  # the load came from Locust workers (pods)
        fig["records_by_worker"] = {str(k): int(v) for k, v in sorted(workers.items())}
    if isinstance(gate, dict):
        fig["gate_evidence"] = {
            k: gate.get(k) for k in ("comparisons", "canary_outcomes", "thresholds")
        }
    if isinstance(load, dict):
        fig["load_generator"] = {
            k: load.get(k)
            for k in (
                "valid",
                "achieved_rps",
                "target_rps",
                "cpu_fraction",
                "max_cpu_percent",
                "cpu_warning",
                "late_fraction",
                "max_lag_s",
                "peak_users",
                "users",
            )
        }
    if timeline.trip:
        fig["trip"] = {
            k: timeline.trip.get(k) for k in ("test", "bucket", "statistic", "threshold", "samples")
        }
    return fig
