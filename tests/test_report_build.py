"""The whole report: verdicts, the matrix, summary.json, junit.xml, partial data, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import xmlschema
from click.testing import CliRunner

from gameday.load.records import part_path, part_paths
from gameday.report import ReportInputError, build_report
from gameday.report.cli import report_cmd
from gameday.report.missing import Missing
from gameday.report.summary import Summary
from gameday.report.synthetic import LOAD_SCHEMA, Scenario, game_day, write_run
from tests.report_data import hand_made_experiment

XSD = Path(__file__).parent / "data" / "junit.xsd"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def _valid_junit(run: Path, schema: xmlschema.XMLSchema) -> ET.Element:
    schema.validate(str(run / "junit.xml"))  # raises with the reason when invalid
    return ET.parse(run / "junit.xml").getroot()


def _small_game_day(root: Path) -> Path:
    return write_run(root, requests_per_experiment=300, oracle_share=0.1)


# ---------------------------------------------------------------------------------------
# A whole game day


def test_a_healthy_game_day_passes(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    run = _small_game_day(tmp_path / "run")
    summary = build_report(run)
    assert summary.verdict == "pass", summary.reasons
    assert summary.headline == "PASS — all 10 experiments passed"
    assert summary.all_missing() == []
    for name in (
        "summary.json",
        "junit.xml",
        "report.html",
        "timeline.json",
        "matrix.png",
        "matrix.csv",
        "timeline-router-pod-kill.png",
        "heatmap-control.png",
        "heatmap-control.csv",
    ):
        assert (run / name).stat().st_size > 0, name
    doc = json.loads((run / "summary.json").read_text())
    assert doc["verdict"] == "pass"
    assert doc["counts"]["experiments"] == 10 and doc["counts"]["experiments_passed"] == 10
    # Every SLO check with measured vs allowed: the probe outputs and the report's own.
    checks = {(c["experiment"], c["check"], c["source"]): c for c in doc["checks"]}
    det = checks[("router-faulty-kernel", "detection_s", "report timeline")]
    assert (det["measured"], det["allowed"], det["ok"]) == (pytest.approx(1.8), 5.0, True)
    probe = checks[("router-faulty-kernel", "detection_s", "probe 'check-detection_s', method")]
    assert probe["measured"] == pytest.approx(1.8)
    assert checks[("control", "no_trip", "report timeline")]["measured"] == 0
    assert doc["key_figures"]["worst_time_to_trip_s"] == pytest.approx(2.5)
    assert doc["key_figures"]["requests"] == 3000
    assert set(doc["report_build_s"]) >= {"load", "heatmap_cells", "figures", "html", "total"}
    # The matrix: every component x fault cell with its time to trip.
    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    assert matrix.loc[("router", "faulty-kernel"), "text"] == "trip +1.8 s"
    assert matrix.loc[("broker", "pod-kill"), "time_to_trip_s"] == pytest.approx(2.5)
    assert matrix.loc[("rollback", "latency"), "text"] == "no trip"
    assert matrix.loc[("control", "none"), "verdict"] == "pass"
    assert matrix.loc[("control", "latency"), "verdict"] == "not run"
    assert set(matrix["verdict"]) == {"pass", "not run"}
    # junit.xml: one test case per experiment and per SLO check, all passing.
    root = _valid_junit(run, schema)
    assert len(root.findall("testsuite")) == 10
    assert int(root.get("tests", "0")) == 10 + len(doc["checks"])
    assert root.get("failures") == "0" and root.get("errors") == "0"


def test_failures_are_named_in_every_output(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    scenarios = [
        Scenario("control", "control", "none", "no_trip", trips=True),  # a false trip
        Scenario("router-faulty-kernel", "router", "faulty-kernel", "trip", True, detection_s=7.0),
        Scenario("broker-latency", "broker", "latency", "no_trip", False),
        Scenario("rollback-pod-kill", "rollback", "pod-kill", "trip", True),
    ]
    run = write_run(tmp_path / "run", scenarios, requests_per_experiment=200)
    # broker-latency: Chaos Toolkit said "completed" but a method action raised.
    j_path = run / "broker-latency" / "journal.json"
    journal = json.loads(j_path.read_text())
    journal["run"].append(
        {
            "activity": {"type": "action", "name": "inject-latency"},
            "status": "failed",
            "output": None,
            "exception": [
                "Traceback...\n",
                "chaoslib.exceptions.ActivityFailed: router-0 refused the fault: 401\n",
            ],
        }
    )
    j_path.write_text(json.dumps(journal))
    # rollback-pod-kill: gameday run itself failed it.
    r_path = run / "rollback-pod-kill" / "result.json"
    result = json.loads(r_path.read_text())
    result.update(verdict="fail", reasons=["interrupted by SIGTERM"])
    r_path.write_text(json.dumps(result))

    summary = build_report(run)
    assert summary.verdict == "fail"
    by = {e.name: e for e in summary.experiments}
    assert not any(e.passed for e in summary.experiments)
    assert any("no_trip (report timeline): measured 1" in r for r in by["control"].reasons)
    assert any(
        r.startswith("detection_s (report timeline): measured 7 s, over the allowed 5 s")
        for r in by["router-faulty-kernel"].reasons
    )
    # The wording of gameday/evidence (8983bca): one sentence for gameday run and report.
    assert (
        "method action 'inject-latency' failed: router-0 refused the fault: 401 "
        "(Chaos Toolkit exits 0 here)"
    ) in by["broker-latency"].reasons
    assert (
        "gameday run's verdict is 'fail': interrupted by SIGTERM" in by["rollback-pod-kill"].reasons
    )
    assert summary.headline.startswith("FAIL — 4 of 4 experiments failed")

    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    assert matrix.loc[("control", "none"), "text"].startswith("trip +")
    assert matrix.loc[("router", "faulty-kernel"), "verdict"] == "fail"

    root = _valid_junit(run, schema)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    case = suites["router-faulty-kernel"].find("testcase[@name='experiment router-faulty-kernel']")
    assert case is not None
    failure = case.find("failure")
    assert failure is not None and "detection_s" in (failure.get("message") or "")
    slo_case = suites["router-faulty-kernel"].find(
        "testcase[@name='detection_s [report timeline]']"
    )
    assert slo_case is not None and slo_case.find("failure") is not None
    assert int(root.get("failures", "0")) >= 5

    html = (run / "report.html").read_text()
    assert 'id="verdict" class="fail"' in html
    assert "router-0 refused the fault: 401" in html
    doc = json.loads((run / "summary.json").read_text())
    assert doc["key_figures"]["unexpected_trips"] == ["control"]


def test_a_real_journal_status_and_steady_state(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "run",
        [Scenario("router-latency", "router", "latency", "no_trip", False)],
        requests_per_experiment=100,
    )
    j_path = run / "router-latency" / "journal.json"
    journal = json.loads(j_path.read_text())
    journal["status"] = "failed"
    journal["steady_states"]["before"]["steady_state_met"] = False
    j_path.write_text(json.dumps(journal))
    (exp,) = build_report(run).experiments
    assert "Chaos Toolkit's status is 'failed', not 'completed'" in exp.reasons
    assert "the steady state was not met before the method, so the method never ran" in exp.reasons


def _slo_probe_run(name: str, output: dict[str, object]) -> dict[str, object]:
    return {
        "activity": {"type": "probe", "name": name},
        "status": "succeeded",
        "output": output,
        "tolerance_met": True,
    }


def _not_measured(check: str) -> dict[str, object]:
    return {
        "check": check,
        "measured": None,
        "allowed": 5.0,
        "unit": "s",
        "ok": True,
        "detail": {"status": "not_measured", "why": "nothing to measure yet"},
    }


def test_slo_probes_not_measured_before_the_method_are_not_checks(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    run = tmp_path / "run"
    folder = hand_made_experiment(run)
    j_path = folder / "journal.json"
    journal = json.loads(j_path.read_text())
    before = journal["steady_states"]["before"]["probes"]
    after = journal["steady_states"]["after"]["probes"]
    before.append(_slo_probe_run("weights-applied-in-time", _not_measured("weights_applied_s")))
    after.append(
        _slo_probe_run(
            "weights-applied-in-time",
            {
                "check": "weights_applied_s",
                "measured": 3.4,
                "allowed": 5.0,
                "unit": "s",
                "ok": True,
                "detail": {"status": "measured"},
            },
        )
    )
    j_path.write_text(json.dumps(journal))
    summary = build_report(run)
    assert summary.verdict == "pass", summary.reasons
    (exp,) = summary.experiments
    sources = [c.source for c in exp.checks if c.check == "weights_applied_s"]
    # The measured one and the report's own; not the one before the method.
    assert sources == ["probe 'weights-applied-in-time', hypothesis after", "report timeline"]
    assert exp.not_measured_before == ["weights_applied_s (probe 'weights-applied-in-time')"]
    assert any(
        n.startswith("Not counted as checks: SLO probes in the hypothesis before")
        for n in exp.notes
    )
    doc = json.loads((run / "summary.json").read_text())
    assert not any("hypothesis before" in c["source"] for c in doc["checks"])
    assert doc["counts"]["checks"] == len(exp.checks)
    assert doc["experiments"][0]["not_measured_before_method"] == exp.not_measured_before
    root = _valid_junit(run, schema)
    names = [c.get("name") for c in root.iter("testcase")]
    assert "weights_applied_s [probe 'weights-applied-in-time', hypothesis after]" in names
    assert not any("hypothesis before" in (n or "") for n in names)
    html = (run / "report.html").read_text()
    assert "hypothesis after" in html
    assert "weights-applied-in-time&#39;, hypothesis before" not in html
    assert "Not counted as checks" in html


def test_an_slo_probe_not_measured_after_the_method_fails(tmp_path: Path) -> None:
    run = tmp_path / "run"
    folder = hand_made_experiment(run)
    j_path = folder / "journal.json"
    journal = json.loads(j_path.read_text())
    journal["steady_states"]["after"]["probes"].append(
        _slo_probe_run("gate-trips-in-time", _not_measured("detection_s"))
    )
    j_path.write_text(json.dumps(journal))
    summary = build_report(run)
    assert summary.verdict == "fail"
    (exp,) = summary.experiments
    (check,) = [c for c in exp.checks if c.source.endswith("hypothesis after")]
    assert check.ok is False and check.measured is None
    assert (
        "detection_s (probe 'gate-trips-in-time', hypothesis after): not measured — the probe "
        "measured nothing in the hypothesis after"
    ) in exp.reasons[0]


# ---------------------------------------------------------------------------------------
# Partial data: a report that says what is missing, never a crash


def _missing(summary: Summary, experiment: str | None = None) -> dict[str, str]:
    return {m.piece: m.problem for m in summary.all_missing() if m.experiment == experiment}


def _partial_case(tmp_path: Path, schema: xmlschema.XMLSchema) -> tuple[Summary, str]:
    summary = build_report(tmp_path / "run")
    assert summary.verdict == "fail"
    root = _valid_junit(tmp_path / "run", schema)
    assert int(root.get("errors", "0")) >= 1
    html = (tmp_path / "run" / "report.html").read_text()
    assert "What is missing" in html
    return summary, html


def test_missing_journal(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    (folder / "journal.json").unlink()
    summary, html = _partial_case(tmp_path, schema)
    assert _missing(summary, "router-faulty-kernel") == {"journal.json": "absent"}
    (exp,) = summary.experiments
    assert "incomplete: journal.json absent" in exp.reasons
    # Without the journal the gameday extension is unknown: the folder name places it.
    assert (exp.component, exp.fault, exp.expect) == ("router", "faulty-kernel", None)
    assert exp.timeline.tripped  # the timeline still works from the other files
    assert "no Chaos Toolkit status" in html


def _split_into_parts(folder: Path, name: str = "records.parquet") -> int:
    """Leave ``name`` as two closed parts, as a load run SIGKILLed before merging does."""
    table = pq.read_table(folder / name)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), part_path(folder / name, 1))
    pq.write_table(table.slice(half), part_path(folder / name, 2))
    (folder / name).unlink()
    return table.num_rows


def test_records_of_an_interrupted_load_run_are_read_from_its_parts(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    rows = _split_into_parts(folder)
    summary = build_report(tmp_path / "run")
    _valid_junit(tmp_path / "run", schema)
    notes = [m for m in summary.all_missing() if m.experiment == "router-faulty-kernel"]
    (note,) = [m for m in notes if m.piece == "records.parquet"]
    assert f"{rows} rows read from 2 closed part(s)" in note.problem
    assert "interrupted" in note.problem and note.required is False
    assert not any("unreadable" in m.problem for m in notes)
    (exp,) = summary.experiments
    assert exp.figures["requests"] == rows
    # The last canary request (+3.0 s) comes from the records, not "no load records".
    assert exp.timeline.milestone("last_canary_request").source != "no load records"
    assert "What is missing" in (tmp_path / "run" / "report.html").read_text()


def test_an_unreadable_part_is_named_and_fails_the_verdict(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    rows = _split_into_parts(folder)
    part_path(folder / "records.parquet", 3).write_bytes(b"PAR1 cut short by a SIGKILL")
    summary, _ = _partial_case(tmp_path, schema)
    notes = {m.piece: m for m in summary.all_missing() if m.experiment == "router-faulty-kernel"}
    bad = notes["records.part-*.parquet"]
    assert bad.problem.startswith("1 part(s) unreadable: records.part-000003.parquet")
    assert bad.required is True
    assert f"{rows} rows read from 2 closed part(s)" in notes["records.parquet"].problem
    assert summary.experiments[0].figures["requests"] == rows


def test_a_folder_holding_only_parts_is_an_experiment_and_its_rows_are_read(
    tmp_path: Path,
) -> None:
    from gameday.report.frames import LOAD_COLUMNS, LOAD_KEY_COLUMNS, read_parquet
    from gameday.report.loader import (
        _is_experiment_dir,
    )

    source = hand_made_experiment(tmp_path / "made")
    only = tmp_path / "only-parts"
    only.mkdir()
    table = pq.read_table(source / "records.parquet")
    pq.write_table(table.slice(0, 4), part_path(only / "records.parquet", 1))
    pq.write_table(table.slice(4), part_path(only / "records.parquet", 2))
    assert _is_experiment_dir(only)
    missing: list[Missing] = []
    frame = read_parquet(
        only / "records.parquet", LOAD_COLUMNS, LOAD_KEY_COLUMNS, "x", missing, True, "effect"
    )
    assert len(frame) == table.num_rows
    assert sorted(frame["start_time"]) == sorted(table.column("start_time").to_pylist())
    assert [m.piece for m in missing] == ["records.parquet"]
    assert "6 rows read from 2 closed part(s)" in missing[0].problem
    # Every part unreadable: absent, named, and the verdict fails.
    for p in part_paths(only / "records.parquet"):
        p.write_bytes(b"not parquet")
    missing = []
    frame = read_parquet(
        only / "records.parquet", LOAD_COLUMNS, LOAD_KEY_COLUMNS, "x", missing, True, "effect"
    )
    assert frame.empty
    assert {m.piece: m.required for m in missing} == {
        "records.part-*.parquet": True,
        "records.parquet": True,
    }
    assert "none could be read" in next(m.problem for m in missing if m.piece == "records.parquet")


def test_empty_records(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    pq.write_table(LOAD_SCHEMA.empty_table(), folder / "records.parquet")
    summary, _ = _partial_case(tmp_path, schema)
    assert _missing(summary, "router-faulty-kernel")["records.parquet"] == "has no rows"
    assert summary.experiments[0].figures["requests"] == 0


def test_unreadable_records_and_oracle(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    (folder / "records.parquet").write_bytes(b"PAR1 this is not parquet")
    (folder / "oracle.parquet").write_bytes(b"")
    summary, _ = _partial_case(tmp_path, schema)
    missing = _missing(summary, "router-faulty-kernel")
    assert missing["records.parquet"].startswith("unreadable (")
    assert missing["oracle.parquet"].startswith("unreadable (")
    (exp,) = summary.experiments
    assert exp.heatmap is None
    assert exp.timeline.milestone("first_drifted_sample").source.startswith("gate trip evidence")


def test_records_without_the_columns_the_report_needs(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    table = pq.read_table(folder / "records.parquet").drop_columns(["served_by", "ttft_s"])
    pq.write_table(table, folder / "records.parquet")
    summary, _ = _partial_case(tmp_path, schema)
    assert "served_by" in _missing(summary, "router-faulty-kernel")["records.parquet"]


def test_interrupted_run(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    run = tmp_path / "run"
    folder = hand_made_experiment(run)
    (folder / "result.json").unlink()
    (folder / "timeline.json").unlink()
    with (folder / "faults.jsonl").open("a") as fh:
        fh.write('{"action": "clear", "time": 17000')  # torn by a SIGKILL
    (run / "run.json").write_text(
        json.dumps(
            {"run_id": "r1", "experiments": ["router-faulty-kernel", "broker-pod-kill", "control"]}
        )
    )
    summary, html = _partial_case(tmp_path, schema)
    assert summary.run_id == "r1"
    assert [e.name for e in summary.experiments] == [
        "router-faulty-kernel",
        "broker-pod-kill",
        "control",
    ]
    first = _missing(summary, "router-faulty-kernel")
    assert first["result.json"] == "absent" and first["timeline.json"] == "absent"
    assert first["faults.jsonl"] == "unreadable line(s) [4]"
    assert _missing(summary, "broker-pod-kill") == {
        "experiment folder": "listed in run.json but absent"
    }
    by = {e.name: e for e in summary.experiments}
    assert (by["broker-pod-kill"].component, by["broker-pod-kill"].fault) == ("broker", "pod-kill")
    assert by["router-faulty-kernel"].timeline.milestone("fault_injected").since_fault_s == 0.0
    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    assert matrix.loc[("broker", "pod-kill"), "text"] == "unknown: no timeline"
    assert matrix.loc[("broker", "pod-kill"), "verdict"] == "fail"
    assert "listed in run.json but absent" in html


def test_a_run_that_stopped_before_its_first_experiment(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"run_id": "r2", "experiments": []}))
    summary, _ = _partial_case(tmp_path, schema)
    assert summary.experiments == []
    assert summary.headline == "FAIL — the run has no experiments"
    assert _missing(summary) == {"experiments": "no experiment folder in the run"}


def test_broken_json_files(tmp_path: Path, schema: xmlschema.XMLSchema) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    (folder / "journal.json").write_text('{"status": "compl')
    (folder / "timeline.json").write_text("[1, 2]")
    (tmp_path / "run" / "run.json").write_text("not json")
    summary, _ = _partial_case(tmp_path, schema)
    missing = _missing(summary, "router-faulty-kernel")
    assert missing["journal.json"].startswith("unreadable (")
    assert missing["timeline.json"] == "is not a JSON object"
    assert _missing(summary)["run.json"].startswith("unreadable (")


def test_experiment_without_a_gameday_extension(
    tmp_path: Path, schema: xmlschema.XMLSchema
) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    journal = json.loads((folder / "journal.json").read_text())
    journal["experiment"]["extensions"] = []
    (folder / "journal.json").write_text(json.dumps(journal))
    summary, _ = _partial_case(tmp_path, schema)
    assert _missing(summary, "router-faulty-kernel") == {
        "gameday extension": "absent from the experiment"
    }


def test_slo_given_as_configuration_variables(tmp_path: Path) -> None:
    folder = hand_made_experiment(tmp_path / "run")
    journal = json.loads((folder / "journal.json").read_text())
    journal["experiment"]["configuration"] = {
        "detection_s": {"type": "env", "key": "GAMEDAY_DETECTION_S", "default": 2.0},
        "rollback_s": "4",
    }
    journal["experiment"]["extensions"][0]["slo"] = {
        "detection_s": "${detection_s}",
        "rollback_s": "${rollback_s}",
        "weights_applied_s": "soon",
    }
    (folder / "journal.json").write_text(json.dumps(journal))
    (exp,) = build_report(tmp_path / "run").experiments
    allowed = {c.check: c.allowed for c in exp.checks if c.source == "report timeline"}
    assert allowed == {
        "detection_s": 2.0,
        "weights_applied_s": 5.0,
        "rollback_s": 4.0,
        "rollback_complete_s": 30.0,
    }
    assert "slo.weights_applied_s = 'soon' is not a number: the default is used" in exp.notes


# ---------------------------------------------------------------------------------------
# Usage errors and the command


@pytest.mark.parametrize("case", ["absent", "file", "experiment-folder", "empty", "reports-root"])
def test_usage_errors(tmp_path: Path, case: str) -> None:
    target = tmp_path / "x"
    if case == "file":
        target.write_text("")
    elif case == "experiment-folder":
        target = hand_made_experiment(tmp_path / "run")
    elif case == "empty":
        target.mkdir()
    elif case == "reports-root":
        write_run(
            target / "run-1",
            [Scenario("control", "control", "none", "no_trip", False)],
            requests_per_experiment=10,
        )
    with pytest.raises(ReportInputError) as err:
        build_report(target)
    assert str(target) in str(err.value)
    result = CliRunner().invoke(report_cmd, [str(target)])
    assert result.exit_code == 2, result.output
    assert "RUN_DIR" in result.output


def test_nested_experiment_folders(tmp_path: Path) -> None:
    hand_made_experiment(tmp_path / "run" / "router", "faulty-kernel")
    hand_made_experiment(
        tmp_path / "run" / "broker",
        "latency",
        component="broker",
        fault="latency",
        expect="no_trip",
        events=[],
    )
    summary = build_report(tmp_path / "run")
    assert [e.name for e in summary.experiments] == ["broker/latency", "router/faulty-kernel"]
    assert (tmp_path / "run" / "heatmap-router-faulty-kernel.png").exists()
    assert summary.verdict == "pass", summary.reasons


def test_a_report_that_cannot_be_written_is_not_a_fail_verdict(tmp_path: Path) -> None:
    hand_made_experiment(tmp_path / "run")
    (tmp_path / "run" / "report.html").mkdir()  # something in the way
    result = CliRunner().invoke(report_cmd, [str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "cannot read the run folder or write the report" in result.output


def test_non_finite_numbers_in_inputs_give_valid_json(tmp_path: Path) -> None:
    folder = hand_made_experiment(
        tmp_path / "run",
        outputs=[
            {
                "check": "ttft_p99_s",
                "measured": float("nan"),
                "allowed": 1.0,
                "unit": "s",
                "ok": False,
                "detail": {"worst": float("inf")},
            }
        ],
    )
    assert "NaN" in (folder / "journal.json").read_text()
    build_report(tmp_path / "run")
    text = (tmp_path / "run" / "summary.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    check = next(c for c in doc["checks"] if c["check"] == "ttft_p99_s")
    assert check["measured"] is None and check["detail"] == {"worst": None}
    json.loads(
        (tmp_path / "run" / "timeline.json").read_text(),
        parse_constant=lambda c: pytest.fail(f"{c} in timeline.json"),
    )


def test_cli_bad_option_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(report_cmd, [str(tmp_path), "--bin-s", "0"])
    assert result.exit_code == 2 and "--bin-s" in result.output


def _gameday(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "gameday.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=env,
    )


def _report_of_one(folder: Path, scenario: Scenario) -> subprocess.CompletedProcess[str]:
    """``gameday report`` on a synthetic run (in ``folder``) of one experiment."""
    write_run(folder, [scenario], requests_per_experiment=100)
    return _gameday("report", str(folder))


def test_command_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good"
    res = _report_of_one(good, Scenario("router-latency", "router", "latency", "no_trip", False))
    assert res.returncode == 0, res.stderr
    assert "verdict: PASS — all 1 experiment passed" in res.stdout
    assert f"report: {(good / 'report.html').resolve()}" in res.stdout

    res = _report_of_one(tmp_path / "bad", Scenario("control", "control", "none", "no_trip", True))
    assert res.returncode == 1, res.stderr
    assert "verdict: FAIL — 1 of 1 experiment failed: control" in res.stdout
    assert "no_trip (report timeline)" in res.stdout

    res = _gameday("report", str(tmp_path / "nowhere"))
    assert res.returncode == 2
    assert "does not exist" in res.stderr


def test_game_day_scenarios_cover_the_matrix() -> None:
    cells = {(s.component, s.fault) for s in game_day()}
    assert len(cells) == 10
    assert ("control", "none") in cells


def _dependency_doc() -> dict[str, object]:
    def stats(n: int, errors: int, p50: float, p99: float) -> dict[str, object]:
        return {"requests": n, "errors": errors, "error_rate": errors / n,
                "ttft_p50_s": p50, "ttft_p99_s": p99}  # fmt: skip

    phase = {"all": stats(100, 1, 0.2, 0.5), "baseline": stats(95, 1, 0.2, 0.5),
             "canary": stats(5, 0, 0.19, 0.3)}  # fmt: skip
    return {
        "fault": {"kind": "pause", "start": 1_700_000_010.0, "end": 1_700_000_014.0},
        "watch_ticks": 40,
        "unhealthy_ticks": {"router-0": 0, "router-1": 0, "broker": 0},
        "model_dependency_results": {"baseline": {"timeout": 12.0}, "canary": {"timeout": 2.0}},
        "before": phase,
        "during": {**phase, "canary": stats(4, 0, 0.31, 0.42)},
        "after": phase,
        "recovery_s": 1.25,
        "recovery_rule": "error rate <= 0.030 and TTFT p50 <= 0.350 s over 2 s of requests",
        "max_e2e_s": 1.5,
    }


def test_the_dependency_experiments_have_a_row_and_a_section(tmp_path: Path) -> None:
    """#16 item 6: the matrix's dependency row; per dependency experiment, errors and TTFT
    per variant during and after the fault, time to recover and whether the gate stayed
    quiet or tripped as expected, in summary.json and report.html. One whose summary
    file is missing is listed as such, not left out."""
    scenarios = [
        Scenario("dependency-latency", "dependency", "latency", "no_trip", False),
        Scenario("dependency-faulty-kernel", "dependency", "faulty-kernel", "trip", True),
    ]
    run = write_run(tmp_path / "run", scenarios, requests_per_experiment=200)
    (run / "dependency-latency" / "dependency.json").write_text(json.dumps(_dependency_doc()))
    build_report(run)
    doc = json.loads((run / "summary.json").read_text())
    by = {d["name"]: d for d in doc["dependency"]}
    lat = by["dependency-latency"]
    assert lat["expect"] == "no_trip" and lat["tripped"] is False
    assert lat["gate_as_expected"] is True
    assert lat["fault_s"] == 4.0 and lat["recovery_s"] == 1.25
    assert lat["phases"]["during"]["canary"] == {
        "requests": 4, "errors": 0, "error_rate": 0.0, "ttft_p50_s": 0.31, "ttft_p99_s": 0.42,
    }  # fmt: skip
    assert lat["phases"]["after"]["baseline"]["errors"] == 1
    fk = by["dependency-faulty-kernel"]
    assert fk["tripped"] is True and fk["gate_as_expected"] is True
    assert "dependency.json" in fk["problem"]
    html = (run / "report.html").read_text()
    section = html[html.index('<section id="dependency">') :]
    section = section[: section.index("</section>")]
    assert "dependency-latency" in section and "dependency-faulty-kernel" in section
    assert "stayed quiet" in section and "tripped" in section
    assert "recovered 1.25 s after its end" in section
    assert section.count("NOT as expected") == 0
    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    assert matrix.loc[("dependency", "latency"), "text"] == "no trip"
    assert matrix.loc[("dependency", "faulty-kernel"), "text"].startswith("trip +")


def test_a_gate_that_trips_on_a_shared_outage_is_shown_as_not_expected(tmp_path: Path) -> None:
    scenarios = [Scenario("dependency-pod-kill", "dependency", "pod-kill", "no_trip", True)]
    run = write_run(tmp_path / "run", scenarios, requests_per_experiment=200)
    (run / "dependency-pod-kill" / "dependency.json").write_text(json.dumps(_dependency_doc()))
    build_report(run)
    entry = json.loads((run / "summary.json").read_text())["dependency"][0]
    assert entry["gate_as_expected"] is False and entry["verdict"] == "fail"
    assert "NOT as expected" in (run / "report.html").read_text()


def test_a_run_without_dependency_experiments_has_no_dependency_section(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [Scenario("control", "control", "none", "no_trip", False)],
                    requests_per_experiment=200)  # fmt: skip
    build_report(run)
    assert "dependency" not in json.loads((run / "summary.json").read_text())
    assert '<section id="dependency">' not in (run / "report.html").read_text()
    matrix = pd.read_csv(run / "matrix.csv")
    assert set(matrix.loc[matrix.component == "dependency", "verdict"]) == {"not run"}
