"""The load generator is checked (issue #14, item 6), with real Locust against a real
model server: the summary records the achieved rate, CPU and users of the generator
(also summed over ``--processes`` workers), and a run that falls short of its target rate
is marked invalid with the reason — which makes the verdict inconclusive
(tests/test_inconclusive.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gameday.load.runner import LoadConfig, LoadRun
from gameday.run.sufficiency import load_reasons
from tests.load_support import short_load
from tests.procs import Spawner
from tests.test_load_locust import write_trace

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", [None, 2])
def test_a_load_below_its_target_rate_is_invalid_and_says_why(
    spawn: Spawner, tmp_path: Path, processes: int | None
) -> None:
    model = spawn("canarystack.model", "--version", "v1")
    config = short_load(
        model.url,
        tmp_path,
        processes=processes,
        env={"GAMEDAY_LOAD_TARGET_RPS": "100000"},  # no 2 users on 2 cores get there
    )
    result = LoadRun(config).start().wait(90)
    summary: dict[str, Any] = result.summary  # load-summary.json, read as JSON
    gen = summary["generator"]
    assert gen["valid"] is False
    assert gen["target_rps"] == 100000.0 and 0 < gen["achieved_rps"] < 80000
    assert gen["achieved_rps"] == pytest.approx(
        summary["requests_sent"] / summary["test_wall_s"], rel=1e-3
    )
    assert 2.5 <= summary["test_wall_s"] <= 30
    assert summary["cpu_s"] > 0 and gen["cpu_fraction"] is not None
    assert summary["peak_users"] == 2  # over both workers when there are two
    shortfall = (
        f"the load reached {gen['achieved_rps']:g} requests/s, below 0.8 x the target "
        "100000 requests/s (GAMEDAY_LOAD_TARGET_RPS)"
    )
    assert shortfall in gen["problems"]
    reasons = load_reasons({"state": "stopped", "summary": summary})
    assert f"the load generator is not valid: {shortfall}" in reasons


def test_an_open_loop_that_started_late_is_invalid_and_says_why(
    spawn: Spawner, tmp_path: Path
) -> None:
    # six requests due at once, one user: at least four start late (each waits for the
    # previous stream of 32 tokens)
    model = spawn("canarystack.model", "--version", "v1")
    trace = write_trace(tmp_path / "burst.csv", [0.0] * 6, generated=32)
    config = LoadConfig(
        host=model.url,
        output_dir=tmp_path / "run",
        users=1,
        spawn_rate=1,
        stop_timeout_s=10,
        prompt_mix=f"azure-trace:{trace}",
        extra_args=("--trace-late-tolerance-s", "0.02"),
    )
    result = LoadRun(config).start().wait(90)
    summary: dict[str, Any] = result.summary  # load-summary.json, read as JSON
    gen = summary["generator"]
    assert gen["open_loop"] is True and gen["valid"] is False
    late = summary["trace_late_starts"]
    assert late >= 4 and gen["late_starts"] == late and gen["late_fraction"] == round(late / 6, 4)
    (problem,) = [p for p in gen["problems"] if "trace requests started late" in p]
    assert problem.startswith(f"{late} of 6 trace requests started late")


def test_the_generators_measured_cpu_is_judged_against_its_tolerance(
    spawn: Spawner, tmp_path: Path
) -> None:
    # a tolerance of 1 % of a core: any real Locust serving users uses more
    model = spawn("canarystack.model", "--version", "v1")
    config = short_load(model.url, tmp_path, env={"GAMEDAY_LOAD_MAX_CPU_FRACTION": "0.01"})
    result = LoadRun(config).start().wait(90)
    gen: Any = result.summary["generator"]  # load-summary.json's check, read as JSON
    assert gen["valid"] is False and gen["cpu_fraction"] > 0.01
    assert gen["tolerances"]["max_cpu_fraction"] == 0.01
    assert (
        f"Locust used {gen['cpu_fraction']:.0%} of a core on average over the test (more "
        "than 1%, GAMEDAY_LOAD_MAX_CPU_FRACTION): the generator was short of CPU"
    ) in gen["problems"]
