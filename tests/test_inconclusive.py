"""Inconclusive is a verdict (issue #14, items 5 and 6), on crafted inputs: a gate that saw
too little, or a load generator that could not keep up, makes an experiment
``inconclusive`` — never a pass, and never a fail on the gate's merits — while the run's
own failures still fail it (fail wins). The run exits 3; the report, summary.json and
junit.xml say so with the reasons. (A real run that ends inconclusive:
tests/test_inconclusive_run.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from gameday.load.generator import LoadTolerances, load_problems
from gameday.report import build_report
from gameday.report.synthetic import write_run
from gameday.run.runner import EXIT_CODES, EXIT_INCONCLUSIVE, run_verdict
from gameday.run.sufficiency import (
    buckets_at_or_above,
    gate_reasons,
    load_reasons,
    since_start,
    summarise_gate,
    thresholds,
)
from gameday.run.verdict import NOT_JUDGED, Evidence, decide
from tests.short_run_support import gameday_run
from tests.verdict_support import passing_journal

BUCKETS = ("0-512", "512-1k", "1k-2k", "2k-4k", "4k+")


def _gate_doc(per_bucket: dict[str, tuple[int, int]], **limits: int | None) -> dict[str, Any]:
    """gate-evidence.json with (comparisons, canary outcomes) per bucket."""
    state = {
        "state": "watching",
        "buckets": {
            b: {"comparisons": c, "outcomes": {"canary": o, "baseline": 10 * o}}
            for b, (c, o) in per_bucket.items()
        },
    }
    given = thresholds(limits.get("min_comparisons"), limits.get("min_canary_outcomes"), environ={})
    return {"ok": True, **summarise_gate(state), "thresholds": given.to_json()}


GENEROUS = {b: (40, 40) for b in BUCKETS}


# --- the verdict --------------------------------------------------------------------


def test_too_little_evidence_makes_a_no_trip_inconclusive_not_a_pass() -> None:
    why = gate_reasons(_gate_doc({"0-512": (3, 2)}), "no_trip", False, None)
    assert len(why) == 2
    assert why[0].startswith("the gate saw 3 baseline-canary comparisons in all buckets")
    assert "fewer than the 30 needed (GAMEDAY_MIN_COMPARISONS)" in why[0]
    assert why[1].startswith("the gate saw 2 canary outcomes, fewer than the 10 needed")
    verdict, reasons = decide(Evidence(0, passing_journal("no_trip"), 10, 0, inconclusive=why))
    assert (verdict, reasons) == ("inconclusive", why)


def test_enough_evidence_lets_the_gate_be_judged() -> None:
    assert gate_reasons(_gate_doc(GENEROUS), "no_trip", False, None) == []
    assert decide(Evidence(0, passing_journal("no_trip"), 10, 0, inconclusive=[])) == ("pass", [])
    verdict, reasons = decide(Evidence(0, passing_journal("no_trip"), 10, 1, inconclusive=[]))
    assert verdict == "fail" and reasons == [
        "the experiment expects no trip; the broker's history shows 1 trip(s)"
    ]


def test_evidence_never_assessed_is_inconclusive() -> None:
    # fail-closed: before issue #14 this was a pass
    verdict, reasons = decide(Evidence(0, passing_journal("no_trip"), 10, 0))
    assert verdict == "inconclusive"
    assert reasons == [
        "the evidence (what the gate saw, whether the load was valid) was not assessed"
    ]
    assert gate_reasons(None, "no_trip", False, None) == [
        "no gate-evidence.json: what the gate saw is unknown, so its 'no trip' proves nothing"
    ]
    unreadable = {"ok": False, "error": "connection refused"}
    assert gate_reasons(unreadable, "no_trip", False, None) == [
        "the gate's counters could not be read (connection refused): what it saw is unknown"
    ]


def test_a_missed_trip_with_no_comparison_where_the_fault_acts_is_not_the_gates_fault() -> None:
    # plenty of comparisons on short prompts, none at or above the kernel's 2048 tokens
    doc = _gate_doc({"0-512": (500, 100), "512-1k": (80, 20), "2k-4k": (0, 0), "4k+": (1, 0)})
    why = gate_reasons(doc, "trip", False, 2048)
    assert why == [
        "the gate saw 1 baseline-canary comparisons in the buckets the faulty kernel touches "
        "(prompts >= 2048 tokens: 2k-4k, 4k+), fewer than the 30 needed "
        "(GAMEDAY_MIN_COMPARISONS): its missed trip proves nothing (more load, a higher "
        "canary weight or a longer run)"
    ]
    verdict, reasons = decide(Evidence(0, passing_journal("trip"), 10, 0, inconclusive=why))
    assert verdict == "inconclusive"
    assert reasons == [
        *why,
        NOT_JUDGED + "the experiment expects a trip; the broker's history shows none",
    ]
    # the same buckets full of comparisons: the missed trip is the gate's, a fail
    doc = _gate_doc({"0-512": (500, 100), "2k-4k": (30, 30), "4k+": (1, 0)})
    assert gate_reasons(doc, "trip", False, 2048) == []
    # a trip shows the gate saw, whatever the counters
    assert gate_reasons(_gate_doc({}), "trip", True, 2048) == []


def test_the_run_itself_failing_wins_over_inconclusive() -> None:
    why = ["the gate saw 0 baseline-canary comparisons in all buckets, ..."]
    cases = [
        Evidence(
            0, passing_journal("no_trip"), 10, 0, inconclusive=why, faults_left=["kernel on x"]
        ),
        Evidence(0, passing_journal("no_trip"), 0, 0, inconclusive=why),
        Evidence(0, passing_journal("no_trip"), 10, None, inconclusive=why),
        Evidence(0, passing_journal("no_trip"), 10, 0, inconclusive=why, interrupted="SIGINT"),
        Evidence(
            0, passing_journal("no_trip"), 10, 0, inconclusive=why, load_problem="Locust killed"
        ),
    ]
    for ev in cases:
        verdict, reasons = decide(ev)
        assert verdict == "fail", ev
        assert why[0] not in reasons


def test_the_runs_exit_code_fail_wins_then_inconclusive() -> None:
    def r(*verdicts: str) -> list[dict[str, Any]]:
        return [{"verdict": v} for v in verdicts]

    assert run_verdict(r("pass", "pass")) == "pass"
    assert run_verdict(r("pass", "inconclusive")) == "inconclusive"
    assert run_verdict(r("inconclusive", "fail")) == "fail"
    assert run_verdict(r()) == "fail"
    assert EXIT_CODES["inconclusive"] == EXIT_INCONCLUSIVE == 3
    assert (EXIT_CODES["pass"], EXIT_CODES["fail"]) == (0, 1)


# --- thresholds and buckets ------------------------------------------------------------


def test_thresholds_come_from_the_experiment_then_the_environment() -> None:
    env = {"GAMEDAY_MIN_COMPARISONS": "7", "GAMEDAY_MIN_CANARY_OUTCOMES": "9"}
    assert thresholds(environ={}).to_json() == {"min_comparisons": 30, "min_canary_outcomes": 10}
    assert thresholds(environ=env).to_json() == {"min_comparisons": 7, "min_canary_outcomes": 9}
    assert thresholds(3, "4", environ=env).to_json() == {
        "min_comparisons": 3,
        "min_canary_outcomes": 4,
    }
    with pytest.raises(ValueError, match=r"\$GAMEDAY_MIN_COMPARISONS: min_comparisons must be"):
        thresholds(environ={"GAMEDAY_MIN_COMPARISONS": "lots"})
    with pytest.raises(ValueError, match="must be a whole number from 0 to"):
        thresholds(-1)


def test_the_buckets_a_kernel_touches() -> None:
    assert buckets_at_or_above(list(BUCKETS), 2048) == ["2k-4k", "4k+"]
    assert buckets_at_or_above(list(BUCKETS), 2000) == ["1k-2k", "2k-4k", "4k+"]
    assert buckets_at_or_above(list(BUCKETS), 0) == list(BUCKETS)
    assert buckets_at_or_above(["odd"], 4096) == ["odd"]  # unknown label: counted


# --- the load generator ------------------------------------------------------------------

HEALTHY = {
    "requests_sent": 600,
    "test_wall_s": 30.0,
    "achieved_rps": 20.0,
    "cpu_s": 12.0,
    "max_cpu_percent": 55.0,
    "cpu_warnings": 0,
    "peak_users": 16,
    "trace_requests": 0,
    "trace_late_starts": 0,
}


def _problems(summary: dict[str, Any], log: str = "", **tol: Any) -> list[str]:
    return list(load_problems(summary, 16, LoadTolerances(**tol), log)["problems"])


def test_a_generator_that_kept_up_is_valid() -> None:
    gen = load_problems(HEALTHY, 16, LoadTolerances())
    assert gen["valid"] is True and gen["problems"] == []
    assert (gen["achieved_rps"], gen["cpu_fraction"], gen["late_fraction"]) == (20.0, 0.4, None)


def test_a_generator_short_of_cpu_is_invalid() -> None:
    assert _problems({**HEALTHY, "cpu_warnings": 1})[0].startswith(
        "Locust warned 'CPU usage above 90%'"
    )
    warned_in_log = _problems(HEALTHY, "WARNING/root: CPU usage above 90%! This may ...")
    assert len(warned_in_log) == 1 and "CPU usage above 90%" in warned_in_log[0]
    busy = _problems({**HEALTHY, "cpu_s": 28.5})
    assert busy == [
        "Locust used 95% of a core on average over the test (more than 90%, "
        "GAMEDAY_LOAD_MAX_CPU_FRACTION): the generator was short of CPU"
    ]


def test_a_late_or_short_load_is_invalid() -> None:
    late = {**HEALTHY, "trace_requests": 200, "trace_late_starts": 20, "max_trace_lag_s": 1.5}
    assert _problems(late) == [
        "20 of 200 trace requests started late (10.0%, more than 5.0%, "
        "GAMEDAY_LOAD_MAX_LATE_FRACTION; worst lag 1.5 s): the open loop did not keep its "
        "schedule (add users or slow the trace down)"
    ]
    assert _problems({**HEALTHY, "peak_users": 5}) == [
        "only 5 of the 16 users ever ran: the closed loop fell short of its target"
    ]
    assert _problems(HEALTHY, target_rps=30.0) == [
        "the load reached 20 requests/s, below 0.8 x the target 30 requests/s "
        "(GAMEDAY_LOAD_TARGET_RPS)"
    ]
    assert _problems(HEALTHY, target_rps=24.0) == []
    assert _problems({"requests_sent": 5})[0].startswith(
        "the load's summary has no generator figures"
    )


def test_load_tolerances_from_the_environment_name_a_bad_value() -> None:
    t = LoadTolerances.from_env(
        {"GAMEDAY_LOAD_TARGET_RPS": "12", "GAMEDAY_LOAD_MAX_CPU_FRACTION": "0.5"}
    )
    assert (t.target_rps, t.max_cpu_fraction, t.min_rate_ratio) == (12.0, 0.5, 0.8)
    with pytest.raises(ValueError, match="GAMEDAY_LOAD_TARGET_RPS='inf': give a number"):
        LoadTolerances.from_env({"GAMEDAY_LOAD_TARGET_RPS": "inf"})


def test_an_invalid_load_makes_the_verdict_inconclusive() -> None:
    gen = load_problems({**HEALTHY, "cpu_warnings": 1}, 16, LoadTolerances())
    load = {"state": "stopped", "summary": {"generator": gen}}
    why = load_reasons(load)
    assert why == [f"the load generator is not valid: {gen['problems'][0]}"]
    assert load_reasons({"state": "stopped", "summary": {}}) == [
        "the load has no generator check (load.json summary.generator): whether Locust kept "
        "up is unknown"
    ]
    assert (
        load_reasons(
            {"state": "stopped", "summary": {"generator": {"valid": True, "problems": []}}}
        )
        == []
    )
    verdict, reasons = decide(Evidence(0, passing_journal("trip"), 10, 1, inconclusive=why))
    assert (verdict, reasons) == ("inconclusive", why)  # a trip is not credited either


# --- the report ------------------------------------------------------------------------


def test_the_report_says_inconclusive_with_the_reason(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", requests_per_experiment=300, oracle_share=0.1)
    result_path = next(p for p in sorted(run.rglob("result.json")) if "control" in str(p))
    result = json.loads(result_path.read_text())
    why = "the gate saw 2 baseline-canary comparisons in all buckets, fewer than the 20 needed"
    result.update(verdict="inconclusive", reasons=[why])
    result_path.write_text(json.dumps(result))
    summary = build_report(run)
    assert summary.verdict == "inconclusive"
    assert summary.headline.startswith("INCONCLUSIVE — 1 of 10 experiments could not show")
    doc = json.loads((run / "summary.json").read_text())
    assert doc["verdict"] == "inconclusive" and doc["counts"]["experiments_inconclusive"] == 1
    (exp,) = [e for e in doc["experiments"] if e["verdict"] != "pass"]
    assert exp["verdict"] == "inconclusive" and exp["reasons"][0] == why
    xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit.xsd")).validate(
        str(run / "junit.xml")
    )
    errors = [
        e
        for e in ET.parse(run / "junit.xml").getroot().iter("error")
        if e.get("type") == "Inconclusive"
    ]
    assert len(errors) == 1 and errors[0].get("message") == why
    html = (run / "report.html").read_text()
    assert "INCONCLUSIVE" in html and why in html
    assert '<header id="verdict" class="inconclusive"' in html  # styled, not white on white
    # `gameday report` exits 3 as `gameday run` does: never 0, and not a plain failure.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "gameday"), "report", str(run)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    # a piece the report needs is missing: that fails it, the inconclusive reason still said
    (result_path.parent / "records.parquet").unlink()
    exp = next(e for e in build_report(run).experiments if e.name == result["experiment"])
    assert exp.verdict == "fail" and f"also inconclusive: {why}" in exp.reasons
    # fail wins in the run's verdict too
    other = next(p for p in sorted(run.rglob("result.json")) if p != result_path)
    failing = json.loads(other.read_text())
    failing.update(verdict="fail", reasons=["chaos run exited with code 2"])
    other.write_text(json.dumps(failing))
    assert build_report(run).verdict == "fail"


def test_a_stack_that_outlives_an_experiment_is_counted_from_its_start() -> None:
    # a target the run did not start keeps the gate's counters of earlier experiments
    start = _gate_doc({"0-512": (100, 50), "2k-4k": (40, 40)})
    end = _gate_doc({"0-512": (103, 52), "2k-4k": (41, 40), "4k+": (2, 1)})
    mine = since_start(end, start)
    assert (mine["comparisons"], mine["canary_outcomes"]) == (6, 3)
    buckets = mine["buckets"]
    assert isinstance(buckets, dict) and buckets["2k-4k"]["comparisons"] == 1
    assert gate_reasons(end, "no_trip", False, None) == []  # the whole history would pass
    assert len(gate_reasons(mine, "no_trip", False, None)) == 2  # this experiment's does not
    # a reset in between (a new canary version): the end's counters are all this one's
    reset = {**end, "resets": 1}
    assert since_start(reset, start)["comparisons"] == end["comparisons"]
    assert since_start(end, None) == end


@pytest.mark.parametrize(
    ("var", "value", "said"),
    [
        ("GAMEDAY_MIN_COMPARISONS", "lots", "$GAMEDAY_MIN_COMPARISONS: min_comparisons must be"),
        ("GAMEDAY_LOAD_MAX_CPU_FRACTION", "nan", "GAMEDAY_LOAD_MAX_CPU_FRACTION='nan': give a"),
    ],
)
def test_a_bad_evidence_threshold_stops_the_run_before_anything_starts(
    tmp_path: Path, var: str, value: str, said: str
) -> None:
    proc = gameday_run(
        "experiments/control.yaml",
        "--out",
        str(tmp_path / "reports"),
        env={var: value},
        timeout_s=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in " ".join((proc.stdout + proc.stderr).split())
    assert not (tmp_path / "reports").exists()
