"""The dependency game days (experiments/dependency/, issue #16 item 5): each passes
``chaos validate``, says what it expects (a healthy canary through a shared outage: no
trip; a faulty kernel injected during the outage: a trip), checks Redis's starting state
first, judges the users' SLOs (errors bounded, no request past its deadline, recovered
in time, router and broker healthy throughout), and rolls its Redis faults back whatever
happens. Every SLO and duration sits in configuration with an environment override."""

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
    assert method[0] == FAULT_ACTION[name]
    assert "watch" in method
    assert method[-1] == "clear_redis_faults"
    if name == "faulty-kernel":
        # The kernel turns faulty during the dependency fault, right after it.
        assert method[1] == "make_canary_faulty"
    rollbacks = funcs(exp["rollbacks"])
    assert rollbacks == ["clear_redis_faults", "clear_faults"]
    assert exp["runtime"]["rollbacks"]["strategy"] == "always"


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_every_slo_and_duration_has_an_environment_override(name: str) -> None:
    config = load(name)["configuration"]
    for key in ("error_rate", "max_e2e_s", "recovery_s", "ttft_p99_s", "warmup_s", "watch_s"):
        entry = config[key]
        assert entry["type"] == "env" and entry["key"].startswith("GAMEDAY_"), key
    assert config["error_rate"]["default"] <= 0.01  # errors bounded: 1 % at most
    assert config["recovery_s"]["default"] == 5
