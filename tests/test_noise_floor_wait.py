"""The wait for the gate's noise floor before the fault (issue #14, item 5 and "Done when").

A faulty kernel judged against a floor of 0 tests nothing, and a fixed warm-up pause may
end with too few baseline-baseline comparisons: ``probes.gate.wait_for_noise_floor``
polls a real gate (and a real broker) until its ``all`` floor is its own, and at its
deadline it fails naming the count, the minimum and what to do, and writes
``noise-floor-wait.json`` whose reasons make the verdict inconclusive.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from chaoslib.exceptions import ActivityFailed

from gameday.evidence.noise_floor import NOISE_WAIT_NAME, noise_wait_reasons
from probes.gate import wait_for_noise_floor
from tests.procs import Proc, Spawner
from tests.run_support import write_target
from tests.test_gate_service import batch, comparison, post, setup_stack


def noise(n: int, kl: float = 0.001) -> dict[str, Any]:
    """``n`` baseline-baseline comparisons (both sides the stable version)."""
    return batch(
        [
            comparison("2k-4k", kl, pair="baseline-baseline", version_b="v1", request_id=f"n{i}")
            for i in range(n)
        ]
    )


def config_for(gate: Proc, broker: Proc, tmp_path: Path) -> dict[str, Any]:
    """A target whose stack description points at the real gate and broker."""
    state = tmp_path / "stack"
    state.mkdir()
    (state / "stack.json").write_text(
        json.dumps({"release": "default", "gate_url": gate.url, "broker_url": broker.url})
    )
    target = write_target(tmp_path / "target.yaml", state)
    return {"gameday_target": str(target), "gameday_run_dir": str(tmp_path / "run")}


def written(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((Path(cfg["gameday_run_dir"]) / NOISE_WAIT_NAME).read_text()))


def test_it_returns_the_count_and_the_floor_once_the_gate_has_measured_it(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, _, gate = setup_stack(spawn, tmp_path, "--noise-min-samples", "20")
    cfg = config_for(gate, broker, tmp_path)
    r = post(gate, noise(12))
    assert r.status_code == 200, r.text
    # The rest arrive while it waits: it must keep polling, not judge the first answer.
    timer = threading.Timer(1.0, lambda: post(gate, noise(12)))
    timer.start()
    try:
        out = wait_for_noise_floor(deadline_s=60, poll_s=0.2, min_samples=20, configuration=cfg)
    finally:
        timer.join()
    assert out["measured"] is True
    assert out["source"] == "all" and out["samples"] == 24
    assert out["kl"] is not None and out["kl"] > 0
    floor = requests.get(f"{gate.url}/v1/gate/default", timeout=5).json()["noise_floor"]["all"]
    assert out["kl"] == floor["kl"]
    assert written(cfg)["measured"] is True
    assert noise_wait_reasons(written(cfg)) == []


@pytest.mark.parametrize("noise_sent", [0, 5])
def test_without_enough_baseline_baseline_comparisons_it_fails_naming_count_minimum_and_remedy(
    spawn: Spawner, tmp_path: Path, noise_sent: int
) -> None:
    broker, _, gate = setup_stack(spawn, tmp_path, "--noise-min-samples", "20")
    cfg = config_for(gate, broker, tmp_path)
    # Baseline-canary comparisons: the gate watches, but has no floor of its own (none,
    # or 5 baseline-baseline comparisons: fewer than the 20 it needs).
    assert post(gate, batch([comparison("2k-4k", 0.001) for _ in range(30)])).status_code == 200
    if noise_sent:
        assert post(gate, noise(noise_sent)).status_code == 200
    with pytest.raises(ActivityFailed) as failed:
        wait_for_noise_floor(deadline_s=1.5, poll_s=0.2, min_samples=20, configuration=cfg)
    message = str(failed.value)
    assert f"had {noise_sent} baseline-baseline comparisons" in message
    assert "fewer than the 20" in message
    assert "cannot pass" in message
    assert "GAMEDAY_WARMUP_S" in message and "--shadow-noise-fraction" in message
    doc = written(cfg)
    assert doc["measured"] is False and doc["samples"] == noise_sent and doc["min_samples"] == 20
    assert noise_wait_reasons(doc) == [message]


def test_a_floor_of_exactly_zero_is_not_a_measured_floor(spawn: Spawner, tmp_path: Path) -> None:
    """Bit-identical replicas (batch noise off): 20 comparisons, floor 0, tests nothing."""
    broker, _, gate = setup_stack(spawn, tmp_path, "--noise-min-samples", "20")
    cfg = config_for(gate, broker, tmp_path)
    assert post(gate, noise(25, kl=0.0)).status_code == 200
    with pytest.raises(ActivityFailed, match="bit-identical replicas"):
        wait_for_noise_floor(deadline_s=1.0, poll_s=0.2, min_samples=20, configuration=cfg)
    assert written(cfg)["measured"] is False


def test_a_floor_of_exactly_zero_is_measured_only_where_the_experiment_accepts_it(
    spawn: Spawner, tmp_path: Path
) -> None:
    """vLLM on a CPU: replicas bit-identical by nature (GAMEDAY_ZERO_FLOOR=accept). The
    count still decides: too few comparisons at floor 0 is still no floor."""
    broker, _, gate = setup_stack(spawn, tmp_path, "--noise-min-samples", "20")
    cfg = config_for(gate, broker, tmp_path)
    assert post(gate, noise(12, kl=0.0)).status_code == 200
    with pytest.raises(ActivityFailed, match="fewer than the 20"):
        wait_for_noise_floor(
            deadline_s=1.0, poll_s=0.2, min_samples=20, zero_floor="accept", configuration=cfg
        )
    assert post(gate, noise(13, kl=0.0)).status_code == 200
    doc = wait_for_noise_floor(
        deadline_s=5.0, poll_s=0.2, min_samples=20, zero_floor="accept", configuration=cfg
    )
    assert doc["measured"] is True and doc["kl"] == 0.0 and doc["zero_floor"] == "accepted"
    assert written(cfg) == doc and noise_wait_reasons(doc) == []


def test_an_unreadable_gate_fails_at_the_deadline_and_says_so(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    state.mkdir()
    (state / "stack.json").write_text(
        json.dumps({"release": "default", "gate_url": "http://127.0.0.1:9"})
    )
    cfg = {
        "gameday_target": str(write_target(tmp_path / "target.yaml", state)),
        "gameday_run_dir": str(tmp_path / "run"),
    }
    with pytest.raises(ActivityFailed, match="the gate could not be read") as failed:
        wait_for_noise_floor(deadline_s=0.5, poll_s=0.1, configuration=cfg)
    assert "cannot reach http://127.0.0.1:9" in str(failed.value)
    assert noise_wait_reasons(written(cfg)) == [str(failed.value)]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("deadline_s", 0),
        ("poll_s", "soon"),
        ("min_samples", 0),
        ("min_samples", 2.5),
        ("zero_floor", "yes"),
    ],
)
def test_a_bad_argument_is_named(tmp_path: Path, argument: str, value: Any) -> None:
    cfg = {"gameday_target": str(tmp_path / "none.yaml"), "gameday_run_dir": str(tmp_path)}
    with pytest.raises(ActivityFailed, match=f"argument {argument} must be"):
        wait_for_noise_floor(**{argument: value}, configuration=cfg)


def test_a_missing_or_unreadable_wait_record_is_judged_fail_closed() -> None:
    assert noise_wait_reasons(None) == []  # the experiment did not wait: nothing to judge
    assert noise_wait_reasons({"measured": True}) == []
    (reason,) = noise_wait_reasons({"measured": "yes"})
    assert "does not say the noise floor was measured" in reason


def _verdict_reasons(folder: Path) -> list[str]:
    from gameday.run.figures import inconclusive_reasons
    from gameday.run.verdict import Evidence

    ev = Evidence(chaos_exit_code=0, journal=None, records_rows=100, trips_in_window=0)
    return inconclusive_reasons(folder, ev)


def test_the_run_verdict_reads_the_wait_record(tmp_path: Path) -> None:
    """The run's verdict (gameday.run.figures) turns a failed wait into an inconclusive
    reason, and a wait record it cannot read too (fail-closed); no record, no reason."""
    baseline = _verdict_reasons(tmp_path)
    assert not any(NOISE_WAIT_NAME in r or "noise floor" in r for r in baseline)
    failed = {"measured": False, "message": "no noise floor after 30 s: 7 of 20 comparisons"}
    (tmp_path / NOISE_WAIT_NAME).write_text(json.dumps(failed))
    assert failed["message"] in _verdict_reasons(tmp_path)
    (tmp_path / NOISE_WAIT_NAME).write_text("{not json")
    assert any(f"{NOISE_WAIT_NAME} could not be read" in r for r in _verdict_reasons(tmp_path))
    (tmp_path / NOISE_WAIT_NAME).write_text(json.dumps({"measured": True}))
    assert _verdict_reasons(tmp_path) == baseline
