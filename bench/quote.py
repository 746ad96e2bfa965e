"""Quote benchmark figures into the documentation from the files the benchmarks write.

A Markdown file marks where a benchmark's figures go::

    <!-- bench:router_overhead -->
    (rewritten by this script)
    <!-- /bench:router_overhead -->

and this script fills each block from ``bench/results/<name>.json``: the figures, the
command that produced them, when, on what machine and under what load. No figure in a
block is typed by hand; a benchmark without a results file says so and names the command
that makes one.

    .venv/bin/python bench/quote.py          # rewrite the blocks in README.md and docs/*.md
    .venv/bin/python bench/quote.py --check  # exit 1 naming each stale block (the tests run it)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from canary_contract.json import JsonObject

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(<!-- bench:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S
)

# The command that writes each results file (for a block whose file is missing).
COMMANDS = {
    "model_server": ".venv/bin/python bench/model_server.py --concurrency 16 --duration-s 20",
    "router_overhead": ".venv/bin/python bench/router_overhead.py",
    "broker_api": ".venv/bin/python bench/broker_api.py --patches 1000 --watches 100",
    "report_speed": ".venv/bin/python bench/report_speed.py",
    "gameday_load": ".venv/bin/python bench/gameday_load.py --users 8,12,16 --duration-s 20",
    "load_capacity": ".venv/bin/python bench/load_capacity.py",
    "event_loop_stall": ".venv/bin/python bench/event_loop_stall.py",
    "gate_false_alarms": ".venv/bin/python bench/gate_false_alarms.py",
    "gate_detection": ".venv/bin/python bench/gate_detection.py --runs 59 --healthy-runs 59",
    "gate_detection_curve": (
        ".venv/bin/python bench/gate_detection_curve.py --levels 16,32,48 --runs 72"
    ),
    "gate_null_stress": "nice -n 19 .venv/bin/python bench/gate_null_stress.py",
    "gate_null_outcomes": "nice -n 19 .venv/bin/python bench/gate_null_outcomes.py",
    "engine_drift": ".venv/bin/python bench/engine_drift.py",
    "certify_campaign": ".venv/bin/python bench/certify_campaign.py --repeat 59",
    "gate_matrix": "make gate-matrix",
    "broker_failsafe": ".venv/bin/python bench/broker_failsafe.py --trials 3 --stop-s 20",
    "broker_failsafe_before": "the same, on the router before #27 (git worktree of f4e7a0b)",
    "gate_deadman": ".venv/bin/python bench/gate_deadman.py --trials 2 --stop-s 20",
    "vllm_noise": ".venv/bin/python bench/vllm_noise.py",
}


def _f(v: Any, nd: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _table(intro: str, header: str, rows: list[str]) -> list[str]:
    """A paragraph ``intro``, then a Markdown table: its column titles ``header`` ("| a |
    b |") and ``rows``."""
    return [intro, "", header, "|" + " --- |" * (header.count("|") - 1), *rows]


def provenance(doc: JsonObject) -> str:
    m = doc.get("machine", {})
    cores = m.get("cores", m.get("cpu_count", "?"))
    load = doc.get("load_1m")
    load_s = f", 1-min load {load['start']}→{load['end']}" if load else ""
    when = f", {doc['started']}" if doc.get("started") else ""
    commit = f" at `{doc['commit']}`" if doc.get("commit") else ""
    wall = f", {doc['wall_s']} s" if doc.get("wall_s") is not None else ""
    return (
        f"*From `bench/results/{doc['benchmark']}.json`: `{doc['command']}`{when}{commit}, "
        f"{cores} cores{load_s}{wall}.*"
    )


def r_router_overhead(res: JsonObject) -> list[str]:
    add = res["added_by_router"]
    load = res["load"]
    work = res.get("router_work", {})
    path = (
        f"real path: canary {load.get('canary_weight_pct')} %, shadow on, gate on "
        f"({_f(work.get('router_shadow_comparisons_total'), 0)} shadow comparisons, "
        f"{_f(work.get('router_gate_pushes_total'), 0)} gate pushes)"
        if load.get("path") == "real"
        else "bare path: canary at weight 0, no shadow, no gate"
    )
    tgt = res["target"]
    return [
        f"Router overhead, {path}; concurrency {load['concurrency']}, "
        f"{load['max_tokens']}-token streams, {load['duration_s']} s, direct and routed "
        "requests interleaved by coin flip:",
        "",
        "| added by the router | p50 ms | p99 ms | target p50 / p99 ms |",
        "| --- | --- | --- | --- |",
        f"| TTFT | {_f(add.get('ttft_p50_ms'))} | {_f(add.get('ttft_p99_ms'))} | "
        f"{tgt['added_ttft_p50_ms']} / {tgt['added_ttft_p99_ms']} |",
        f"| end to end | {_f(add.get('e2e_p50_ms'))} | {_f(add.get('e2e_p99_ms'))} | |",
        "",
        f"Router CPU {_f(res.get('router_cpu_s_per_1000_streams'))} s per 1,000 streamed "
        f"requests; its own work before forwarding "
        f"{_f(res.get('router_pre_forward_ms', {}).get('p50'), 3)} ms p50.",
    ]


def r_model_server(res: JsonObject) -> list[str]:
    keys = [k for k in res if k.endswith(("_per_s", "_p50", "_p99")) or "cpu" in k]
    rows = [f"| {k} | {_f(res[k])} |" for k in keys if not isinstance(res[k], dict | list)]
    return _table(
        f"Model server, concurrency {res.get('concurrency')}, {res.get('max_tokens')}-token "
        f"streams, {res.get('duration_s')} s:",
        "| figure | value |",
        rows,
    )


def r_broker_api(res: JsonObject) -> list[str]:
    c = res["commit_ms"]
    return [
        f"Broker, {res['patches']} PATCHes and {res['watches']} watches over HTTP:",
        "",
        "| operation | p50 ms | p99 ms |",
        "| --- | --- | --- |",
        f"| PATCH | {res['patch_ms']['p50']} | {res['patch_ms']['p99']} |",
        f"| PATCH → waiting watch answered | {res['watch_wake_ms']['p50']} | "
        f"{res['watch_wake_ms']['p99']} |",
        f"| store transaction, synchronous=FULL | {c['full']['p50']} | {c['full']['p99']} |",
        f"| store transaction, synchronous=NORMAL | {c['normal']['p50']} | {c['normal']['p99']} |",
    ]


def r_report_speed(res: JsonObject) -> list[str]:
    return [
        f"A report from {res['records']:,} request records ({res['experiments']} experiments, "
        f"{res['oracle_records']:,} oracle pairs): build_report {res['build_report_s']} s, "
        f"whole command {res['command_wall_s']} s (target ≤ {res['target_s']} s).",
    ]


def r_gameday_load(res: JsonObject) -> list[str]:
    rows = []
    for lv in res["levels"]:
        rows.append(
            "| "
            + " | ".join(
                _f(lv.get(k))
                for k in (
                    "users",
                    "requests_per_s",
                    "stack_cores",
                    "locust_cores",
                    "baseline_ttft_p99_s",
                    "long_prompt_share",
                )
            )
            + " |"
        )
    return _table(
        f"The game-day load on the whole local stack, {res['duration_s']} s per level:",
        "| users | requests/s | stack cores | Locust cores | baseline TTFT p99 s "
        "| ≥ 2048-token share |",
        rows,
    )


def r_load_capacity(res: JsonObject) -> list[str]:
    rows = []
    for lv in res["levels"]:
        for client in ("locust", "aiohttp"):
            c = lv[client]
            bias = c.get("ttft_bias_ms", {})
            rows.append(
                f"| {lv['users']} | {client} | {_f(c.get('requests_per_s'), 1)} | "
                f"{_f(bias.get('p50'))} | {_f(bias.get('p99'))} |"
            )
    return _table(
        f"Locust beside a plain aiohttp+uvloop client against one model server, "
        f"{res['duration_s_per_phase']} s per level:",
        "| users | client | requests/s | TTFT bias p50 ms | p99 ms |",
        rows,
    )


def r_event_loop_stall(doc: JsonObject) -> list[str]:
    rows = []
    for name, comp in doc["components"].items():
        inputs = comp["inputs"]
        worst_name, worst = max(inputs.items(), key=lambda kv: kv[1]["stall_ms"])
        worst_label = worst_name.replace("_", " ") if worst["stall_ms"] > 0 else "none (all 0.0)"
        rows.append(
            f"| {name} (`{comp['endpoint']}`) | {comp['body_limit_bytes'] // 1024} KiB | "
            f"{worst_label} | {worst['stall_ms']} | {worst['stall_ms_median']} / "
            f"{worst['stall_ms_max']} | {'yes' if worst['meets_goal'] else 'no'} |"
        )
    return _table(
        f"Goal < {doc['goal_ms']} ms (least of the tries; every input got a 4xx):",
        "| component (request) | body limit | worst input | stall ms "
        "| median / largest ms | meets goal |",
        rows,
    )


def r_gate_false_alarms(doc: JsonObject) -> list[str]:
    b = doc["gate_budget"]
    rows = [
        f"| {r['source']} | {r['releases']} × {r['release_s'] / 60:g} min | "
        f"{r['baseline_canary_comparisons']:,} | {r['kl_p50']:.2e} / {r['kl_p99']:.2e} | "
        f"{r['false_trips']} | {r['false_trips_per_release_hour_cp95_upper']:.3f} |"
        for r in doc["results"]
    ]
    return _table(
        f"Healthy comparisons replayed through the gate's statistics at its default "
        f"thresholds ({b['per_detector_threshold']:g} per detector, {b['detectors']} "
        f"detectors). The guarantee those thresholds give by themselves ({b['merge']}, at "
        f"an assumed {b['sample_rate_hz_assumed']:g} samples/s per detector) is at most "
        f"{b['false_trips_per_release_hour']:g} false trips per release-hour: a worst case, "
        "far above what is measured here:",
        "| source | releases | comparisons | KL p50 / p99 | false trips "
        "| per release-hour, 95 % upper bound |",
        rows,
    )


def r_gate_null_stress(res: JsonObject) -> list[str]:
    cfg = res["config"]
    rows = [
        f"| `{r['stream']}` | {r['what']} | "
        f"{'release-eprocess' if r['test'].startswith('release') else 'cusum (default)'} | "
        f"{r['false_trips']:,} / {r['releases']:,} | {r['upper_95']:.2e} | "
        f"{r['p_value_vs_alpha']:.2f} |"
        for r in res["null_stress"]
    ]
    cusum = {d["shift_x_m0"]: d["affected_comparisons_to_trip"] for d in res["cusum_detection"]}
    det = []
    for d in res["detection"]:
        a, c = d["affected_comparisons_to_trip"], cusum.get(d["shift_x_m0"], {})
        secs = " / ".join(f"{_f(v['p50'], 1)}, {_f(v['p95'], 1)}" for v in d["seconds_at"].values())
        det.append(
            f"| {d['shift_x_m0']:g} × m0 | {d['tripped']}/{d['runs']} | "
            f"{_f(a['p50'], 0)} / {_f(a['p95'], 0)} | {_f(c.get('p50'), 0)} / "
            f"{_f(c.get('p95'), 0)} | {secs} |"
        )
    rates = " / ".join(f"{float(k):g}" for k in res["detection"][0]["seconds_at"])
    late = res["late_fault"]
    fresh, old = late["fresh"]["samples_to_trip"], late["after_a_healthy_hour"]["samples_to_trip"]
    drained = late["after_a_healthy_hour"]["log_wealth_at_fault"]
    return [
        f"{res['null_stress'][0]['release_hours']:,.0f} simulated release-hours per stream "
        f"({cfg['comparisons_per_s']:g} comparisons/s, null mean m0 = {cfg['m0']:g} nats, "
        f"KL clipped at {cfg['kl_clip']:g}), each release one detector carrying the whole "
        f"weight through the gate's own `ReleaseEProcess` (trips at 1/α = "
        f"{cfg['threshold']:g}; α = {cfg['alpha']:g}, floors' δ = {cfg['floor_delta']:g}); "
        "the default restarting e-CUSUM (A = 1000, bet 0.8) on three of the streams:",
        "",
        "| stream | what | test | false trips / releases | 95 % upper bound "
        "| P(≥ that many at rate α) |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Time to trip of the default average ({cfg['focus_detector']} at weight "
        f"{cfg['focus_weight']:g}, 28 detectors) for a KL shift on the long-prompt "
        f"comparisons ({cfg['long_share_of_comparisons']:.0%} of all) after a healthy "
        "warm-up; one default e-CUSUM on the same shift for comparison; seconds at "
        f"{rates} comparisons/s (the pipeline's own latency comes on top):",
        "",
        "| shift | tripped | affected comparisons p50 / p95 | e-CUSUM p50 / p95 "
        f"| seconds p50, p95 at {rates}/s |",
        "| --- | --- | --- | --- | --- |",
        *det,
        "",
        f"A late fault (5 × m0) on the {cfg['focus_detector']} detector alone: "
        f"{_f(fresh['p50'], 0)} / {_f(fresh['p95'], 0)} samples (p50 / p95) from a fresh "
        f"start, {_f(old['p50'], 0)} / {_f(old['p95'], 0)} after an hour of healthy "
        f"heavy-tailed observations (lognormal, m0/10), whose spikes left log-wealth "
        f"{drained['p5']:.1f} at the 5th percentile (worst {drained['min']:.1f}).",
    ]


def r_gate_null_outcomes(res: JsonObject) -> list[str]:
    cfg = res["config"]
    rows = [
        f"| `{r['stream']}` | {r['test']} | {r['what']} | "
        f"{r['false_trips']:,} / {r['releases']:,} | {r['upper_95']:.2e} | "
        f"{r['false_trips_at_default_weight']:,} ({r['default_weight']:g}) | "
        f"{r['upper_95_at_default_weight']:.2e} |"
        for r in res["null_stress"]
    ]
    return _table(
        f"{res['null_stress'][0]['release_hours']:,.0f} simulated release-hours per stream "
        f"in steps of {cfg['step_s']:g} s (baseline outcomes {cfg['baseline_outcomes_per_s']:g}"
        f"/s, canary outcomes {cfg['canary_outcomes_per_s']:g}/s, paired comparisons "
        f"{cfg['paired_comparisons_per_s']:g}/s; TTFT lognormal, median "
        f"{cfg['ttft']['median_s']:g} s, sigma {cfg['ttft']['lognormal_sigma']:g}), each "
        "release one detector in the gate's own `ReleaseEProcess`: alone at weight 1 "
        f"(trips at 1/α = {cfg['threshold']:g}), and at its weight in the default average "
        "(trips alone at 1/(α w)); errors window "
        f"{cfg['error_window_s']:g} s, tolerance {cfg['error_tolerance']:g}, shared-surge "
        f"rule {cfg['error_surge_s']:g} s unless the row says otherwise:",
        "| stream | detector | what | false trips at weight 1 | 95 % upper bound "
        "| false trips at the default weight (w) | 95 % upper bound |",
        rows,
    )


def _interval(v: Any) -> str:
    lo, hi = v if isinstance(v, list) and len(v) == 2 else (None, None)
    if lo is None and hi is None:
        return "(too few runs for an interval)"
    low = _f(lo) if lo is not None else "unbounded"
    high = _f(hi) if hi is not None else "unbounded"
    return f"[{low}, {high}]"


def _times(s: JsonObject | None) -> str:
    """p50/p95 with their 95 % intervals (``detection.summary.times``)."""
    if not s or not s.get("n"):
        return "–"
    return (
        f"p50 {_f(s.get('p50'))} {_interval(s.get('p50_interval'))}, "
        f"p95 {_f(s.get('p95'))} {_interval(s.get('p95_interval'))}, "
        f"max {_f(s.get('max'))} (n={s.get('n')})"
    )


def r_gate_detection(res: JsonObject) -> list[str]:
    from detection.conditions import CONDITIONS

    f = res["faulty_runs"]
    h = res["healthy_runs"]
    load = res["load"]
    secs = res.get("seconds_each", {})
    seeds = load["seed"] if isinstance(load["seed"], list) else [load["seed"]]
    out = [
        f"Game-day traffic: {load['shape']}, {load['prompt_mix']} (prompt seeds "
        f"{', '.join(map(str, seeds))}), max_tokens <= {load['max_tokens_cap']}, temperature "
        f"{load['temperature']}, {load['canary_weight_pct']} % canary ({load['requests']} "
        f"requests, {load['non_200']} not 200).",
        "",
    ]
    if f["n"]:
        out += [
            "Times in seconds from the fault, p50/p95 with 95 % intervals:",
            "",
            f"- faulty kernel → trip decision: {_times(f['fault_to_trip_decision_s'])}; "
            f"tripped {f['tripped']}/{f['n']}",
            f"- faulty kernel → canary weight 0 at every router: "
            f"{_times(f['fault_to_weight0_at_every_router_s'])}",
            f"- faulty kernel → rolled_back: {_times(f['fault_to_rolled_back_s'])}",
            f"- canary-served requests after the fault: {_times(f['canary_served_after_fault'])}",
            "",
        ]
    else:
        out += [
            "No faulty-kernel runs in this campaign yet (detection under game-day traffic: "
            "the certify campaign, `bench/results/certify_campaign.json`).",
            "",
        ]
    out += [
        f"| healthy condition ({secs.get('healthy')} s each) | runs | false trips | "
        "95 % upper bound, per run | runs with too little evidence |",
        "|---|---|---|---|---|",
    ]
    by = h["by_condition"]
    for cond in [*CONDITIONS, *(c for c in by if c not in CONDITIONS)]:
        c = by.get(cond)
        if c is None:
            out.append(f"| {cond} | not measured yet | | | |")
            continue
        out.append(
            f"| {cond} | {c['runs']} | {c['false_trips']} | {_f(c.get('upper_bound_95'), 3)} | "
            f"{c.get('runs_too_little_evidence', 0)} |"
        )
    parts = res.get("parts") or []
    if len(parts) > 1:
        out += ["", f"The campaign ran in {len(parts)} parts (`--add-to`), pooled:", ""]
        for i, part in enumerate(parts):
            runs = ", ".join(f"{c} {n}" for c, n in part["healthy_runs"].items())
            load_1m = part.get("load_1m") or {}
            out.append(
                f"{i + 1}. `{part['command']}` at `{part['commit']}`, {part['started']}, "
                f"{part['wall_s']} s, 1-min load {load_1m.get('start')}→{load_1m.get('end')}: "
                f"{part['faulty_runs']} faulty runs; "
                + (f"healthy runs {runs}" if runs else "no healthy runs")  # "none" is a condition
            )
    return out


def r_gate_detection_curve(res: JsonObject) -> list[str]:
    """Detection at the trace's output lengths, per traffic level, and the fitted curve."""
    fit = res["p95_fit"]
    out = [
        f"Fault: {res['fault']}; output lengths: {res['output_lengths']} (max_tokens drawn "
        f"from the Azure conversation trace); scoring: {res['scoring']}; gate test "
        f"`{res['gate_test']}`.",
        "",
        "| users | req/s | not 200 | tripped | affected comparisons/s, p50 | "
        "comparisons to trip, p50 / p95 | fault → trip decision, s | "
        "fault → weight 0 at every router, p95 s | canary-served after the fault, p95 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in res["levels"]:
        aff = lv["affected_comparisons_to_trip"]
        out.append(
            f"| {lv['users']} | {_f(lv['requests_per_s'], 1)} | {lv['non_200']} | "
            f"{lv['tripped']}/{lv['runs']} | {_f(lv['affected_comparisons_per_s']['p50'])} | "
            f"{_f(aff['p50'], 0)} / {_f(aff['p95'], 0)} | "
            f"{_times(lv['fault_to_trip_decision_s'])} | "
            f"{_f(lv['fault_to_weight0_at_every_router_s']['p95'])} | "
            f"{_f(lv['canary_served_after_fault']['p95'], 1)} |"
        )
    pts = ", ".join(f"{_f(p['affected_per_s'])}/s → {_f(p['p95_s'])} s" for p in fit["points"])
    out += [
        "",
        f"Fitted {fit['model']}: a = {_f(fit['a_s'])} s, b = {_f(fit['b_comparisons'])} "
        f"comparisons ({pts}); p95 ≤ 2 s needs about {_f(fit['rate_for_p95_2s'], 1)} "
        f"affected comparisons per second ({fit['note']}). All {res['all_detect_s']['n']} "
        f"runs pooled: {_times(res['all_detect_s'])}.",
    ]
    return out


def r_engine_drift(res: JsonObject) -> list[str]:
    return [
        f"llama.cpp: trip {_f(res.get('trip_s_median'))} s median, max "
        f"{_f(res.get('trip_s_max'))} s over {len(res.get('trip_runs', []))} runs.",
    ]


def r_certify_campaign(res: JsonObject) -> list[str]:
    out = []
    for c in res["cells"]:
        t = c["time_to_trip"]
        worst = c.get("worst_run") or {}
        out.append(
            f"`{c['experiment']}`, {c['runs']} runs of `gameday run <its file> --repeat "
            f"{c['runs']} --certify` (campaign `{res['run_id']}`"
            + (f" at `{res['campaign_commit']}`" if res.get("campaign_commit") else "")
            + f"): {c['passes_text']} passed, {c['tripped_runs']} tripped, "
            f"{c['inconclusive_runs']} inconclusive; time to trip p50 {_times_s(t['p50'])}, "
            f"p95 {_times_s(t['p95'])} (95 % intervals); worst run {worst.get('name')} "
            f"({_f(worst.get('time_to_trip_s'))} s, load seed {worst.get('load_seed')})."
        )
        cert = c.get("certification") or {}
        if cert.get("sentence"):
            out.extend(["", f"**{cert['sentence']}**"])
    return out


def _times_s(stat: JsonObject) -> str:
    lo, hi = stat["ci95_s"]
    return f"{_f(stat['value_s'])} s [{_f(lo)}, {_f(hi) if hi is not None else 'inf'}]"


def _passed(gate: JsonObject) -> str:
    """``n of m``, naming those that did not pass and their verdict."""
    verdicts = {name: row.get("verdict") for name, row in gate["experiments"].items()}
    others = [f"`{name}` {v}" for name, v in verdicts.items() if v != "pass"]
    passed = f"{len(verdicts) - len(others)} of {len(verdicts)}"
    return f"{passed} ({', '.join(others)})" if others else passed


def r_gate_matrix(res: JsonObject) -> list[str]:
    gates = res["gates"]
    names = list(gates)

    def cell(gate: str, exp: str, key: str) -> str:
        row = gates[gate]["experiments"].get(exp, {})
        verdict = row.get("verdict")
        if verdict in (None, "not run", "not_applicable"):
            return "not applicable" if verdict == "not_applicable" else "not run"
        if key == "time_to_trip_s":
            t = row.get("time_to_trip_s")
            return f"{_f(t)} s" if row.get("tripped") and t is not None else "**never tripped**"
        return _f(row.get(key), 0)

    head = "| | " + " | ".join(gates[g]["label"] for g in names) + " |"
    rows = [head, "| --- |" + " --- |" * len(names)]
    for exp in res["faulty"]:
        rows.append(
            f"| time to trip, `{exp}` | "
            + " | ".join(cell(g, exp, "time_to_trip_s") for g in names)
            + " |"
        )
    for exp in res["faulty"]:
        rows.append(
            f"| drifted answers served, `{exp}` | "
            + " | ".join(cell(g, exp, "drifted_served") for g in names)
            + " |"
        )
    rows.append(
        "| false trips, healthy controls | "
        + " | ".join(f"{gates[g]['false_trips']} of {gates[g]['controls_run']}" for g in names)
        + " |"
    )
    rows.append("| experiments passed | " + " | ".join(_passed(gates[g]) for g in names) + " |")
    controls = ", ".join(f"`{c}`" for c in res["controls"])
    return [
        "The same experiments against three gates (time to trip: from the fault to the "
        "gate's trip; drifted answers served: canary-served requests the kernel fault "
        f"reached; healthy controls: {controls}):",
        "",
        *rows,
    ]


def r_broker_failsafe(res: JsonObject) -> list[str]:
    rows = [
        f"| {i} | {_f(t['failsafe_after_stop_s'])} | "
        f"{', '.join(_f(s, 1) for s in t['router_silent_s']) or '–'} | "
        f"{_f(t['back_after_cont_s'])} | {t['failsafe_entries']} |"
        for i, t in enumerate(res["trials"], 1)
    ]
    return _table(
        f"The broker SIGSTOPped for {_f(res['stop_s'], 0)} s, {len(rows)} times (fail-safe "
        f"bound {_f(res['failsafe_bound_s'], 0)} s; – : not while the broker was stopped):",
        "| stop | SIGSTOP → 0 % canary, s | router silent when it went, s | SIGCONT → "
        "broker config, s | fail-safe entries |",
        rows,
    )


def r_gate_deadman(res: JsonObject) -> list[str]:
    rows = [
        f"| {i} | {_f(t['failsafe_after_stop_s'])} | {_f(t['back_after_cont_s'])} | "
        f"{t['failsafe_entries']} |"
        for i, t in enumerate(res["trials"], 1)
    ]
    return _table(
        f"The gate SIGSTOPped for {_f(res['stop_s'], 0)} s, {len(rows)} times (dead-man time "
        f"{_f(res['deadman_s'], 0)} s, recovery hold {_f(res['recovery_hold_s'], 0)} s; – : "
        "not while the gate was stopped):",
        "| stop | SIGSTOP → 0 % canary, s | SIGCONT → canary back, s | fail-safe entries |",
        rows,
    )


def r_vllm_noise(res: JsonObject) -> list[str]:
    rec, rep = res["recorded"], res["replay"]
    return _table(
        f"Two healthy vLLMs ({res['engine']}): A {res['layouts']['A']}, B "
        f"{res['layouts']['B']}; {res['sampling']}. Recorded, then drawn with replacement "
        "through the gate's statistics at the game day's schedule:",
        "| comparisons | bit-identical | KL mean / p95 / max | top-1 disagreement "
        "| replayed | false trips | per release-hour, 95 % upper bound |",
        [
            f"| {rec['comparisons']} | {rec['identical_share']:.0%} | {rec['kl_mean']:.1e} / "
            f"{rec['kl_p95']:.1e} / {rec['kl_max']:.1e} | {rec['top1_disagreement']:g} | "
            f"{rep['release_hours']:g} release-hours, {rep['baseline_canary_comparisons']:,} "
            f"comparisons | {rep['false_trips']} | "
            f"{rep['false_trips_per_release_hour_cp95_upper']:.3f} |"
        ],
    )


RENDER: dict[str, tuple[Callable[[JsonObject], list[str]], bool]] = {
    # name: (renderer, whether it takes the whole document rather than its "results")
    "router_overhead": (r_router_overhead, False),
    "model_server": (r_model_server, False),
    "broker_api": (r_broker_api, False),
    "report_speed": (r_report_speed, False),
    "gameday_load": (r_gameday_load, False),
    "load_capacity": (r_load_capacity, False),
    "event_loop_stall": (r_event_loop_stall, True),
    "gate_false_alarms": (r_gate_false_alarms, True),
    "gate_detection": (r_gate_detection, False),
    "gate_detection_curve": (r_gate_detection_curve, False),
    "gate_null_stress": (r_gate_null_stress, False),
    "gate_null_outcomes": (r_gate_null_outcomes, False),
    "engine_drift": (r_engine_drift, False),
    "certify_campaign": (r_certify_campaign, False),
    "gate_matrix": (r_gate_matrix, False),
    "broker_failsafe": (r_broker_failsafe, False),
    "broker_failsafe_before": (r_broker_failsafe, False),
    "gate_deadman": (r_gate_deadman, False),
    "vllm_noise": (r_vllm_noise, False),
}


def render(name: str) -> str:
    if name not in RENDER:
        raise SystemExit(f"bench block {name!r}: no such benchmark; known: {', '.join(RENDER)}")
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return (
            f"*Not measured in the current results format: `{COMMANDS[name]}` writes "
            f"`bench/results/{name}.json`, then `bench/quote.py` quotes it here.*\n"
        )
    doc = json.loads(path.read_text())
    doc.setdefault("benchmark", name)
    fn, whole = RENDER[name]
    lines = fn(doc if whole else doc["results"])
    return "\n".join([*lines, "", provenance(doc)]) + "\n"


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = p.parse_args()
    stale = []
    for path in DOCS:
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            if args.check:
                names = [m.group("name") for m in BLOCK.finditer(text)]
                stale.append(f"{path.relative_to(ROOT)} ({', '.join(names)})")
            else:
                path.write_text(new)
                print(f"rewrote {path.relative_to(ROOT)}", file=sys.stderr)
    if stale:
        print(
            "benchmark figures in the docs differ from bench/results/: "
            + "; ".join(stale)
            + ". Run .venv/bin/python bench/quote.py and commit the result.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
