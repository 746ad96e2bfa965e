"""``gameday run`` end to end with real stacks and real experiments (durations shortened
through the experiments' environment overrides):

- a real experiment passes, leaves every §7.1 file, ``reports/latest`` and the report;
- with a blind gate (a stack config) the same experiment fails and says why;
- Ctrl-C (SIGINT) of ``gameday run`` mid-experiment clears every fault (every replica's
  ``/admin/faults`` empty, the ledger shows the clears), stops Locust, exits non-zero.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gameday.faults import FaultLedger
from gameday.report import loader as report_loader
from gameday.stack import stack_status
from tests.procs import wait_for
from tests.run_support import REPO, faults_on, free_base_port, local_stack, write_target
from tests.short_run_support import SHORT_RUN, gameday_run, gameday_run_argv

pytestmark = pytest.mark.slow

SHORT = {
    **SHORT_RUN,
    "GAMEDAY_OBSERVE_S": "2",
    "GAMEDAY_TRIP_DEADLINE_S": "25",
    # Generous SLOs for the trip and the rollback too, which the journal (probes.journal)
    # hands to the report as they were in force.
    "GAMEDAY_SLO_DETECTION_S": "20",
    "GAMEDAY_SLO_WEIGHTS_APPLIED_S": "25",
    "GAMEDAY_SLO_ROLLBACK_S": "20",
    "GAMEDAY_SLO_DRIFTED_MAX": "50",
}
# Every file the report reads from an experiment's folder, and what the run adds.
EXPERIMENT_FILES = (*report_loader.EXPERIMENT_FILES, "target.yaml", "load.json")


def result_of(run_dir: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((run_dir / name / "result.json").read_text()))


def test_a_real_experiment_passes_and_leaves_its_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = gameday_run(
        "experiments/router/faulty-kernel.yaml",
        "--out", str(out), "--run-id", "short", "--base-port", str(free_base_port()),
        env=SHORT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    run_dir = out / "short"
    assert (out / "latest").resolve() == run_dir.resolve()
    folder = run_dir / "router" / "faulty-kernel"
    for name in EXPERIMENT_FILES:
        assert (folder / name).is_file(), name
    result = result_of(run_dir, "router/faulty-kernel")
    assert result["verdict"] == "pass" and result["reasons"] == []
    assert result["chaos_exit_code"] == 0
    assert result["figures"]["time_to_trip_s"] > 0
    journal = json.loads((folder / "journal.json").read_text())
    ext = {e["name"]: e for e in journal["experiment"]["extensions"]}
    assert ext["gameday"]["slo"]["detection_s"] == 20.0  # the override, resolved
    assert ext["gameday"]["slo_declared"]["detection_s"] == "${detection_s}"
    assert ext["gameday-load"]["records"] == str((folder / "records.parquet").resolve())
    timeline = json.loads((folder / "timeline.json").read_text())
    phases = [(e["change"].get("phase") or {}).get("new") for e in timeline["events"]]
    assert "tripped" in phases and "rolled_back" in phases
    ledger = FaultLedger(folder / "faults.jsonl")
    assert {e.kind for e in ledger.entries()} == {"latency", "kernel"}
    assert ledger.outstanding() == []
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["verdict"] == "pass" and run_json["stack"]["owned"] is True
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "pass", summary["reasons"]
    assert "PASS" in proc.stdout and "canary-turns-faulty" in proc.stdout


def test_a_blind_gate_fails_the_run_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    env = {**SHORT, "GAMEDAY_TRIP_DEADLINE_S": "8", "GAMEDAY_ROLLBACK_DEADLINE_S": "2"}
    proc = gameday_run(
        "experiments/router/faulty-kernel.yaml",
        "--out", str(out), "--run-id", "blind", "--base-port", str(free_base_port()),
        "--stack-config", "experiments/stack-configs/blind-gate.yaml",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-4000:]
    reasons = result_of(out / "blind", "router/faulty-kernel")["reasons"]
    text = "\n".join(reasons)
    assert "method probe 'gate-trips' failed: expected the gate to trip within 8 s" in text
    assert "the broker's history shows none" in text
    assert "FAIL" in proc.stdout and "expected the gate to trip within 8 s" in proc.stdout


def test_ctrl_c_clears_every_fault_and_stops_the_load(tmp_path: Path) -> None:
    with local_stack(tmp_path / "stack") as status:
        target = write_target(tmp_path / "target.yaml", tmp_path / "stack")
        out = tmp_path / "reports"
        env = {**os.environ, **SHORT, "GAMEDAY_WARMUP_S": "2", "GAMEDAY_OBSERVE_S": "60"}
        proc = subprocess.Popen(
            gameday_run_argv(
                "experiments/router/latency.yaml", "--target", str(target),
                "--out", str(out), "--run-id", "ctrlc", "--no-report",
            ),
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        folder = out / "ctrlc" / "router" / "latency"
        ledger = FaultLedger(folder / "faults.jsonl")
        try:
            wait_for(
                lambda: len([e for e in ledger.entries() if e.action == "inject"]) == 2,
                timeout=120,
                what="the router latency to be injected",
            )
            assert all(faults_on(tmp_path / "stack")[r] for r in ("router-0", "router-1"))
            load = json.loads((folder / "load.json").read_text())
            assert load["state"] == "running"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = output.decode(errors="replace")
        assert proc.returncode == 128 + signal.SIGINT, text[-3000:]
        assert time.monotonic() - t0 < 90
        # every replica's own /admin/faults is empty, and the ledger shows the clears
        assert not any(faults_on(tmp_path / "stack").values())
        injected = {(e.url, e.fault_id) for e in ledger.entries() if e.action == "inject"}
        cleared = {(e.url, e.fault_id) for e in ledger.entries() if e.action == "clear"}
        assert injected and injected == cleared
        # Locust stopped (by PID), the stack it did not start still runs
        load = json.loads((folder / "load.json").read_text())
        assert load["state"] != "running"
        assert (
            not Path(f"/proc/{load['pid']}").exists()
            or b"locust" not in Path(f"/proc/{load['pid']}/cmdline").read_bytes()
        )
        after = stack_status(tmp_path / "stack")
        assert after is not None and after.get("running") is True
        result = result_of(out / "ctrlc", "router/latency")
        assert result["verdict"] == "fail"
        assert any("interrupted (SIGINT)" in r for r in result["reasons"])
        assert "interrupted by SIGINT" in text
        assert status["running"]
