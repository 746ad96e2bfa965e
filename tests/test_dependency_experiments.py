"""The dependency game days (experiments/dependency/, issue #16 item 5): each passes
``chaos validate``, says what it expects (a healthy canary through a shared outage: no
trip; a faulty kernel injected during the outage: a trip), checks Redis's starting state
first, judges the users' SLOs (errors bounded, no request past its deadline, recovered
in time, router and broker healthy throughout), and rolls its Redis faults back whatever
happens. Every SLO and duration sits in configuration with an environment override.

Like every local game day, each waits for the gate's noise floor before its fault (#14):
the healthy-canary ones before the Redis fault (the fault the gate must not trip on),
faulty-kernel before the Redis kill, which the kernel fault follows at once (during the
outage). Without the wait, dependency/faulty-kernel tripped against a floor of 0: its 10 s
warm-up gave the gate 16 of the 20 baseline-baseline comparisons a floor needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.run_support import REPO

FOLDER = REPO / "experiments" / "dependency"
EXPECT = {"latency": "no_trip", "pool-exhaustion": "no_trip", "pod-kill": "no_trip",
          "faulty-kernel": "trip"}  # fmt: skip
FAULT_ACTION = {"latency": "pause_redis", "pool-exhaustion": "exhaust_redis",
                "pod-kill": "kill_redis", "faulty-kernel": "kill_redis"}  # fmt: skip
REDIS_FAULTS = {"pause_redis", "exhaust_redis", "kill_redis"}
GATE_FAULTS = {"make_canary_faulty"}  # a fault of the canary itself: what the gate judges
USER_SLOS = {"dependency_errors_below", "no_request_past_deadline", "recovered_within",
             "services_stayed_healthy"}  # fmt: skip


def load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((FOLDER / f"{name}.yaml").read_text()))


def funcs(activities: list[dict[str, Any]]) -> list[str]:
    return [a["provider"]["func"] for a in activities]


def test_the_folder_holds_exactly_these_experiments() -> None:
    assert sorted(p.stem for p in FOLDER.glob("*.yaml")) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_chaos_validates_it(name: str) -> None:
    res = subprocess.run(
        [str(Path(sys.executable).with_name("chaos")), "--no-log-file", "validate",
         str(FOLDER / f"{name}.yaml")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_it_says_what_it_expects_and_checks_what_users_saw(name: str) -> None:
    exp = load(name)
    ext = next(e for e in exp["extensions"] if e["name"] == "gameday")
    assert (ext["component"], ext["fault"], ext["expect"]) == ("dependency", name, EXPECT[name])
    hypothesis = exp["steady-state-hypothesis"]["probes"]
    names = funcs(hypothesis)
    assert names[:3] == ["stack_healthy", "starting_state", "redis_is_clean"]
    assert set(names) >= USER_SLOS
    assert ("no_trip" in names) == (EXPECT[name] == "no_trip")
    assert ("trip_within" in names) == (EXPECT[name] == "trip")
    method = funcs(exp["method"])
    # One Redis fault, the experiment's own; injected before any fault of the canary.
    assert [f for f in method if f in REDIS_FAULTS] == [FAULT_ACTION[name]]
    redis_at = method.index(FAULT_ACTION[name])
    gate_faults = [i for i, f in enumerate(method) if f in GATE_FAULTS]
    if name == "faulty-kernel":
        # The kernel turns faulty during the dependency fault, right after it.
        assert gate_faults == [redis_at + 1]
    else:
        assert gate_faults == []  # a healthy canary: the shared outage is all there is
    assert "watch" in method[redis_at:]
    assert method[-1] == "clear_redis_faults"
    rollbacks = funcs(exp["rollbacks"])
    assert rollbacks == ["clear_redis_faults", "clear_faults"]
    assert exp["runtime"]["rollbacks"]["strategy"] == "always"


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_the_gate_has_its_noise_floor_before_the_redis_fault(name: str) -> None:
    """#14: the load warms up, then the gate must have measured its noise floor before the
    first fault (probes.gate.wait_for_noise_floor, bounded by noise_wait_s like every other
    game day's); a floor of 0 makes a trip test nothing and a no-trip show no calibration."""
    exp = load(name)
    method = exp["method"]
    names = funcs(method)
    assert names.count("wait_for_noise_floor") == 1
    wait_at = names.index("wait_for_noise_floor")
    first_fault = min(i for i, f in enumerate(names) if f in REDIS_FAULTS | GATE_FAULTS)
    assert wait_at == 0 < first_fault
    wait = method[wait_at]
    assert wait["type"] == "probe" and wait["provider"]["module"] == "probes.gate"
    assert wait["provider"]["arguments"] == {
        "deadline_s": "${noise_wait_s}",
        "zero_floor": "${zero_floor}",
    }
    assert wait["pauses"] == {"before": "${warmup_s}"}  # after the load's warm-up
    assert all("pauses" not in a for a in method[wait_at + 1 : first_fault + 1])
    entry = exp["configuration"]["noise_wait_s"]
    assert (entry["type"], entry["key"], entry["default"]) == ("env", "GAMEDAY_NOISE_WAIT_S", 30)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_every_slo_and_duration_has_an_environment_override(name: str) -> None:
    config = load(name)["configuration"]
    for key in (
        "error_rate", "max_e2e_s", "recovery_s", "ttft_p99_s", "warmup_s", "noise_wait_s",
        "watch_s",
    ):  # fmt: skip
        entry = config[key]
        assert entry["type"] == "env" and entry["key"].startswith("GAMEDAY_"), key
    assert config["error_rate"]["default"] <= 0.01  # errors bounded: 1 % at most
    assert config["recovery_s"]["default"] == 5
