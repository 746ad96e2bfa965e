"""The report reads journals that a real ``chaos run`` wrote (not hand-made look-alikes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gameday.report import build_report
from gameday.report.loader import parse_time
from gameday.report.summary import journal_findings
from gameday.report.synthetic import Scenario, write_experiment

REPO = Path(__file__).resolve().parents[1]
CHAOS = Path(sys.executable).parent / "chaos"


def _probe(
    name: str, check: str, measured: float, allowed: float, unit: str = "s", tolerance: bool = False
) -> dict[str, Any]:
    activity: dict[str, Any] = {
        "type": "probe",
        "name": name,
        "provider": {
            "type": "python",
            "module": "tests.report_probes",
            "func": "slo",
            "arguments": {"check": check, "measured": measured, "allowed": allowed, "unit": unit},
        },
    }
    if tolerance:
        activity["tolerance"] = {
            "type": "probe",
            "name": f"{name}-ok",
            "provider": {
                "type": "python",
                "module": "tests.report_probes",
                "func": "slo_ok",
                "arguments": {},
            },
        }
    return activity


def _experiment(
    title: str,
    component: str,
    fault: str,
    expect: str,
    error_rate: float,
    method: list[dict[str, Any]],
) -> dict[str, Any]:
    """An experiment whose steady state is one probe: the error rate (``error_rate``
    measured, 0.02 allowed, within its tolerance or not)."""
    hypothesis = _probe("error-rate", "error_rate", error_rate, 0.02, "ratio", tolerance=True)
    return {
        "version": "1.0.0",
        "title": title,
        "description": f"{title}: written for the report test.",
        "extensions": [
            {
                "name": "gameday",
                "component": component,
                "fault": fault,
                "expect": expect,
                "slo": {"detection_s": 5},
            }
        ],
        "steady-state-hypothesis": {"title": "users are served", "probes": [hypothesis]},
        "method": method,
        "rollbacks": [],
    }


EXPERIMENTS = {
    "router-faulty-kernel": _experiment(
        "Faulty kernel while the router is slowed",
        "router",
        "faulty-kernel",
        "trip",
        0.01,
        [_probe("time-to-trip", "detection_s", 1.8, 5.0)],
    ),
    "broker-latency": _experiment(
        "Broker slowed, healthy canary",
        "broker",
        "latency",
        "no_trip",
        0.01,
        [
            {
                "type": "action",
                "name": "inject-latency",
                "provider": {
                    "type": "python",
                    "module": "tests.report_probes",
                    "func": "inject_and_fail",
                    "arguments": {"component": "broker"},
                },
            },
            _probe("baseline-ttft", "ttft_p99_s", 9.0, 5.0),
        ],
    ),
    "control": _experiment(
        "Control: no fault",
        "control",
        "none",
        "no_trip",
        0.5,
        [_probe("never-runs", "detection_s", 1.0, 5.0)],
    ),
}


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if not CHAOS.exists():
        pytest.skip(f"Chaos Toolkit's `chaos` is not installed next to {sys.executable}")
    work = tmp_path_factory.mktemp("chaos")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out: dict[str, dict[str, Any]] = {}
    for name, experiment in EXPERIMENTS.items():
        exp_path = work / f"{name}.json"
        exp_path.write_text(json.dumps(experiment))
        journal_path = work / f"{name}-journal.json"
        proc = subprocess.run(
            [
                str(CHAOS),
                "--no-version-check",
                "--log-file",
                str(work / f"{name}.log"),
                "run",
                "--journal-path",
                str(journal_path),
                str(exp_path),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert journal_path.exists(), proc.stderr[-2000:]
        out[name] = json.loads(journal_path.read_text())
    return out


def test_chaoslib_journal_shape(journals: dict[str, dict[str, Any]]) -> None:
    for journal in journals.values():
        assert {
            "status",
            "deviated",
            "steady_states",
            "run",
            "rollbacks",
            "experiment",
            "start",
            "end",
            "duration",
        } <= set(journal)
        assert parse_time(journal["start"]) is not None


def test_passing_journal(journals: dict[str, dict[str, Any]]) -> None:
    found = journal_findings("router-faulty-kernel", journals["router-faulty-kernel"])
    assert found.status == "completed" and found.reasons == []
    got = [(c.check, c.source, c.measured, c.allowed, c.unit, c.ok) for c in found.checks]
    assert got == [
        ("error_rate", "probe 'error-rate', hypothesis before", 0.01, 0.02, "ratio", True),
        ("detection_s", "probe 'time-to-trip', method", 1.8, 5.0, "s", True),
        ("error_rate", "probe 'error-rate', hypothesis after", 0.01, 0.02, "ratio", True),
    ]
    assert found.probe_allowed == {"error_rate": 0.02, "detection_s": 5.0}
    assert [a.status for a in found.activities] == ["succeeded"] * 3


def test_action_that_raised_fails_although_chaos_says_completed(
    journals: dict[str, dict[str, Any]],
) -> None:
    journal = journals["broker-latency"]
    assert journal["status"] == "completed"  # what Chaos Toolkit itself reports
    found = journal_findings("broker-latency", journal)
    assert (
        "method action 'inject-latency' failed: expected broker-0 to accept the fault, got "
        "HTTP 401 (Chaos Toolkit exits 0 here)"
    ) in found.reasons
    ttft = next(c for c in found.checks if c.check == "ttft_p99_s")
    assert (ttft.measured, ttft.allowed, ttft.ok) == (9.0, 5.0, False)


def test_steady_state_not_met_before_the_method(journals: dict[str, dict[str, Any]]) -> None:
    found = journal_findings("control", journals["control"])
    assert found.reasons == [
        "the steady state was not met before the method, so the method never ran "
        "(Chaos Toolkit exits 0 here)",
        "only 0 of the method's 1 activities ran",
    ]
    # The probe outside its tolerance is a failed check of its own, not a second reason.
    assert [(c.check, c.ok) for c in found.checks] == [("error_rate", False)]


def test_report_from_real_journals(tmp_path: Path, journals: dict[str, dict[str, Any]]) -> None:
    run = tmp_path / "run"
    rng = np.random.default_rng(1)
    scenarios = {
        "router-faulty-kernel": Scenario(
            "router-faulty-kernel", "router", "faulty-kernel", "trip", True
        ),
        "broker-latency": Scenario("broker-latency", "broker", "latency", "no_trip", False),
        "control": Scenario("control", "control", "none", "no_trip", False),
    }
    for name, journal in journals.items():
        start = parse_time(journal["start"])
        assert start is not None
        # The load, oracle, ledger and broker files around the real journal, at its time.
        write_experiment(run / name, scenarios[name], start, 200, 0.1, rng, "real-journals")
        (run / name / "journal.json").write_text(json.dumps(journal))
    summary = build_report(run)
    by = {e.name: e for e in summary.experiments}
    assert by["router-faulty-kernel"].verdict == "pass", by["router-faulty-kernel"].reasons
    assert by["router-faulty-kernel"].title == "Faulty kernel while the router is slowed"
    assert by["broker-latency"].verdict == "fail"
    assert by["control"].verdict == "fail"
    assert summary.verdict == "fail"
    html = (run / "report.html").read_text()
    assert "Faulty kernel while the router is slowed: written for the report test." in html
    assert "expected broker-0 to accept the fault, got HTTP 401" in html


def test_the_run_verdict_and_the_report_give_the_same_reasons_for_one_journal(
    journals: dict[str, dict[str, Any]],
) -> None:
    """One journal, two readers: gameday run's verdict and the report name the same
    failures in the same words (the report lists SLO results as checks instead)."""
    from gameday.evidence.journal import journal_findings as core_findings
    from gameday.run.verdict import Evidence, decide, journal_reasons

    for name, journal in journals.items():
        run_reasons = journal_reasons(journal)
        report = journal_findings(name, journal)
        about_slo = {f.sentence for f in core_findings(journal) if f.slo is not None}
        assert report.reasons == [r for r in run_reasons if r not in about_slo], name
        failed_checks = {c.check for c in report.checks if c.ok is not True}
        assert {f.slo["check"] for f in core_findings(journal) if f.slo} <= failed_checks, name
        # Everything but the journal as the experiment expects it.
        trips = 1 if journal["experiment"]["extensions"][0]["expect"] == "trip" else 0
        run_verdict, _ = decide(
            Evidence(0, journal, records_rows=10, trips_in_window=trips, inconclusive=[])
        )
        report_fails = bool(report.reasons or failed_checks)
        assert (run_verdict == "fail") == report_fails, name
    # The journals above hold each kind: one passes, two fail for the journal's reasons.
    assert journal_reasons(journals["router-faulty-kernel"]) == []
    assert journal_reasons(journals["broker-latency"]) and journal_reasons(journals["control"])


def test_expect_colour_lost_in_the_report_needs_the_probe_to_name_that_hop() -> None:
    from gameday.report.findings import SloCheck
    from gameday.report.summary import _expect_colour_lost

    def check(lost_at: str) -> SloCheck:
        return SloCheck(
            "colour-dropped", "colouring_fidelity", "probe 'colouring', after the method",
            0.0, 1.0, "share", False, detail={"lost_at": lost_at},
        )  # fmt: skip

    reason = (
        "SLO 'colouring_fidelity' (probe 'colouring', after the method) not met: measured 0 "
        "share, allowed 1.0 share (hop 'router' (…) lost the colour of 3 of 3 request(s))"
    )
    found = check("router")
    kept, checks = _expect_colour_lost([reason], [found], "router")
    assert kept == [] and checks[0].ok is True and "on purpose" not in checks[0].note
    assert "expect: colour_lost" in checks[0].note
    kept, checks = _expect_colour_lost([reason], [check("model")], "router")
    assert checks[0].ok is False and "a lost tag would have gone unnoticed" in kept[-1]
