"""The verdict is fail-closed: every case where Chaos Toolkit exits 0 but the experiment
did not pass becomes a failing verdict. Each case is a real ``chaos run`` (through
``gameday.run.chaos.ChaosRun``, as ``gameday run`` runs it) of a tiny experiment whose
Python activities fail in the right place; no stack needed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gameday.run.chaos import ChaosRun
from gameday.run.verdict import Evidence, decide, journal_reasons
from tests.procs import wait_for
from tests.run_support import tiny_activity, tiny_experiment
from tests.verdict_support import passing_journal


def run_tiny(folder: Path, experiment: Path) -> tuple[int | None, dict[str, Any]]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "TINY_DIR": str(folder),
    }
    lines: list[tuple[str, str]] = []
    chaos = ChaosRun(
        experiment, folder / "out", env, on_line=lambda lv, m: lines.append((lv, m)), cwd=folder
    )
    result = chaos.start().finish(grace_s=120)
    journal = json.loads((folder / "out" / "journal.json").read_text())
    assert any("Experiment ended with status" in m for _, m in lines)  # progress was followed
    return result.exit_code, journal


def assessed(*args: Any, **kwargs: Any) -> Evidence:
    """Evidence whose gate evidence and load were assessed and found sufficient (the
    inconclusive verdict has its own tests: tests/test_inconclusive.py)."""
    kwargs.setdefault("inconclusive", [])
    return Evidence(*args, **kwargs)


def verdict(journal: dict[str, Any], exit_code: int | None) -> tuple[str, list[str]]:
    # Everything else in order, so only the journal can fail the verdict.
    return decide(assessed(exit_code, journal, records_rows=10, trips_in_window=0))


def test_a_passing_tiny_experiment_passes(tmp_path: Path) -> None:
    code, journal = run_tiny(tmp_path, tiny_experiment(tmp_path, "fine"))
    assert code == 0 and journal_reasons(journal) == []
    assert verdict(journal, code) == ("pass", [])
    assert (tmp_path / "rolled-back").exists()  # rollbacks played (strategy always)


def test_steady_state_unmet_before_the_method_fails(tmp_path: Path) -> None:
    code, journal = run_tiny(tmp_path, tiny_experiment(tmp_path, "unmet", before="not_ok"))
    assert code == 0, "Chaos Toolkit exits 0 here: the reason this verdict exists"
    assert journal["run"] == []
    result, reasons = verdict(journal, code)
    assert result == "fail"
    assert any("not met before the method, so the method never ran" in r for r in reasons)
    assert any("'steady'" in r and "outside its tolerance" in r for r in reasons)


def test_a_method_action_that_raised_fails(tmp_path: Path) -> None:
    method = [tiny_activity("inject", "boom"), tiny_activity("after", "ok")]
    code, journal = run_tiny(tmp_path, tiny_experiment(tmp_path, "raised", method=method))
    assert code == 0, "Chaos Toolkit exits 0 here: the reason this verdict exists"
    assert journal["status"] == "completed"
    result, reasons = verdict(journal, code)
    assert result == "fail"
    assert any(
        "method action 'inject' failed" in r and "expected the fault to be accepted" in r
        for r in reasons
    )


def test_a_failed_slo_in_the_method_fails(tmp_path: Path) -> None:
    method = [tiny_activity("slo", "slo", kind="probe", measured=3.0, allowed=2.0)]
    code, journal = run_tiny(tmp_path, tiny_experiment(tmp_path, "slo", method=method))
    assert code == 0
    result, reasons = verdict(journal, code)
    assert result == "fail"
    assert any("SLO 'tiny_s'" in r and "measured 3 s, allowed 2.0 s" in r for r in reasons)


def test_an_interrupting_control_fails_and_still_rolls_back(tmp_path: Path) -> None:
    experiment = tiny_experiment(tmp_path, "interrupted", control=True)
    code, journal = run_tiny(tmp_path, experiment)
    assert journal["status"] == "interrupted"
    assert (tmp_path / "rolled-back").exists()
    result, reasons = verdict(journal, code)
    assert result == "fail"
    assert any("status is 'interrupted'" in r for r in reasons)


def test_a_deviated_experiment_fails(tmp_path: Path) -> None:
    # The steady state holds before the method and not after it: the probe is true until
    # the method's action leaves a marker file.
    method = [tiny_activity("m", "mark", marker="marked")]
    exp = tiny_experiment(tmp_path, "deviated", before="until_marked", method=method)
    code, journal = run_tiny(tmp_path, exp)
    assert journal["deviated"] is True and code == 1
    result, reasons = verdict(journal, code)
    assert result == "fail"
    assert any("deviated" in r for r in reasons)
    assert any("chaos run exited with code 1" in r for r in reasons)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_interrupts_chaos_and_rollbacks_run(tmp_path: Path, inherited: str) -> None:
    """``ignored``: gameday itself was started with SIGINT ignored (``cmd &`` in a script,
    nohup, many CI runners), which exec passes on to chaos; the interrupt must still reach
    it (it did not: chaos ran on, was SIGKILLed after the grace, and no rollback ran)."""
    method = [tiny_activity("wait", "slow", seconds=120)]
    experiment = tiny_experiment(tmp_path, "sigint", method=method)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TINY_DIR": str(tmp_path)}
    before = signal.signal(
        signal.SIGINT, signal.SIG_IGN if inherited == "ignored" else signal.default_int_handler
    )
    try:
        chaos = ChaosRun(experiment, tmp_path / "out", env, cwd=tmp_path).start()
    finally:
        signal.signal(signal.SIGINT, before)
    wait_for(lambda: (tmp_path / "slow-started").exists(), timeout=60, what="the slow action")
    t0 = time.monotonic()
    chaos.interrupt()
    result = chaos.finish(grace_s=60)
    assert time.monotonic() - t0 < 60, "chaos must stop promptly on SIGINT"
    assert result.interrupted and result.exit_code is not None
    journal = json.loads((tmp_path / "out" / "journal.json").read_text())
    assert journal["status"] == "interrupted"
    assert (tmp_path / "rolled-back").exists(), "rollbacks must run on an interrupt"
    ev = assessed(result.exit_code, journal, 10, 0, interrupted="SIGINT")
    result_, reasons = decide(ev)
    assert result_ == "fail" and any("interrupted (SIGINT)" in r for r in reasons)


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (assessed(0, None, 10, 0), "no journal.json"),
        (assessed(None, {}, 10, 0), "did not exit by itself"),
        (assessed(0, None, 10, 0, setup_error="the stack did not start"), "did not start"),
        (assessed(0, {}, 10, 0, timed_out_s=600), "did not finish within 600 s"),
        (assessed(0, {}, 10, 0, faults_left=["kernel on model-canary-0"]), "still active"),
    ],
)
def test_other_failures_are_named(evidence: Evidence, expected: str) -> None:
    result, reasons = decide(evidence)
    assert result == "fail" and any(expected in r for r in reasons), reasons


def test_the_brokers_history_must_agree_with_what_the_experiment_expects() -> None:
    assert decide(assessed(0, passing_journal("trip"), 10, 1)) == ("pass", [])
    result, reasons = decide(assessed(0, passing_journal("trip"), 10, 0))
    assert result == "fail" and "expects a trip" in reasons[0]
    result, reasons = decide(assessed(0, passing_journal("no_trip"), 10, 2))
    assert result == "fail" and "shows 2 trip(s)" in reasons[0]
    result, reasons = decide(assessed(0, passing_journal("no_trip"), 10, None))
    assert result == "fail" and "could not be read" in reasons[0]


def test_a_missed_trip_says_how_many_users_the_faulty_canary_served() -> None:
    _, reasons = decide(assessed(0, passing_journal("trip"), 10, 0, exposed=7))
    assert reasons == [
        "the experiment expects a trip; the broker's history shows none",
        "the gate never tripped while 7 answers from the faulty canary were served to "
        "users after the fault (canary-served requests the fault reaches, from the load "
        "records)",
    ]
    # None served (or a trip): nothing more to say than the miss itself.
    assert len(decide(assessed(0, passing_journal("trip"), 10, 0, exposed=0))[1]) == 1
    assert decide(assessed(0, passing_journal("trip"), 10, 1, exposed=7)) == ("pass", [])


def test_records_and_the_extension_are_required() -> None:
    result, reasons = decide(assessed(0, passing_journal("no_trip"), 0, 0))
    assert result == "fail" and any("no load records" in r for r in reasons)
    journal = passing_journal()
    journal["experiment"]["extensions"] = []
    result, reasons = decide(assessed(0, journal, 10, 1))
    assert result == "fail" and any("no 'gameday' extension" in r for r in reasons)


def test_an_slo_not_measured_is_a_pass_only_before_the_method() -> None:
    def probe(status: str) -> dict[str, Any]:
        output: dict[str, Any] = {"check": "weights_applied_s", "measured": None}
        output.update(allowed=5.0, unit="s", ok=True, detail={"status": status})
        return {
            "activity": {"name": "weights-applied-in-time"},
            "status": "succeeded",
            "output": output,
        }

    journal = passing_journal()
    journal["steady_states"] = {
        "before": {"steady_state_met": True, "probes": [probe("not_measured")]},
        "after": {"steady_state_met": True, "probes": []},
    }
    assert decide(assessed(0, journal, 10, 1)) == ("pass", [])
    journal["steady_states"]["after"]["probes"] = [probe("not_measured")]
    result, reasons = decide(assessed(0, journal, 10, 1))
    assert result == "fail"
    assert reasons == [
        "SLO 'weights_applied_s' (probe 'weights-applied-in-time', after the method) was not "
        "measured: the probe saw no load and no fault"
    ]


def _failed_after(
    journal: dict[str, Any], probe: str, activity: str, output: dict[str, Any]
) -> dict[str, Any]:
    """``journal`` with its hypothesis (one probe) met before the method and failed after
    it: the probe's ``activity`` returned ``output`` out of tolerance."""
    run = {
        "activity": {"name": activity},
        "status": "succeeded",
        "tolerance_met": False,
        "output": output,
    }
    journal["deviated"] = True
    journal["experiment"]["steady-state-hypothesis"] = {"probes": [{"name": probe}]}
    journal["steady_states"] = {
        "before": {"steady_state_met": True, "probes": []},
        "after": {"steady_state_met": False, "probes": [run]},
    }
    return journal


