"""The probes against a real local stack (one for the module): faults reach every
replica and are cleared from the ledger, the blast radius holds on a live target, the
state probes say expected vs actual, waits give up at their deadline, and a pod kill is a
real SIGKILL that supervisord answers with a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from chaoslib.exceptions import ActivityFailed

from gameday.faults import FaultLedger
from gameday.targets import load_target
from probes import faults, gate, slo, stack
from tests.procs import wait_for
from tests.run_support import faults_on, local_stack, release, write_target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("live")
    with local_stack(root / "stack") as status:
        target = write_target(root / "target.yaml", root / "stack")
        yield {"root": root, "state_dir": root / "stack", "target": target, "status": status}


@pytest.fixture
def cfg(live: dict[str, Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    config = {"gameday_target": str(live["target"]), "gameday_run_dir": str(tmp_path / "run")}
    yield config
    faults.clear_faults(configuration=config)  # leave the shared stack clean


def _events(live: dict[str, Any]) -> list[dict[str, Any]]:
    url = live["status"]["broker_url"] + "/v1/releases/default/events"
    return list(requests.get(url, timeout=3).json()["events"])


def test_latency_reaches_every_replica_and_is_cleared(
    live: dict[str, Any], cfg: dict[str, Any]
) -> None:
    out = faults.inject_latency("router", 40, ttl_s=30, configuration=cfg)
    assert sorted(out["replicas"]) == ["router-0", "router-1"]
    on = faults_on(live["state_dir"])
    for replica in ("router-0", "router-1"):
        assert [(f["kind"], f["params"]) for f in on[replica]] == [("latency", {"ms": 40.0})]
        assert 0 < on[replica][0]["remaining_s"] <= 30
    assert not on["broker"] and not on["model-canary-0"]
    annotations = [e["change"].get("annotation") for e in _events(live)]
    assert "fault_injected" in annotations
    cleared = faults.clear_faults("router", configuration=cfg)
    assert cleared["cleared"] == 2
    assert not any(faults_on(live["state_dir"]).values())
    ledger = FaultLedger(Path(cfg["gameday_run_dir"]) / "faults.jsonl")
    assert [e.action for e in ledger.entries()] == ["inject", "inject", "clear", "clear"]
    assert ledger.outstanding() == []
    assert faults.clear_faults(configuration=cfg)["cleared"] == 0  # idempotent


def test_a_model_latency_goes_to_both_variants(live: dict[str, Any], tmp_path: Path) -> None:
    target = write_target(tmp_path / "all.yaml", live["state_dir"])  # every role allowed
    config = {"gameday_target": str(target), "gameday_run_dir": str(tmp_path / "run")}
    try:
        out = faults.inject_latency("model", 30, ttl_s=20, configuration=config)
        assert len(out["replicas"]) == 3
        on = faults_on(live["state_dir"])
        assert on["model-baseline-0"][0]["params"]["ttft_ms"] == 30.0
    finally:
        faults.clear_faults(configuration=config)
    assert not any(faults_on(live["state_dir"]).values())


def test_the_blast_radius_holds_on_a_live_target(live: dict[str, Any], tmp_path: Path) -> None:
    narrow = write_target(tmp_path / "narrow.yaml", live["state_dir"], components=["router"])
    config = {"gameday_target": str(narrow), "gameday_run_dir": str(tmp_path / "run")}
    with pytest.raises(ActivityFailed, match=r"model-canary is outside the blast radius"):
        faults.make_canary_faulty(ttl_s=30, configuration=config)
    with pytest.raises(ActivityFailed, match=r"rollback is outside the blast radius"):
        faults.inject_latency("rollback", 10, ttl_s=30, configuration=config)
    assert not any(faults_on(live["state_dir"]).values()), "nothing may be injected"
    assert not (tmp_path / "run" / "faults.jsonl").exists()


def test_state_probes_say_expected_and_actual(cfg: dict[str, Any]) -> None:
    assert stack.release_phase(configuration=cfg) == "progressing"
    assert stack.release_phase(expected="progressing", configuration=cfg) == "progressing"
    assert stack.canary_weight(configuration=cfg) == 5
    with pytest.raises(ActivityFailed, match="is in phase 'progressing' but should be 'promoted'"):
        stack.release_phase(expected="promoted", configuration=cfg)
    with pytest.raises(ActivityFailed, match=r"gives the canary 5% .* expects 7%"):
        stack.canary_weight(expected=7, configuration=cfg)
    with pytest.raises(ActivityFailed, match="argument expected is 'running'"):
        stack.release_phase(expected="running", configuration=cfg)
    assert stack.stack_healthy(configuration=cfg) is True
    assert stack.no_active_faults(configuration=cfg) is True


def test_leftover_faults_are_listed(
    live: dict[str, Any], cfg: dict[str, Any], tmp_path: Path
) -> None:
    assert stack.starting_state(canary_weight=5, configuration=cfg) is True
    with pytest.raises(ActivityFailed, match="expects 10%"):
        stack.starting_state(canary_weight=10, configuration=cfg)
    faults.inject_latency("rollback", 20, ttl_s=30, configuration=cfg)
    with pytest.raises(ActivityFailed, match=r"rollback: latency .* s left"):
        stack.no_active_faults(configuration=cfg)
    # Once this experiment has begun (its ledger has an entry), the start is history ...
    assert stack.starting_state(canary_weight=5, configuration=cfg) is True
    # ... but another experiment starting now finds the leftover and does not run.
    fresh = {**cfg, "gameday_run_dir": str(tmp_path / "next")}
    with pytest.raises(ActivityFailed, match="expected no active faults before the experiment"):
        stack.starting_state(canary_weight=5, configuration=fresh)
    faults.clear_faults(configuration=cfg)
    assert stack.no_active_faults(configuration=cfg) is True


def test_waits_give_up_at_their_deadline(cfg: dict[str, Any]) -> None:
    with pytest.raises(ActivityFailed, match="found none"):
        gate.wait_for_trip(deadline_s=1, configuration=cfg)  # nothing injected yet
    faults.inject_latency("rollback", 20, ttl_s=30, configuration=cfg)
    t0 = time.monotonic()
    with pytest.raises(ActivityFailed) as err:
        gate.wait_for_trip(deadline_s=1.0, configuration=cfg)
    assert 0.9 <= time.monotonic() - t0 < 10
    assert "expected the gate to trip within 1 s" in str(err.value)
    assert "still 'progressing'" in str(err.value) and "the gate is" in str(err.value)
    with pytest.raises(ActivityFailed, match=r"should reach phase 'rolled_back' within 0\.5 s"):
        stack.wait_for_release_phase("rolled_back", deadline_s=0.5, configuration=cfg)
    assert gate.gate_did_not_trip(observe_s=1.0, poll_s=0.2, configuration=cfg) is True
    result = slo.no_trip(configuration=cfg)
    assert result["ok"] is True and result["measured"] == 0


def test_a_pod_kill_is_a_sigkill_and_the_pod_comes_back(
    live: dict[str, Any], cfg: dict[str, Any]
) -> None:
    target = load_target(live["target"])
    assert hasattr(target, "pid_of")
    old_pid = target.pid_of("rollback")
    out = faults.kill_pod("rollback", configuration=cfg)
    assert out["replica"] == "rollback" and out["detail"]["pid"] == old_pid
    assert out["detail"]["signal"] == "SIGKILL"
    assert stack.stack_healthy(wait_s=30, configuration=cfg) is True
    wait_for(lambda: target.pid_of("rollback") != old_pid, timeout=30, what="a new rollback pid")
    ledger = FaultLedger(Path(cfg["gameday_run_dir"]) / "faults.jsonl")
    assert [e.action for e in ledger.entries()] == ["kill"]
    assert any(e["change"].get("annotation") == "pod_killed" for e in _events(live))
    assert release(live["state_dir"])["phase"] == "progressing"
