"""The timeline: each milestone's time, where it came from, and each duration vs its SLO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gameday.report.loader import ExperimentData, load_experiment
from gameday.report.summary import journal_findings, summarise_experiment
from gameday.report.synthetic_events import BrokerEvent
from gameday.report.timeline import DEFAULT_SLO_S, Timeline, build_timeline
from tests.report_data import (
    EXPECTED_SINCE_FAULT,
    FAULT,
    hand_made_events,
    hand_made_experiment,
)


def _timeline(folder: Path) -> tuple[ExperimentData, Timeline]:
    exp = load_experiment(folder.name, folder)
    return exp, build_timeline(exp, journal_findings(exp.name, exp.journal).probe_allowed)


@pytest.mark.parametrize("plain", [False, True], ids=["old-new-changes", "plain-changes"])
def test_every_milestone_and_duration(tmp_path: Path, plain: bool) -> None:
    folder = hand_made_experiment(tmp_path, events=hand_made_events(plain=plain))
    exp, tl = _timeline(folder)
    assert exp.missing == []
    got = {m.name: m.since_fault_s for m in tl.milestones}
    assert got == pytest.approx(EXPECTED_SINCE_FAULT, abs=1e-6)
    assert tl.reference == "fault" and tl.reference_time == FAULT
    # Steps: since the previous milestone that happened.
    steps = [m.step_s for m in tl.milestones]
    assert steps == pytest.approx([None, 1.2, 1.3, 0.9, -0.4, 0.9], abs=1e-6)
    # Where each time came from is said.
    src = {m.name: m.source for m in tl.milestones}
    assert "kernel fault injected on model-canary" in src["fault_injected"]
    assert src["first_drifted_sample"].startswith("oracle")
    assert tl.milestone("first_drifted_sample").detail["kl_mean"] == pytest.approx(0.09)
    assert "phase tripped" in src["gate_tripped"]
    assert tl.milestone("weights_applied").detail["routers"] == ["router-0", "router-1"]
    assert tl.milestone("last_canary_request").detail["requests"] == 2
    # The older trip (before the journal's start) is not this experiment's.
    assert tl.trips == 1 and tl.tripped
    assert tl.trip is not None and tl.trip["bucket"] == "2k-4k"


def test_each_duration_against_its_slo(tmp_path: Path) -> None:
    folder = hand_made_experiment(
        tmp_path, slo={"detection_s": 2.0, "weights_applied_s": 5.0, "rollback_s": 2.5}
    )
    exp, tl = _timeline(folder)
    checks = {c.check: c for c in tl.checks}
    assert set(checks) == {"detection_s", "weights_applied_s", "rollback_s", "rollback_complete_s"}
    assert (checks["detection_s"].measured, checks["detection_s"].allowed) == pytest.approx(
        (2.5, 2.0)
    )
    assert checks["detection_s"].ok is False
    assert checks["weights_applied_s"].ok is True
    assert checks["rollback_s"].measured == pytest.approx(3.0)
    assert checks["rollback_s"].ok is False
    # Not in the experiment's slo: the report's default, and it says so.
    assert checks["rollback_complete_s"].allowed == DEFAULT_SLO_S["rollback_complete_s"]
    assert tl.milestone("rollback_complete").slo_source == "report default"
    summary = summarise_experiment(exp, journal_findings(exp.name, exp.journal), tl, None)
    assert summary.verdict == "fail"
    assert any(
        r.startswith("detection_s (report timeline): measured 2.5 s, over") for r in summary.reasons
    )
    assert any(r.startswith("rollback_s (report timeline)") for r in summary.reasons)


def test_weights_applied_is_the_routers_canary_off_at_when_the_annotation_has_it(
    tmp_path: Path,
) -> None:
    events = hand_made_events()
    annotation = next(e for e in events if e["seq"] == 6)
    # The last router stopped sending canary traffic at +2.7; the executor annotated at +3.4.
    annotation["change"]["canary_off_at"] = FAULT + 2.7
    folder = hand_made_experiment(tmp_path, slo={"weights_applied_s": 3.0}, events=events)
    _, tl = _timeline(folder)
    m = tl.milestone("weights_applied")
    assert m.since_fault_s == pytest.approx(2.7)
    assert m.step_s == pytest.approx(0.2)  # since the trip at +2.5
    assert "canary_off_at" in m.source and "annotated 0.70 s later" in m.source
    assert m.detail["time_source"] == "canary_off_at"
    assert m.detail["annotation_time"] == FAULT + 3.4
    check = next(c for c in tl.checks if c.check == "weights_applied_s")
    # Within 3 s, although the annotation itself came at +3.4.
    assert (check.measured, check.ok) == (pytest.approx(2.7), True)
    # Without it, the annotation's own time, and the source says so.
    del annotation["change"]["canary_off_at"]
    folder = hand_made_experiment(tmp_path / "old", slo={"weights_applied_s": 3.0}, events=events)
    _, tl = _timeline(folder)
    m = tl.milestone("weights_applied")
    assert m.since_fault_s == pytest.approx(3.4)
    assert m.detail["time_source"] == "annotation_time"
    assert "no canary_off_at" in m.source
    check = next(c for c in tl.checks if c.check == "weights_applied_s")
    assert (check.measured, check.ok) == (pytest.approx(3.4), False)


def test_first_drift_falls_back_to_the_gates_evidence(tmp_path: Path) -> None:
    folder = hand_made_experiment(tmp_path)
    (folder / "oracle.parquet").unlink()
    _, tl = _timeline(folder)
    m = tl.milestone("first_drifted_sample")
    assert m.source == "gate trip evidence: first_sample_time"
    assert m.since_fault_s == pytest.approx(0.9)


def test_fault_time_from_the_brokers_annotation_without_a_ledger(tmp_path: Path) -> None:
    folder = hand_made_experiment(tmp_path)
    (folder / "faults.jsonl").unlink()
    exp, tl = _timeline(folder)
    assert tl.milestone("fault_injected").time == FAULT
    assert "fault_injected annotation" in tl.milestone("fault_injected").source
    assert [m.piece for m in exp.missing] == ["faults.jsonl"]
    assert not exp.missing[0].required


def test_latency_experiment_uses_its_own_fault_and_expects_no_trip(tmp_path: Path) -> None:
    folder = hand_made_experiment(tmp_path, "router-latency", fault="latency", expect="no_trip")
    # Only the latency injection in the ledger.
    lines = (folder / "faults.jsonl").read_text().splitlines()
    (folder / "faults.jsonl").write_text(lines[0] + "\n")
    exp, tl = _timeline(folder)
    assert tl.milestone("fault_injected").time == FAULT - 0.5
    assert "latency injected on router" in tl.milestone("fault_injected").source
    (check,) = tl.checks
    assert (check.check, check.measured, check.allowed, check.ok) == ("no_trip", 1.0, 0.0, False)
    summary = summarise_experiment(exp, journal_findings(exp.name, exp.journal), tl, None)
    assert summary.verdict == "fail"
    assert any("no_trip" in r and "tripped 1 time" in r for r in summary.reasons)


def test_expected_trip_that_never_came(tmp_path: Path) -> None:
    events = [e for e in hand_made_events() if e["seq"] == 3]  # only the fault annotation
    folder = hand_made_experiment(tmp_path, events=events)
    exp, tl = _timeline(folder)
    assert not tl.tripped
    checks = {c.check: c for c in tl.checks}
    assert checks["detection_s"].measured is None and checks["detection_s"].ok is False
    # No trip, so canary traffic never stopped: the last canary request is still measured.
    assert checks["rollback_s"].measured == pytest.approx(3.0)
    summary = summarise_experiment(exp, journal_findings(exp.name, exp.journal), tl, None)
    assert "the experiment expects a trip; the broker's history shows none" in summary.reasons


def test_no_canary_request_after_the_fault_meets_the_rollback_slo(tmp_path: Path) -> None:
    from gameday.report.synthetic_files import write_records

    folder = hand_made_experiment(tmp_path)
    write_records(
        folder / "records.parquet",
        {"start_time": [FAULT - 2, FAULT + 1], "served_by": ["canary", "baseline"]},
    )
    _, tl = _timeline(folder)
    check = next(c for c in tl.checks if c.check == "rollback_s")
    assert (check.measured, check.ok) == (0.0, True)
    assert tl.milestone("last_canary_request").time is None


def test_control_run_is_measured_from_its_start(tmp_path: Path) -> None:
    folder = hand_made_experiment(
        tmp_path, "control", component="control", fault="none", expect="no_trip", events=[]
    )
    (folder / "faults.jsonl").unlink()
    exp, tl = _timeline(folder)
    assert exp.missing == []  # a control run needs no fault ledger
    assert tl.reference == "start"
    assert tl.milestone("fault_injected").time is None
    assert [(c.check, c.ok) for c in tl.checks] == [("no_trip", True)]


def test_timeline_json_is_written_with_every_milestone(tmp_path: Path) -> None:
    from gameday.report import build_report

    hand_made_experiment(tmp_path / "run")
    build_report(tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "timeline.json").read_text())
    tl = doc["experiments"]["router-faulty-kernel"]
    assert {m["name"]: m["since_fault_s"] for m in tl["milestones"]} == pytest.approx(
        EXPECTED_SINCE_FAULT, abs=1e-4
    )
    assert [c["check"] for c in tl["checks"]] == [
        "detection_s",
        "weights_applied_s",
        "rollback_s",
        "rollback_complete_s",
    ]


def test_weights_applied_without_the_annotation_says_what_the_routers_report(
    tmp_path: Path,
) -> None:
    events = [e for e in hand_made_events() if e["seq"] != 6]  # no routers_applied
    folder = hand_made_experiment(tmp_path, events=events)
    doc = json.loads((folder / "timeline.json").read_text())
    doc["routers"] = [
        {"router_id": "router-0", "applied_revision": 8},
        {"router_id": "router-1", "applied_revision": 7},
    ]
    (folder / "timeline.json").write_text(json.dumps(doc))
    _, tl = _timeline(folder)
    m = tl.milestone("weights_applied")
    assert m.time is None and m.ok is False
    assert m.source == (
        "no routers_applied annotation; at collection all 2 live routers "
        "reported revision >= 7 (canary weight 0), time unknown"
    )


def test_the_probes_and_the_report_time_one_history_alike(tmp_path: Path) -> None:
    """One history, two readers: the probes' SLO checks (live) and the report's timeline
    (from the files) time every milestone from the same fault with the same core. A
    ``routers_applied`` annotation between the fault and the trip (an earlier rollback's)
    is not weight 0 for this trip, for either of them."""
    from gameday.evidence import checks
    from gameday.evidence.faults import reference_fault
    from probes._run_records import read_records
    from tests.report_data import hand_made_faults

    events = hand_made_events()
    stale: BrokerEvent = {
        "seq": 35,
        "time": FAULT + 1.0,
        "revision": 5,
        "actor": "rollback",
        "reason": "an earlier rollback",
        "change": {"annotation": "routers_applied", "revision": 5, "canary_off_at": FAULT + 0.8},
    }
    events.insert(3, stale)
    folder = hand_made_experiment(tmp_path, events=events)
    _, tl = _timeline(folder)
    report = {c.check: c.measured for c in tl.checks}
    ref = reference_fault(hand_made_faults())
    assert ref is not None and ref.time == FAULT
    for check in ("detection_s", "weights_applied_s", "rollback_complete_s"):
        probe = checks.broker_milestone(check, [dict(e) for e in events], ref.entry, 10.0)
        assert probe["measured"] == pytest.approx(report[check]), check
    assert report["weights_applied_s"] == pytest.approx(3.4)  # the annotation after the trip
    frame = read_records(folder / "records.parquet")
    probe = checks.canary_served_after(frame, ref.entry, 10.0)
    assert probe["measured"] == pytest.approx(report["rollback_s"]) == pytest.approx(3.0)


def test_without_the_annotation_weight_0_is_read_from_the_routers_themselves(
    tmp_path: Path,
) -> None:
    """No routers_applied annotation, but every live router says since when its canary
    weight is 0 (its heartbeat's canary_off_since): the latest of them is the milestone."""
    events = [e for e in hand_made_events() if e["seq"] != 6]  # no routers_applied
    folder = hand_made_experiment(tmp_path, events=events)
    doc = json.loads((folder / "timeline.json").read_text())
    doc["routers"] = [
        {"router_id": "router-0", "applied_revision": 8, "canary_off_since": FAULT + 2.6},
        {"router_id": "router-1", "applied_revision": 8, "canary_off_since": FAULT + 2.9},
    ]
    (folder / "timeline.json").write_text(json.dumps(doc))
    _, tl = _timeline(folder)
    m = tl.milestone("weights_applied")
    assert m.since_fault_s == pytest.approx(2.9) and m.ok is True
    assert m.detail["time_source"] == "routers" and m.detail["routers"] == 2
    assert "2 live routers' own canary_off_since" in m.source
    # One router that still sends the canary traffic: weight 0 is not everywhere.
    doc["routers"][1]["canary_off_since"] = None
    (folder / "timeline.json").write_text(json.dumps(doc))
    _, tl = _timeline(folder)
    assert tl.milestone("weights_applied").time is None