def _blind_journal(expect: str) -> dict[str, Any]:
    """A run whose hypothesis after the method found a router's samples refused."""
    journal = passing_journal(expect)
    output = {
        "check": "gate_blind",
        "measured": 1.0,
        "allowed": 0.0,
        "unit": "routers",
        "ok": False,
        "detail": {
            "status": "measured",
            "why": "router-1: its sample pushes are refused by the gate (unauthorized)",
        },
    }
    return _failed_after(journal, "gate-sees", "gate-sees-every-router", output)


def test_a_blind_gate_fails_the_run_and_says_so() -> None:
    # No trip happened: without the gate_blind check a no_trip experiment would pass.
    result, reasons = decide(assessed(0, _blind_journal("no_trip"), 10, 0))
    assert result == "fail"
    assert (
        "the gate was blind (probe 'gate-sees-every-router', after the method): router-1: "
        "its sample pushes are refused by the gate (unauthorized)"
    ) in reasons


def test_expect_blind_passes_only_when_the_harness_noticed() -> None:
    assert decide(assessed(0, _blind_journal("blind"), 10, 0)) == ("pass", [])
    # chaos exits 1 for the deviation the blindness causes: expected as well
    assert decide(assessed(1, _blind_journal("blind"), 10, 0)) == ("pass", [])
    result, reasons = decide(assessed(0, passing_journal("blind"), 10, 0))
    assert result == "fail" and "a blind gate would have gone unnoticed" in reasons[-1]
    result, reasons = decide(assessed(0, _blind_journal("blind"), 10, 1))
    assert result == "fail" and any("shows 1 trip(s)" in r for r in reasons)


