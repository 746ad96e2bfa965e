"""The gate dead-man switch (#27 finding 4): a router whose samples the gate has not
accepted for ``--gate-deadman-s`` sends the canary to 0 % and says so on ``/health``
(status ``degraded``, still HTTP 200: it serves the baseline), until the gate accepts
again.

A stopped gate is a real gate process SIGSTOPped by PID (its port still accepts
connections, nothing answers: the router's pushes time out), a refusing one a
``GateReceiver`` answering 401 (samples not accepted). Every part is a real process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import router_support as rs
from tests.broker_support import start_broker
from tests.procs import Proc, Spawner, wait_for


def _health(router: Proc) -> tuple[int, dict[str, Any]]:
    r = requests.get(rs.instance_url(router) + "/health", timeout=5)
    return r.status_code, dict(r.json())


def _served_by(router: Proc, **headers: str) -> str:
    r = rs.completion(router.url, headers=headers)
    return r.headers.get("x-served-by", f"HTTP {r.status_code}")


def _fail_safe_on(router: Proc) -> dict[str, Any] | None:
    """Push a sample (one request), then the health when the dead-man switch is on."""
    rs.completion(router.url)
    status, body = _health(router)
    return body if status == 200 and body["status"] == "degraded" else None


def _assert_canary_off(router: Proc, body: dict[str, Any]) -> None:
    reason = body["gate_failsafe"]
    assert reason.startswith("gate unreachable: it has not accepted samples for")
    assert "--gate-deadman-s 1" in reason
    assert body["degraded_reasons"] == [reason]
    assert {_served_by(router) for _ in range(5)} == {"baseline"}
    pinned = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert pinned.status_code == 409, pinned.text
    assert "gate unreachable" in pinned.json()["error"]["message"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    yield from rs.model_servers(tmp_path_factory, b0="v1", c0="v2")


def test_a_stopped_gate_sends_the_canary_to_zero_until_it_answers_again(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    baseline, canary = rs.pools(models)
    broker = start_broker(spawn, tmp_path / "broker")
    api = rs.Broker(broker.url)
    release = api.create(weight=100)
    gate = spawn("canarystack.gate", "--broker", broker.url)
    router = rs.start_router(
        spawn,
        tmp_path,
        baseline,
        canary,
        "--no-shadow",
        "--gate-deadman-s",
        "1",
        broker=broker.url,
        gate=gate.url,
    )
    rs.wait_revision(router, release["revision"])
    assert _served_by(router) == "canary"
    os.kill(gate.pid, signal.SIGSTOP)
    try:
        body = wait_for(lambda: _fail_safe_on(router), timeout=30, what="the dead-man switch")
        assert isinstance(body, dict)
        _assert_canary_off(router, body)
    finally:
        os.kill(gate.pid, signal.SIGCONT)
    wait_for(lambda: _health(router)[1]["status"] == "ok", timeout=30, what="the gate back")
    assert _served_by(router) == "canary"


def test_a_gate_that_refuses_the_samples_trips_the_dead_man_switch_too(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    baseline, canary = rs.pools(models)
    rs.write_release_cache(tmp_path, weight=100)
    gate = rs.GateReceiver().start()
    try:
        gate.refuse_auth = 401
        router = rs.start_router(
            spawn, tmp_path, baseline, canary, "--no-shadow", "--gate-deadman-s", "1",
            gate=gate.url,
        )  # fmt: skip
        body = wait_for(lambda: _fail_safe_on(router), timeout=30, what="the dead-man switch")
        assert isinstance(body, dict)
        _assert_canary_off(router, body)
        assert body["gate_auth"] == "unauthorized"
        assert rs.metric(router, "router_gate_failsafe") == 1
        gate.refuse_auth = 0
        wait_for(lambda: _health(router)[1]["status"] == "ok", timeout=30)
        assert _served_by(router) == "canary"
        assert rs.metric(router, "router_gate_failsafe") == 0
    finally:
        gate.stop()
