"""``gameday.run.folder.RunFolder``: one experiment's folder as its activities read it
(the probes over it: tests/test_probes_units.py, tests/test_evidence_traffic_promql.py).

- before anything (no load, no fault) the records are not measured; once a fault is in
  the ledger, missing, incomplete or unreadable records fail closed, naming why;
- the experiment began at the earlier of the load's start and the reference fault, less
  the clock slack;
- the traffic of a load that has not stopped, or whose records cannot be read, is a
  RecordsError saying how to get evidence.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gameday.evidence.milestones import CLOCK_SLACK_S
from gameday.run.folder import NOT_YET, RecordsError, RunFolder
from tests.run_support import ledger_entry, record, slo_detail, write_load_state, write_records

T0 = 1_800_000_000.0


def test_an_empty_folder_has_nothing_yet(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run")
    assert folder.load_state() is None and folder.reference() is None
    assert folder.before_anything() and folder.experiment_began() is None
    assert folder.json_lines("sent.jsonl") == [] and folder.fault_rows() == []
    result = folder.records("error_rate", 0.01, "ratio")
    assert isinstance(result, dict) and result["detail"]["why"] == NOT_YET


def test_a_fault_without_records_fails_closed(tmp_path: Path) -> None:
    ledger_entry(tmp_path, time=T0)
    folder = RunFolder(tmp_path)
    assert not folder.before_anything()
    assert folder.first_fault("inject", "kernel") is not None
    assert folder.first_fault("kill") is None
    result = folder.records("error_rate", 0.01, "ratio")
    assert isinstance(result, dict) and result["ok"] is False
    assert "probes.load control" in slo_detail(result)["why"]


def test_unreadable_records_fail_closed_naming_the_file(tmp_path: Path) -> None:
    write_load_state(tmp_path)
    (tmp_path / "records.parquet").write_text("not parquet")
    result = RunFolder(tmp_path).records("error_rate", 0.01, "ratio")
    assert isinstance(result, dict) and result["ok"] is False
    assert slo_detail(result)["why"].startswith("cannot read the load records ")
    with pytest.raises(RecordsError, match="cannot read the load records"):
        RunFolder(tmp_path).records_traffic(T0, None)


def test_the_experiment_began_at_the_earlier_of_load_and_fault(tmp_path: Path) -> None:
    write_load_state(tmp_path, started_at=T0 + 5)
    ledger_entry(tmp_path, time=T0 + 2)
    assert RunFolder(tmp_path).experiment_began() == pytest.approx(T0 + 2 - CLOCK_SLACK_S)


def test_records_and_their_traffic_after_a_time(tmp_path: Path) -> None:
    write_load_state(tmp_path)
    rows = [
        record(start_time=T0 + i, served_by="canary" if i < 2 else "baseline") for i in range(5)
    ]
    write_records(tmp_path, rows)
    folder = RunFolder(tmp_path)
    frame = folder.records("error_rate", 0.01, "ratio")
    assert isinstance(frame, pd.DataFrame) and len(frame) == 5
    traffic = folder.records_traffic(T0 + 1, None)
    assert traffic["source"] == "records" and traffic["total"] == 4 and traffic["canary"] == 1


def test_traffic_of_a_running_load_says_how_to_get_evidence(tmp_path: Path) -> None:
    with pytest.raises(RecordsError, match="the load has not run"):
        RunFolder(tmp_path).records_traffic(T0, None)
    write_load_state(tmp_path, state="running")
    with pytest.raises(RecordsError, match=r"is 'running', not stopped.*canary_promql"):
        RunFolder(tmp_path).records_traffic(T0, None)


def test_traffic_by_version_counts_the_canary_rows_and_needs_their_column(
    tmp_path: Path,
) -> None:
    write_load_state(tmp_path)
    rows = [
        record(start_time=T0 + i, served_by="", model_version="v2" if i % 2 else "v1")
        for i in range(4)
    ]
    write_records(tmp_path, rows)
    traffic = RunFolder(tmp_path).records_traffic(T0 + 1, "v2")
    assert traffic["canary"] == 2 and traffic["total"] == 3
    assert traffic["canary_rule"] == "model_version == 'v2'"
    # Records from a writer that has no model_version column: no evidence by version.
    pd.DataFrame(rows).drop(columns=["model_version"]).to_parquet(tmp_path / "records.parquet")
    with pytest.raises(RecordsError, match=r"cannot read the load records .*model_version"):
        RunFolder(tmp_path).records_traffic(T0, "v2")
