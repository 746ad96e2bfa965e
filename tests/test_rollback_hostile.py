"""The rollback executor as a real process when things around it go wrong (issue #12,
items 3, 7 and 9): routers that go quiet at the trip, a wrong credential, a broker that
answers nonsense, hostile bodies, and a broker history longer than one page."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from canarystack.rollback.service import RollbackHealth
from tests.broker_support import (
    Api,
    broker_with_versions,
    not_a_broker,
    preload_history,
    start_broker,
)
from tests.procs import ADMIN_TOKEN, Proc, Spawner, wait_degraded, wait_for
from tests.test_rollback import (
    ADMIN,
    Routers,
    assert_each_step_once,
    rolled_back,
    setup,
    start_executor,
    step_events,
    trip,
)


def _status(executor: Proc) -> dict[str, Any]:
    return dict(requests.get(executor.url + "/v1/rollbacks/default", timeout=5).json())


def _health(executor: Proc) -> requests.Response:
    return requests.get(executor.url + "/health", timeout=5)


def _metric(executor: Proc, name: str, **labels: str) -> float:
    text = requests.get(executor.url + "/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


# -- routers that go quiet -------------------------------------------------------------------
def test_routers_that_go_quiet_at_the_trip_are_waited_for(spawn: Spawner, tmp_path: Path) -> None:
    # Default executor settings: an empty router list is accepted after 3 s, but only
    # when no router was seen recently.
    _, api, executor = setup(spawn, tmp_path)
    routers = Routers(api, ["router-0"])
    routers.start()
    wait_for(lambda: api.get("/v1/routers").json()["routers"], what="router-0 live")
    routers.stop()  # it stops heartbeating just as the trip happens
    trip(api)

    def waiting_past_the_grace() -> dict[str, Any] | None:
        waiting = _status(executor)["waiting"]
        if waiting and waiting["routers"] == 0 and waiting["waited_s"] >= 3.5:
            return dict(waiting)
        return None

    waiting = wait_for(waiting_past_the_grace, timeout=20, what="step 2 still waiting after 3 s")
    assert isinstance(waiting, dict)
    assert waiting["quiet"] == ["router-0"]
    assert "router-0 heartbeated recently" in waiting["reason"]
    assert step_events(api)["routers_applied"] == []
    assert api.release("default")["phase"] == "rolling_back"

    back = Routers(api, ["router-0"])  # the router comes back and applies the rollback
    back.start()
    try:
        rolled_back(api, timeout=30)
    finally:
        back.stop()
    applied = assert_each_step_once(api)["routers_applied"]["change"]
    assert applied["routers"] == ["router-0"]
    assert "timed_out" not in applied


def test_routers_that_stay_quiet_time_out_and_are_recorded(spawn: Spawner, tmp_path: Path) -> None:
    # Two attempts of 1.5 s: longer than the broker's 2 s router expiry, so the router has
    # dropped off the live list before step 2 gives up.
    _, api, _ = setup(spawn, tmp_path, "--apply-timeout-s", "1.5", "--apply-retries", "1")
    routers = Routers(api, ["router-0"])
    routers.start()
    wait_for(lambda: api.get("/v1/routers").json()["routers"], what="router-0 live")
    routers.stop()
    before = routers.applied["router-0"]
    trip(api)
    rolled_back(api, timeout=30)
    applied = assert_each_step_once(api)["routers_applied"]["change"]
    assert applied["routers"] == []
    assert applied["timed_out"] is True
    assert applied["lagging"] == [
        {"router_id": "router-0", "applied_revision": before, "stopped_heartbeating": True}
    ]
    assert [q["router_id"] for q in applied["quiet"]] == ["router-0"]
    assert applied["canary_off_at"] is None
    assert applied["waited_s"] >= 3.0


# -- credentials and loops -------------------------------------------------------------------
def test_a_wrong_credential_makes_health_degraded_and_steps_are_retried(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, api = broker_with_versions(spawn, tmp_path / "broker")
    executor = spawn(
        "canarystack.rollback",
        "--broker",
        broker.url,
        "--empty-routers-grace-s",
        "0",
        admin_token="not-the-brokers-token",
        wait_health=False,
    )
    health = wait_degraded(executor, what="/health 503 for the refused credential")
    assert health["status"] == "degraded" and health["broker_auth"] == "unauthorized"
    assert any(r.startswith("broker_auth:") for r in health["degraded_reasons"])
    trip(api)  # the gate's trip; the executor cannot write step 1 and keeps trying
    wait_for(
        lambda: (
            _metric(
                executor,
                "canarystack_rollback_broker_errors_total",
                release="default",
                kind="unauthorized",
            )
            >= 2
        ),
        what="step 1 refused and retried",
    )
    assert executor.alive()
    assert api.release("default")["phase"] == "tripped"
    refused = [e for e in executor.log_events() if e.get("event") == "broker_auth_refused"]
    assert refused and refused[0]["status"] == 401
    assert _status(executor)["last_error"] is not None


def test_a_watch_that_meets_a_bad_answer_is_reported_not_dead(
    spawn: Spawner, tmp_path: Path
) -> None:
    # A misconfigured --broker: a plain file server that answers 200 with a JSON object
    # that is not a release. The watch must neither die nor look fine.
    with not_a_broker(tmp_path, '{"name": "default"}') as url:
        executor = spawn("canarystack.rollback", "--broker", url, wait_health=False)

        def watch_failing() -> dict[str, Any] | None:
            r = _health(executor)
            body = r.json()
            reasons = [x for x in body.get("degraded_reasons", []) if "watch:default" in x]
            return dict(body) if r.status_code == 503 and reasons else None

        health = wait_for(watch_failing, what="/health naming the failing watch loop")
        assert isinstance(health, dict)
        reason = next(x for x in health["degraded_reasons"] if "watch:default" in x)
        assert "(bad_answer)" in reason and "no integer 'revision'" in reason
        assert health["loops"]["watch:default"]["running"] is True
        wait_for(
            lambda: (
                _metric(
                    executor,
                    "canarystack_rollback_loop_errors_total",
                    loop="watch:default",
                    kind="bad_answer",
                )
                >= 2
            ),
            what="the watch retried",
        )
        assert executor.alive()


def test_a_healthy_executor_says_ok(spawn: Spawner, tmp_path: Path) -> None:
    _, _, executor = setup(spawn, tmp_path)

    def checked() -> dict[str, Any] | None:
        body = _health(executor).json()
        loop = body["loops"].get("credential", {})
        return dict(body) if loop and loop["errors"] == 0 else None

    body = wait_for(checked, what="the credential loop")
    assert isinstance(body, dict)
    assert _health(executor).status_code == 200
    assert body["status"] == "ok" and body["broker_auth"] == "ok"
    assert body["degraded_reasons"] == []


# -- hostile bodies --------------------------------------------------------------------------
def test_hostile_manual_rollback_bodies_get_4xx_and_start_nothing(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, executor = setup(spawn, tmp_path)
    url = executor.url + "/v1/rollbacks/default"
    headers = {**ADMIN, "Content-Type": "application/json"}
    cases = [
        (b'{"reason": "' + b"a" * 20_000 + b'"}', 413, "16384 bytes"),
        (b'{"reason": NaN}', 400, "NaN is not a JSON number"),
        (b'{"reason": "users see \\ud800"}', 400, "lone surrogate"),
        (b'{"reason": "x", "n": ' + b"1" * 5000 + b"}", 400, "5000 digits"),
        (b"[" * 5_000 + b"]" * 5_000, 400, "nested"),
    ]
    for raw, status, text in cases:
        r = requests.post(url, data=raw, headers=headers, timeout=15)
        assert r.status_code == status, (raw[:40], r.text)
        assert text in r.json()["error"]["message"], r.text
        assert requests.get(url, timeout=5).status_code == 200
    assert api.release("default")["phase"] == "progressing"
    assert step_events(api)["weights_zero"] == []


# -- a long-lived broker -----------------------------------------------------------------------
def test_the_executor_reads_every_page_of_a_long_history(spawn: Spawner, tmp_path: Path) -> None:
    state = tmp_path / "broker"
    preload_history(state, 10_050)  # the newest events are past the first 10,000
    broker = start_broker(spawn, state, "--router-expiry-s", "2")
    api = Api(broker.url)
    start_executor(spawn, broker, "--empty-routers-grace-s", "0.2")
    trip(api)
    release = rolled_back(api, timeout=30)
    assert release["canary"]["quarantined"] is True
    assert_each_step_once(api)


# -- flags -------------------------------------------------------------------------------------
def start_refused(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m canarystack.rollback --broker http://127.0.0.1:9 ARGS``, a start that
    is to fail (bounded in time); ``env`` None inherits this one."""
    cmd = [sys.executable, "-m", "canarystack.rollback", "--broker", "http://127.0.0.1:9", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)


