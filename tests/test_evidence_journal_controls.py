"""The two controls that write into the journal's experiment: ``probes.journal`` (the SLOs as
judged) and ``probes.load`` (where the load stands). Both go through one
``rewrite_journal_extensions``; these pin what each writes, and that a journal with no
experiment is left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probes import journal, load


def _state(extensions: list[Any]) -> dict[str, Any]:
    return {"experiment": {"title": "t", "extensions": extensions}}


def test_journal_control_writes_the_resolved_slos_and_keeps_the_declared_ones() -> None:
    other = {"name": "other", "slo": {"detection_s": "${detection_s}"}}
    state = _state([{"name": "gameday", "slo": {"detection_s": "${detection_s}"}}, other])
    journal.after_experiment_control(None, state=state, configuration={"detection_s": 7})
    gameday, kept = state["experiment"]["extensions"]
    assert gameday == {
        "name": "gameday",
        "slo": {"detection_s": 7},
        "slo_declared": {"detection_s": "${detection_s}"},
    }
    assert kept == other
    # run again (a second control pass): it resolves from the declared references
    journal.after_experiment_control(None, state=state, configuration={"detection_s": 9})
    assert state["experiment"]["extensions"][0]["slo"] == {"detection_s": 9}


def test_journal_controls_leave_a_journal_without_an_experiment_alone(tmp_path: Path) -> None:
    (tmp_path / "load.json").write_text(json.dumps({"state": "stopped"}))
    for state in (None, {"experiment": "not an object"}, {}):
        before = json.dumps(state)
        journal.after_experiment_control(None, state=state, configuration={})
        load.after_experiment_control(
            None, state=state, configuration={"gameday_run_dir": str(tmp_path)}
        )
        assert json.dumps(state) == before


def test_load_control_replaces_its_extension_with_where_the_load_stands(tmp_path: Path) -> None:
    (tmp_path / "load.json").write_text(json.dumps({"state": "stopped", "records": "r.jsonl"}))
    gameday = {"name": "gameday", "slo": {}}
    state = _state([{"name": "gameday-load", "state": "running"}, gameday])
    load.after_experiment_control(
        None, state=state, configuration={"gameday_run_dir": str(tmp_path)}
    )
    assert state["experiment"]["extensions"] == [
        gameday,
        {"name": "gameday-load", "state": "stopped", "records": "r.jsonl"},
    ]


def test_load_control_without_a_load_state_writes_nothing(tmp_path: Path) -> None:
    state = _state([{"name": "gameday", "slo": {}}])
    load.after_experiment_control(
        None, state=state, configuration={"gameday_run_dir": str(tmp_path)}
    )
    assert state["experiment"]["extensions"] == [{"name": "gameday", "slo": {}}]
