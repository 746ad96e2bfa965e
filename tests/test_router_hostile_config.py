"""A misconfigured router fails safe and loud (#12), with real processes.

- ``--gate``/``--broker`` without an admin token, or a ``--watch-timeout-s`` above the
  broker's ``--max-watch-s``, refuses to start (exit 2, a message naming the flags).
- A gate that refuses the router's credential (401/403): the batch is kept and resent
  with the same ``batch_id`` once the gate accepts, and health, a metric and a log line
  say so meanwhile. A broker that refuses the heartbeat: the same report.
- Watch errors that persist past ``--watch-error-failsafe-s`` put the router at 0%
  canary (source ``failsafe``, pins refused) until a watch succeeds again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import router_support as rs
from tests.broker_support import restartable_broker, start_broker
from tests.procs import Proc, Spawner, free_port, wait_for

models = rs.models_fixture(b0="v1", c0="v2")


def run_router(
    tmp_path: Path, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Start a router that is expected to refuse to start; bounded in time."""
    env = {k: v for k, v in os.environ.items() if k != "CANARYSTACK_ADMIN_TOKEN"}
    if token is not None:
        env["CANARYSTACK_ADMIN_TOKEN"] = token
    cmd = [
        sys.executable,
        "-m",
        "canarystack.router",
        "--port",
        "0",
        "--ready-file",
        str(tmp_path / "never.ready.json"),
        "--state-dir",
        str(tmp_path),
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("flag", ["--gate", "--broker"])
def test_a_gate_or_broker_without_a_token_refuses_to_start(tmp_path: Path, flag: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    res = run_router(tmp_path, "--baseline", dead, flag, dead)
    assert res.returncode == 2, res.stderr
    assert flag in res.stderr and "no credential" in res.stderr
    cred_flag = {"--gate": "--gate-token-file", "--broker": "--broker-token-file"}[flag]
    assert cred_flag in res.stderr
    assert "CANARYSTACK_ADMIN_TOKEN" in res.stderr
    assert not (tmp_path / "never.ready.json").exists()


def test_a_watch_timeout_above_the_brokers_max_refuses_to_start(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    broker = start_broker(spawn, tmp_path / "broker", "--max-watch-s", "3")
    res = run_router(
        tmp_path,
        "--baseline",
        models["b0"].url,
        "--broker",
        broker.url,
        "--watch-timeout-s",
        "5",
        token="test-admin-token",
    )
    assert res.returncode == 2, res.stderr
    assert "--watch-timeout-s 5" in res.stderr and "--max-watch-s 3" in res.stderr
    # At or below the broker's maximum it starts.
    router = rs.start_router(spawn, tmp_path, [models["b0"].url], broker=broker.url)
    assert rs.health(router)["status"] == "ok"


@pytest.mark.parametrize(("status", "auth"), [(401, "unauthorized"), (403, "forbidden")])
def test_a_gate_refusing_the_credential_keeps_the_batch_and_says_so(
    spawn: Spawner,
    tmp_path: Path,
    models: dict[str, Proc],
    gate: rs.GateReceiver,
    status: int,
    auth: str,
) -> None:
    gate.refuse_auth = status
    router = rs.start_router(
        spawn, tmp_path, [models["b0"].url], None, "--no-shadow", gate=gate.url
    )
    assert rs.completion(router.url, headers={"x-request-id": "kept"}).status_code == 200
    wait_for(lambda: len(gate.refused) >= 2, what="the batch to be refused and retried")
    h = rs.health(router)
    assert h["status"] == "ok"  # it still serves users
    assert h["gate_auth"] == auth and str(status) in h["gate_auth_error"]
    assert rs.metric(router, "router_auth_errors_total", peer="gate", status=str(status)) >= 2
    assert any(e.get("event") == "gate_auth_refused" for e in router.log_events())
    assert rs.metric(router, "router_gate_pushes_total", result="rejected") == 0
    # The same batch is resent, same id, once the gate takes the credential again.
    refused_ids = {b["batch_id"] for b in gate.refused}
    assert len(refused_ids) == 1
    gate.refuse_auth = 0
    wait_for(lambda: "kept" in [o["request_id"] for o in gate.records("outcomes")], what="kept")
    assert gate.batches[0]["batch_id"] in refused_ids
    assert rs.health(router)["gate_auth"] == "ok"


def test_a_broker_refusing_the_heartbeat_is_reported(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    # the router applies the release: reads need no token
    router, api, _ = rs.router_on_release(
        spawn, tmp_path, [models["b0"].url], weight=5, admin_token="a-wrong-token"
    )
    wait_for(lambda: rs.health(router)["broker_auth"] == "unauthorized", what="broker_auth")
    h = rs.health(router)
    assert h["status"] == "ok" and "401" in h["broker_auth_error"]
    assert rs.metric(router, "router_auth_errors_total", peer="broker", status="401") >= 1
    assert any(e.get("event") == "broker_auth_refused" for e in router.log_events())
    # The broker never lists it: the rollback executor cannot count it as applied.
    assert all(r["router_id"] != "router-0" for r in api.routers())


def test_persistent_watch_errors_send_the_router_to_zero_canary(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    broker, restart_broker = restartable_broker(spawn, tmp_path / "broker")
    release = rs.Broker(broker.url).create(weight=100)
    router = rs.start_router(
        spawn, tmp_path, *rs.pools(models), "--watch-error-failsafe-s", "1", broker=broker.url
    )
    rs.wait_revision(router, release["revision"])
    assert rs.completion(router.url).headers["x-served-by"] == "canary"
    broker.kill()
    wait_for(
        lambda: rs.health(router)["config"]["source"] == "failsafe", timeout=15, what="failsafe"
    )
    h = rs.health(router)
    assert h["config"]["effective_canary_weight"] == 0
    assert h["config"]["revision"] == release["revision"]  # nothing newer was applied
    assert rs.metric(router, "router_canary_weight_percent") == 0
    assert rs.completion(router.url).headers["x-served-by"] == "baseline"
    pinned = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert pinned.status_code == 409 and "fail-safe" in pinned.json()["error"]["message"]
    assert any(e.get("event") == "config_failsafe" for e in router.log_events())
    # The broker is back: the first watch that succeeds ends the fail-safe.
    restart_broker()
    wait_for(lambda: rs.health(router)["config"]["source"] == "broker", timeout=15, what="recovery")
    assert rs.completion(router.url).headers["x-served-by"] == "canary"