def test_a_release_name_the_broker_refuses_is_refused_at_start() -> None:
    env = {"CANARYSTACK_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": "/usr/bin:/bin"}
    done = start_refused("--release", "bad name", env=env)
    assert done.returncode == 2
    assert "--release 'bad name' is not a release name" in done.stderr


def test_a_loop_that_ends_makes_health_degraded() -> None:
    # No broker needed: the service's own supervision, on a real event loop. A loop that
    # ends (here: a bug raising out of it) must never look fine.
    from canarystack.common.app import Component
    from canarystack.common.faults import FaultRegistry
    from canarystack.rollback.executor import ExecutorConfig
    from canarystack.rollback.server import FAULT_KINDS, RollbackService

    async def scenario() -> RollbackHealth:
        comp = Component(
            name="rollback",
            version="test",
            admin_token=None,
            faults=FaultRegistry("rollback", FAULT_KINDS, max_ttl_s=60),
        )
        service = RollbackService(comp, "http://127.0.0.1:9", ["default"], ExecutorConfig())
        assert service.health()["degraded_reasons"] == []

        async def broken_loop() -> None:
            raise RuntimeError("a bug in the loop")

        task = service.supervise("watch:default", broken_loop())
        with contextlib.suppress(RuntimeError):
            await task
        await asyncio.sleep(0)
        return service.health()

    health = asyncio.run(scenario())
    assert health["status"] == "degraded"
    assert health["degraded_reasons"] == [
        "loop watch:default ended: RuntimeError: a bug in the loop"
    ]
    assert health["loops"]["watch:default"]["running"] is False


def test_infinite_durations_are_refused_at_start() -> None:
    for flag in ("--apply-timeout-s", "--empty-routers-grace-s", "--poll-ms"):
        done = start_refused(flag, "inf")
        assert done.returncode == 2, (flag, done.stderr)
        assert f"{flag} must be a finite number, got inf" in done.stderr
