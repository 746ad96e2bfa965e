"""The figures ``bench/gate_detection.py`` writes (``bench/results/gate_detection.json``):
per healthy condition the false trips with their one-sided 95 % Clopper-Pearson upper
bound on the per-run false-trip probability; for the faulty runs the time from the fault
to the trip decision, to weight 0 at every router and to ``rolled_back`` as p50/p95 with
95 % order-statistic intervals. The percentile is THE benchmark percentile
(``_results.percentile``), the bounds the campaign report's own functions
(``gameday.report.campaign``), so a game-day campaign and this benchmark state the same
thing the same way.
"""

from __future__ import annotations

import argparse

from _results import percentile

from canary_contract.json import JsonObject
from detection.traffic import Traffic
from gameday.report.campaign import CONFIDENCE, exceedance_upper_bound, quantile_interval


def rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def times(values: list[float]) -> JsonObject:
    """n, p50 and p95 each with its 95 % interval ([low, high]; None: unbounded), max."""
    out: JsonObject = {"n": len(values)}
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        lo, hi = quantile_interval(values, q, CONFIDENCE) if values else (None, None)
        out[name] = rounded(percentile(values, q))
        out[f"{name}_interval"] = [rounded(lo), rounded(hi)]
    out["max"] = rounded(max(values)) if values else None
    return out


def false_trips(runs: list[JsonObject], min_comparisons: int) -> JsonObject:
    """False trips of one condition. A run without a trip in which the gate got fewer than
    ``min_comparisons`` baseline-canary comparisons is no evidence that it would not have
    tripped (fail closed): it is counted apart and left out of the bound. A trip always
    counts."""
    seen = [
        r
        for r in runs
        if r["false_trip"] is not None or r["baseline_canary_comparisons"] >= min_comparisons
    ]
    k = sum(1 for r in seen if r["false_trip"] is not None)
    return {
        "runs": len(seen),
        "runs_too_little_evidence": len(runs) - len(seen),
        "false_trips": k,
        "upper_bound_95": round(exceedance_upper_bound(len(seen), k), 4) if seen else None,
        "tests": sorted(
            {str((r["false_trip"] or {}).get("test")) for r in runs if r["false_trip"] is not None}
        ),
    }


def report(
    args: argparse.Namespace,
    faulty: list[JsonObject],
    healthy: list[JsonObject],
    open_runs: list[JsonObject],
    traffic: Traffic,
    elapsed_s: float,
) -> JsonObject:
    tripped = [r for r in faulty if r["tripped"]]

    def ref_stats(name: str) -> JsonObject:
        got = [r["reference"][name] for r in faulty if r["reference"][name] is not None]
        ours = {r["run"]: r.get("detect_s") for r in faulty}
        before = sum(
            1
            for r in faulty
            if r["reference"][name] is not None
            and (ours[r["run"]] is None or r["reference"][name] < ours[r["run"]])
        )
        return {
            "tripped_in_stream": len(got),
            "tripped_before_ours": before,
            "detect_s": times(got),
            "false_trips_healthy": sum(
                1 for r in healthy if r["reference_trip_s"][name] is not None
            ),
        }

    def open_stats(name: str) -> JsonObject:
        got = [r["detect_s"][name] for r in open_runs if r["detect_s"][name] is not None]
        return {"detected": len(got), "of": len(open_runs), "detect_s": times(got)}

    records = traffic.records
    conditions = sorted({str(r["condition"]) for r in healthy}, key=args.conditions.index)
    return {
        "bench": "gate_detection",
        "load": {
            **traffic.describe(),
            "canary_weight_pct": args.canary_weight,
            "requests": len(records),
            "non_200": sum(1 for r in records if r.status != 200),
        },
        "stack": "2 routers (SO_REUSEPORT, default shadow rates), 2 baseline + 1 canary "
        "simulated model servers with the calibrated batch noise, gate and rollback at "
        "their defaults",
        "seconds_each": {
            "warmup": args.warmup_s,
            "healthy": args.healthy_s,
            "faulty_max_detect": args.max_detect_s,
        },
        "faulty_runs": {
            "n": len(faulty),
            "tripped": len(tripped),
            "trip_tests": sorted({str(r.get("trip_test")) for r in tripped}),
            "evidence_buckets": sorted({str(r.get("trip_bucket")) for r in tripped}),
            "fault_to_trip_decision_s": times([r["detect_s"] for r in tripped]),
            "fault_to_weight0_at_every_router_s": times(
                [r["applied_s"] for r in tripped if r.get("applied_s") is not None]
            ),
            "fault_to_rolled_back_s": times(
                [r["rolled_back_s"] for r in tripped if r.get("rolled_back_s") is not None]
            ),
            "canary_served_after_fault": times(
                [float(r["canary_served_after_fault"]) for r in faulty]
            ),
            "canary_served_long_prompt_after_fault": times(
                [float(r["canary_served_long_after_fault"]) for r in faulty]
            ),
            "wall_s_per_run": times([r["wall_s"] for r in faulty]),
            "runs": faulty,
        },
        "healthy_runs": {
            "n": len(healthy),
            "false_trips": sum(1 for r in healthy if r["false_trip"] is not None),
            "min_comparisons_for_evidence": args.min_comparisons,
            "by_condition": {
                c: false_trips([r for r in healthy if r["condition"] == c], args.min_comparisons)
                for c in conditions
            },
            "wall_s_per_run": times([r["wall_s"] for r in healthy]),
            "runs": healthy,
        },
        "reference_rules_same_streams": {
            "note": "a faulty stream ends when our gate trips; 'tripped_before_ours' is the "
            "comparison that stream allows",
            "seed_article": {
                "rule": "mean KL of the last 100 comparisons > 0.05, or > 5% of canary TTFTs "
                "> 1.15 x baseline P99",
                **ref_stats("seed_article"),
            },
            "flagger": {
                "rule": f"one check every {args.flagger_interval_s:g} s (interval mean KL > "
                f"0.05 or canary P99 TTFT > 1.15 x baseline P99), trip after "
                f"{args.flagger_threshold} failed checks",
                **ref_stats("flagger"),
            },
        },
        "open_streams": {
            "note": "gate blind while recording; all three rules replayed on the same uncut "
            f"streams ({args.open_warmup_s:g} s healthy, then {args.open_window_s:g} s faulty); "
            "ours = the gate's own code at its defaults (decision time only)",
            "n": len(open_runs),
            "ours": open_stats("ours_offline"),
            "seed_article": open_stats("seed_article"),
            "flagger": open_stats("flagger"),
            "ours_false_trips_in_warmup": sum(
                1 for r in open_runs if r["ours_tripped_before_fault"]
            ),
            "runs": open_runs,
        },
        "elapsed_s": round(elapsed_s, 1),
    }