def _colour_journal(expect: str, hop: str | None) -> dict[str, Any]:
    """A run whose colouring probe after the method found the tag lost at ``hop``."""
    journal = passing_journal(expect)
    if expect == "colour_lost":
        journal["experiment"]["extensions"][0]["lost_at"] = "router"
    if hop is None:
        return journal
    output = {
        "check": "colouring_fidelity",
        "measured": 0.0,
        "allowed": 1.0,
        "unit": "share",
        "ok": False,
        "detail": {
            "status": "measured",
            "why": f"hop {hop!r} (the router saw the request) lost the colour of 30 of 30 "
            "request(s), e.g. colour-1 (tag 'gameday' -> None)",
        },
    }
    return _failed_after(journal, "colouring", "colouring-fidelity", output)


def test_expect_colour_lost_passes_only_when_the_probe_names_that_hop() -> None:
    assert decide(assessed(1, _colour_journal("colour_lost", "router"), 10, 0)) == ("pass", [])
    result, reasons = decide(assessed(0, _colour_journal("colour_lost", None), 10, 0))
    assert result == "fail" and "a lost tag would have gone unnoticed" in reasons[-1]
    result, reasons = decide(assessed(1, _colour_journal("colour_lost", "model"), 10, 0))
    assert result == "fail" and any("hop 'model'" in r for r in reasons)
    result, reasons = decide(assessed(1, _colour_journal("colour_lost", "router"), 10, 1))
    assert result == "fail" and any("shows 1 trip(s)" in r for r in reasons)


def test_a_lost_colour_fails_an_ordinary_game_day_naming_the_hop() -> None:
    result, reasons = decide(assessed(1, _colour_journal("no_trip", "router"), 10, 0))
    assert result == "fail"
    assert any("colouring_fidelity" in r and "hop 'router'" in r for r in reasons)
