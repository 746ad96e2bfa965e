"""A real ``gameday run`` that ends inconclusive (issue #14, item 5): the control
experiment on a fresh local stack, asking for more baseline-canary comparisons than a
short run can give. Its "no trip" proves nothing, so the run exits 3 — not 0 — and every
output says ``inconclusive`` with the reason; the gate's counters (read over HTTP) and
the load generator's check are in the folder. Two ways to ask: the experiment's own
``probes.evidence`` probe at the end of its method, with the threshold in its
configuration; and the control as it is, read by ``gameday run`` after chaos, with the
threshold from ``GAMEDAY_MIN_COMPARISONS``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.run_support import REPO, free_base_port
from tests.short_run_support import SHORT_RUN, gameday_run

pytestmark = pytest.mark.slow

SHORT = {**SHORT_RUN, "GAMEDAY_OBSERVE_S": "3"}
MILLION = 1000000  # no short run reaches a million comparisons: insufficient by design


def control_with_the_evidence_probe(folder: Path) -> Path:
    """experiments/control.yaml whose method ends with probes.evidence, its threshold in
    the configuration (an environment override, as every other setting)."""
    doc = yaml.safe_load((REPO / "experiments" / "control.yaml").read_text())
    doc["configuration"]["min_comparisons"] = {
        "type": "env", "key": "GAMEDAY_TEST_MIN_COMPARISONS", "default": MILLION,
        "env_var_type": "int",
    }  # fmt: skip
    doc["method"].append(
        {
            "type": "probe",
            "name": "gate-evidence",
            "provider": {
                "type": "python",
                "module": "probes.evidence",
                "func": "gate_evidence",
                "arguments": {"min_comparisons": "${min_comparisons}"},
            },
        }
    )
    path = folder / "control.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("source", ["probe", "gameday run"])
def test_a_control_without_enough_evidence_is_inconclusive_and_exits_3(
    tmp_path: Path, source: str
) -> None:
    out = tmp_path / "reports"
    if source == "probe":
        experiment, env = str(control_with_the_evidence_probe(tmp_path)), SHORT
    else:
        experiment = "experiments/control.yaml"
        env = {**SHORT, "GAMEDAY_MIN_COMPARISONS": str(MILLION)}
    proc = gameday_run(
        experiment,
        "--out", str(out), "--run-id", "unsure", "--base-port", str(free_base_port()),
        env=env,
    )  # fmt: skip
    run_dir = out / "unsure"
    folder = run_dir / "control"
    said = (folder / "result.json").read_text() if (folder / "result.json").exists() else ""
    assert proc.returncode == 3, said + proc.stdout[-4000:] + proc.stderr[-2000:]
    result = json.loads((folder / "result.json").read_text())
    assert result["verdict"] == "inconclusive", result["reasons"]
    first = result["reasons"][0]
    assert first.startswith("the gate saw ") and f"fewer than the {MILLION} needed" in first
    # the gate's counters, read over HTTP before the stack stopped
    gate = json.loads((folder / "gate-evidence.json").read_text())
    assert gate["ok"] is True and gate["source"] == source
    assert gate["thresholds"] == {"min_comparisons": MILLION, "min_canary_outcomes": 10}
    assert result["evidence"]["gate"]["comparisons"] == gate["comparisons"] < MILLION
    # the load generator's figures are recorded beside it
    generator = json.loads((folder / "load.json").read_text())["summary"]["generator"]
    assert generator["achieved_rps"] > 0 and generator["test_wall_s"] > 0
    assert generator["cpu_fraction"] is not None and generator["peak_users"] == 10
    assert json.loads((run_dir / "run.json").read_text())["verdict"] == "inconclusive"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "inconclusive", summary["reasons"]
    assert summary["headline"].startswith("INCONCLUSIVE")
    (exp,) = summary["experiments"]
    assert exp["figures"]["gate_evidence"]["comparisons"] == gate["comparisons"]
    assert exp["figures"]["load_generator"]["achieved_rps"] == generator["achieved_rps"]
    errors = ET.parse(run_dir / "junit.xml").getroot().iter("error")
    assert [e.get("message") for e in errors if e.get("type") == "Inconclusive"] == [first]
    assert "INCONCLUSIVE" in (run_dir / "report.html").read_text()
    assert "INCONCLUSIVE" in proc.stdout and "exit code 3" in proc.stdout
    assert f"gate saw {gate['comparisons']} comparisons" in proc.stdout
    print(json.dumps({"gate": gate, "generator": generator}, indent=1))  # for the defaults
