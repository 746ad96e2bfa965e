"""The evidence core under the probes: the probes and the report pick the same reference
fault from one ledger, and the blind-gate check names every router that leaves the gate
blind (a blind gate never trips, so it must never pass quietly)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gameday.evidence import checks
from gameday.report.loader import load_experiment
from gameday.report.timeline import find_fault
from probes._context import append_run_json_lines
from probes._run_records import reference, run_json_lines
from tests.report_data import FAULT, hand_made_experiment
from tests.run_support import ledger_entry, slo_detail


def test_the_probes_and_the_report_pick_the_same_reference_fault(tmp_path: Path) -> None:
    """A pod kill before a latency injection, no kernel fault: the probes took the kill
    (first fault of either kind) and the report the injection (injections first); one
    rule now, so both time the experiment from the kill."""
    folder = hand_made_experiment(tmp_path)
    (folder / "faults.jsonl").unlink()
    ledger_entry(
        folder, action="kill", time=FAULT, component="router", replica="router-0", kind="pod-kill"
    )
    ledger_entry(
        folder, action="inject", time=FAULT + 1, component="router", kind="latency", params={}
    )
    probe = reference({"gameday_run_dir": str(folder)})
    assert probe is not None and probe.entry["action"] == "kill"
    report_time, why = find_fault(load_experiment(folder.name, folder), [])
    assert report_time == probe.time == FAULT
    assert why == "faults.jsonl: first kill in the ledger (pod-kill on router-0)"


def test_the_blind_gate_check_names_every_router_that_leaves_it_blind() -> None:
    health: dict[str, dict[str, Any] | None] = {
        "router-0": {"gate_auth": "unauthorized"},
        "router-1": {"gate_auth": {"status": "ok"}, "sample_queue": {"gate_error": "HTTP 403"}},
        "router-2": {"gate_auth": "ok"},
        "router-3": None,  # did not answer /health
    }
    out = checks.gate_blind(health, "watching", 4)
    assert (out["check"], out["measured"], out["allowed"], out["ok"]) == ("gate_blind", 2, 0, False)
    assert set(slo_detail(out)["blind"]) == {"router-0", "router-1"}
    assert out["detail"]["unreachable"] == ["router-3"]
    assert (
        "router-0: its sample pushes are refused by the gate (unauthorized)"
        in slo_detail(out)["why"]
    )
    # An inconclusive gate (no canary sample for its no-data timeout) is blind itself.
    quiet = checks.gate_blind({"router-2": {"gate_auth": "ok"}}, "inconclusive", 1)
    assert (quiet["measured"], quiet["ok"]) == (1, False) and "gate" in slo_detail(quiet)["blind"]
    # Every router can see and the gate is watching: the gate can see.
    seen = checks.gate_blind({"router-2": {"gate_auth": "ok"}}, "watching", 1)
    assert (seen["measured"], seen["ok"]) == (0, True)
    # No router answered: whether the gate can see is unknown, which fails (fail-closed).
    unknown = checks.gate_blind({"router-3": None}, "watching", 1)
    assert unknown["ok"] is False and unknown["measured"] is None
    assert "no router answered /health" in slo_detail(unknown)["why"]


def test_rows_added_to_a_run_file_are_read_back_in_order(tmp_path: Path) -> None:
    cfg: dict[str, Any] = {"gameday_run_dir": str(tmp_path / "run")}
    assert run_json_lines(cfg, "rows.jsonl") == []  # no file yet
    append_run_json_lines(cfg, "rows.jsonl", [{"b": 1, "a": 2}])
    path = append_run_json_lines(cfg, "rows.jsonl", [{"c": 3}, {"d": None}])
    assert path == tmp_path / "run" / "rows.jsonl"
    assert path.read_text() == '{"a": 2, "b": 1}\n{"c": 3}\n{"d": null}\n'
    assert run_json_lines(cfg, "rows.jsonl") == [{"b": 1, "a": 2}, {"c": 3}, {"d": None}]
