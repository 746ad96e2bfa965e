"""The terminal's end of a run: the reasons an experiment did not pass are printed again
under the table, so the tail of a CI log says why (ci-k8s showed only the table's
figures when a faulty-canary rollout failed)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import cast

from rich.console import Console

from gameday.run.cli import TerminalProgress
from gameday.run.result import ExperimentResult
from gameday.run.runner import RunOutcome


def _result(name: str, verdict: str, reasons: list[str]) -> ExperimentResult:
    return cast(
        ExperimentResult,
        {
            "experiment": name,
            "verdict": verdict,
            "reasons": reasons,
            "chaos_exit_code": 0,
            "started_at": 0.0,
            "ended_at": 1.0,
            "file": f"experiments/{name}.yaml",
            "figures": {},
            "evidence": {},
            "stack": {"owned": False},
        },
    )


def test_reasons_of_failed_experiments_follow_the_table() -> None:
    out = io.StringIO()
    progress = TerminalProgress(Console(file=out, width=200, color_system=None))
    outcome = RunOutcome(
        run_dir=Path("reports/x"),
        exit_code=1,
        results=[
            _result("k8s/control", "pass", []),
            _result("k8s/faulty-canary-rollout", "fail", ["SLO drifted_max: 5 > 3"]),
        ],
        report_headline="FAIL — 1 of 2 experiments failed: k8s/faulty-canary-rollout",
    )
    progress.run_done(outcome)
    text = out.getvalue()
    table_end = text.index("k8s/faulty-canary-rollout │")
    why = text.index("k8s/faulty-canary-rollout (fail):")
    assert why > table_end
    assert text.index("- SLO drifted_max: 5 > 3", why) < text.index("verdict: FAIL")
    assert "k8s/control (pass)" not in text
