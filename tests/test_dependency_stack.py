"""Redis in a live local stack (issue #16 item 1): its own supervisord program, ready
(PING) before the stack is, seeded, shown in ``stack status``; the model pods use it;
and the harness's kill goes through the target (SIGKILL by PID, checked) and supervisord
restarts it while the stack keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from canarystack.cluster.spec import REDIS_OFFSET
from gameday import redis_faults as dep
from gameday.faults import FaultLedger
from gameday.targets.base import BlastRadiusError, parse_target
from tests.procs import wait_for
from tests.test_dependency_support import needs_redis
from tests.test_stack_cli import cli_stack, status

pytestmark = needs_redis


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from cli_stack(tmp_path_factory, "depstack")


def redis_pid(state_dir: Path) -> int:
    deps = status(state_dir)["dependencies"]
    assert [d["name"] for d in deps] == ["redis"]
    return int(deps[0]["pid"])


def test_redis_runs_seeded_and_the_model_pods_use_it(stack: dict[str, Any]) -> None:
    st = status(stack["state_dir"])
    (red,) = st["dependencies"]
    assert red["state"] == "RUNNING" and red["healthy"] is True
    port = stack["base"] + REDIS_OFFSET
    assert red["url"] == f"redis://127.0.0.1:{port}"
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    assert client.dbsize() >= 4  # the seeded contexts
    assert (
        client.config_get("save")["save"] == ""
        and client.config_get("appendonly")["appendonly"] == "no"
    )
    resp = requests.post(
        f"{st['router_url']}/v1/completions",
        json={"prompt": "hello world", "max_tokens": 2},
        timeout=10,
    )
    assert resp.status_code == 200 and resp.headers["x-dependency"] == "ok"
    desc = json.loads((stack["state_dir"] / "stack.json").read_text())
    assert "redis" not in {c["role"] for c in desc["components"]}


def test_the_harness_kills_redis_by_pid_and_supervisord_restarts_it(
    stack: dict[str, Any], tmp_path: Path
) -> None:
    state_dir = stack["state_dir"]
    target = parse_target(
        {"kind": "local", "state_dir": str(state_dir), "blast_radius": {"components": ["redis"]}}
    )
    before = redis_pid(state_dir)
    entry = dep.kill(target, FaultLedger(tmp_path / "faults.jsonl"))
    assert entry.detail["pid"] == before and entry.detail["signal"] == "SIGKILL"
    wait_for(
        lambda: (lambda d: d["healthy"] and d["pid"] != before)(
            status(state_dir)["dependencies"][0]
        ),
        timeout=30,
        interval=0.25,
        what="supervisord to restart redis",
    )
    assert status(state_dir)["dependencies"][0]["restarts"] == 1
    assert dep.problems(target) == []
    # Outside the blast radius it is refused, and nothing is killed.
    narrow = parse_target({"kind": "local", "state_dir": str(state_dir)})
    pid = redis_pid(state_dir)
    with pytest.raises(BlastRadiusError, match="outside the blast radius"):
        dep.kill(narrow)
    assert redis_pid(state_dir) == pid
