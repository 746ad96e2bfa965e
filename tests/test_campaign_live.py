"""A real tiny campaign (issue #14, item 4): ``gameday run --repeat 2`` of a shortened
control on fresh local stacks. Each run has its own folder, stack and load seed (the seed
reaches Locust, so the two runs send different prompts), and the report's campaign cell
counts both. About a minute on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.run_support import free_base_port
from tests.short_run_support import SHORT_RUN, gameday_run

pytestmark = pytest.mark.slow

TINY = {
    **SHORT_RUN,  # its stop timeout and generous latency SLO; shorter and fewer here
    "GAMEDAY_WARMUP_S": "4",
    "GAMEDAY_OBSERVE_S": "8",
    "GAMEDAY_LOAD_USERS": "8",
    "GAMEDAY_LOAD_SPAWN_RATE": "8",
    # The test checks the campaign's plumbing, not the gate's figures (2 busy cores):
    # small evidence thresholds, stated here.
    "GAMEDAY_MIN_COMPARISONS": "5",
    "GAMEDAY_MIN_CANARY_OUTCOMES": "2",
    # The gate still needs its 20 baseline-baseline comparisons before the fault (4 users
    # gave it 12 in 30 s): twice the users and a longer wait for them.
    "GAMEDAY_NOISE_WAIT_S": "60",
}


def test_repeat_2_runs_the_control_twice_with_different_load_seeds(tmp_path: Path) -> None:
    done = gameday_run(
        "experiments/control.yaml", "--repeat", "2", "--out", str(tmp_path),
        "--run-id", "tiny", "--base-port", str(free_base_port()),
        env=TINY,
        unset={"GAMEDAY_LOAD_SEED"},  # each run's seed is the campaign's own
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    run = tmp_path / "tiny"
    prompts = []
    for k in (1, 2):
        folder = run / f"control@r0{k}"
        load = json.loads((folder / "load.json").read_text())
        assert load["seed"] == k - 1 and load["command"][-2:] == ["--seed", str(k - 1)]
        result = json.loads((folder / "result.json").read_text())
        assert result["campaign"] == {
            "experiment": "control",
            "run": k,
            "of": 2,
            "load_seed": k - 1,
        }
        rows = pq.read_table(folder / "records.parquet").to_pandas()
        prompts.append(sorted(rows["prompt_tokens"].tolist())[:20])
    assert prompts[0] != prompts[1]  # different seeds, different prompts
    assert json.loads((run / "run.json").read_text())["campaign"]["load_seeds"] == {
        "control@r01": 0,
        "control@r02": 1,
    }
    summary = json.loads((run / "summary.json").read_text())
    (cell,) = summary["campaign"]["cells"]
    assert cell["experiment"] == "control" and cell["passes_text"] == "2/2"
    assert "campaign: control: 2/2 passed, verdict pass" in done.stdout
