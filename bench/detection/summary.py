"""The figures ``bench/gate_detection.py`` writes (``bench/results/gate_detection.json``):
per healthy condition the false trips with their one-sided 95 % Clopper-Pearson upper
bound on the per-run false-trip probability; for the faulty runs the time from the fault
to the trip decision, to weight 0 at every router and to ``rolled_back`` as p50/p95 with
95 % order-statistic intervals. The percentile is THE benchmark percentile
(``_results.percentile``), the bounds the campaign report's own functions
(``gameday.report.campaign``), so a game-day campaign and this benchmark state the same
thing the same way.

The full default campaign (59 faulty + 59 x 9 healthy runs) takes ~4.7 h of a quiet 2-core
machine, so it may be run in parts: ``--add-to bench/results/gate_detection.json`` adds a
part's runs to the file's and recomputes every figure from the pooled runs (``merge``). A
part must run under the same settings (``SETTINGS``); each part's command, commit and
machine load are listed in ``parts``, and each run says which part it came from.
"""

from __future__ import annotations

import argparse

from _results import percentile

from canary_contract.json import JsonObject
from detection.conditions import CONDITIONS
from detection.traffic import Traffic, trace_output_lengths
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


STACK = (
    "2 routers (SO_REUSEPORT, default shadow rates), 2 baseline + 1 canary simulated model "
    "servers with the calibrated batch noise, gate and rollback at their defaults"
)


def lengths_of(args: argparse.Namespace) -> JsonObject:
    """``Traffic``'s answer-length settings from ``--output-lengths`` / ``--trace``."""
    if args.output_lengths == "gameday":
        return {}
    return {"output_lengths": trace_output_lengths(args.trace), "trace_name": args.trace.name}


def stack_of(args: argparse.Namespace) -> str:
    """The stack the runs ran on: ``STACK``, and the gate's test when not its default."""
    if args.gate_test == "cusum":
        return STACK
    return f"{STACK}; the gate with --test {args.gate_test}"


def load_of(traffic: Traffic, canary_weight: float) -> JsonObject:
    records = traffic.records
    return {
        **traffic.describe(),
        "canary_weight_pct": canary_weight,
        "requests": len(records),
        "non_200": sum(1 for r in records if r.status != 200),
    }


def seconds_each(args: argparse.Namespace) -> JsonObject:
    return {
        "warmup": args.warmup_s,
        "healthy": args.healthy_s,
        "faulty_max_detect": args.max_detect_s,
    }


def report(
    args: argparse.Namespace,
    faulty: list[JsonObject],
    healthy: list[JsonObject],
    open_runs: list[JsonObject],
    load: JsonObject,
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

    conditions = sorted({str(r["condition"]) for r in healthy}, key=CONDITIONS.index)
    return {
        "bench": "gate_detection",
        "load": load,
        "stack": stack_of(args),
        "seconds_each": seconds_each(args),
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
            "affected_comparisons_per_s_before_fault": times(
                [float(r["affected_per_s_before_fault"]) for r in faulty if "affected_to_trip" in r]
            ),
            "affected_comparisons_to_trip": times(
                [float(r["affected_to_trip"]) for r in tripped if "affected_to_trip" in r]
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


# What two parts of one campaign must share: the run lengths, the evidence rule, the load
# (all but its prompt seed and its counts) and the stack.
SETTINGS = ("seconds_each", "min_comparisons_for_evidence", "load", "stack")
LOAD_COUNTS = ("requests", "non_200", "seed")


def settings_of(res: JsonObject) -> JsonObject:
    load = {k: v for k, v in res["load"].items() if k not in LOAD_COUNTS}
    return {
        "seconds_each": res["seconds_each"],
        "min_comparisons_for_evidence": res["healthy_runs"]["min_comparisons_for_evidence"],
        "load": load,
        "stack": res["stack"],
    }


def settings_for(args: argparse.Namespace) -> JsonObject:
    """The settings a part run with ``args`` will have (checked before it starts)."""
    traffic = Traffic("http://127.0.0.1:9", users=args.users, seed=args.seed, **lengths_of(args))
    return settings_of(
        {
            "seconds_each": seconds_each(args),
            "healthy_runs": {"min_comparisons_for_evidence": args.min_comparisons},
            "load": load_of(traffic, args.canary_weight),
            "stack": stack_of(args),
        }
    )


def settings_differ(a: JsonObject, b: JsonObject) -> list[str]:
    """What settings ``b`` has otherwise than ``a``: 'name: a's -> b's'."""
    out = []
    for name in SETTINGS:
        sub_a, sub_b = a[name], b[name]
        if isinstance(sub_a, dict) and isinstance(sub_b, dict):
            out += [
                f"{name}.{k}: {sub_a.get(k)!r} -> {sub_b.get(k)!r}"
                for k in sorted(set(sub_a) | set(sub_b))
                if sub_a.get(k) != sub_b.get(k)
            ]
        elif sub_a != sub_b:
            out.append(f"{name}: {sub_a!r} -> {sub_b!r}")
    return out


PART_FIELDS = ("command", "commit", "started", "wall_s", "load_1m")


def part_of(doc: JsonObject) -> JsonObject:
    """One part's line in ``parts``: where it came from and how many runs it added."""
    res = doc["results"]
    return {
        **{k: doc.get(k) for k in PART_FIELDS},
        "faulty_runs": res["faulty_runs"]["n"],
        "healthy_runs": {
            c: v["runs"] + v["runs_too_little_evidence"]
            for c, v in res["healthy_runs"]["by_condition"].items()
        },
        "open_runs": res["open_streams"]["n"],
    }


def _runs(res: JsonObject, key: str, part: int) -> list[JsonObject]:
    return [{**r, "part": r.get("part", part)} for r in res[key]["runs"]]


def merge(prev_doc: JsonObject, new_doc: JsonObject, args: argparse.Namespace) -> JsonObject:
    """The results of ``prev_doc``'s campaign with ``new_doc``'s part added: every figure
    recomputed from the pooled runs. Refused (ValueError naming each setting) when the
    part ran under other settings: runs of different lengths or loads are not one sample."""
    prev, new = prev_doc["results"], new_doc["results"]
    if prev.get("bench") != "gate_detection":
        raise ValueError(f"not a gate_detection results file (bench {prev.get('bench')!r})")
    differ = settings_differ(settings_of(prev), settings_of(new))
    if differ:
        raise ValueError(
            "this part ran under other settings than the campaign it is added to ("
            + "; ".join(differ)
            + "): run it with the campaign's settings, or start a new file with --out"
        )
    parts = prev.get("parts") or [part_of(prev_doc)]
    n = len(parts)
    load = {
        **prev["load"],
        "requests": prev["load"]["requests"] + new["load"]["requests"],
        "non_200": prev["load"]["non_200"] + new["load"]["non_200"],
        "seed": sorted({*_seeds(prev), *_seeds(new)}),
    }
    out = report(
        args,
        _runs(prev, "faulty_runs", 0) + _runs(new, "faulty_runs", n),
        _runs(prev, "healthy_runs", 0) + _runs(new, "healthy_runs", n),
        _runs(prev, "open_streams", 0) + _runs(new, "open_streams", n),
        load,
        float(prev["elapsed_s"]) + float(new["elapsed_s"]),
    )
    out["parts"] = [*parts, part_of(new_doc)]
    return out


def _seeds(res: JsonObject) -> list[int]:
    seed = res["load"]["seed"]
    return list(seed) if isinstance(seed, list) else [int(seed)]
