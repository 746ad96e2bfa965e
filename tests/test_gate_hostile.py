"""The gate as a real process against hostile batches and a misconfigured broker (#12).

Real broker and gate processes; the test plays the routers (POSTs to ``/v1/samples``).
The pure statistics behind these are in test_gate_hostile_state.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import requests

from canary_contract.broker import Release
from canarystack.broker.client import BrokerClient
from canarystack.common.auth import ENV_VAR
from canarystack.gate.server import SAMPLES_BODY_LIMIT, SERVICE, GateService, build_app
from canarystack.gate.state import GateConfig, TripStatus
from tests.broker_support import Api, broker_with_versions, start_broker
from tests.procs import ADMIN_TOKEN, Proc, Spawner, wait_degraded, wait_for
from tests.test_gate_service import (
    ADMIN,
    batch,
    comparison,
    gate_state,
    post,
    setup_stack,
    wait_trip_landed,
)


def noise(kl: float) -> dict[str, Any]:
    return comparison("4k+", kl, pair="baseline-baseline", version_b="v1")


def health(proc: Proc) -> tuple[int, dict[str, Any]]:
    r = requests.get(proc.url + "/health", timeout=5)
    return r.status_code, dict(r.json())


def metric_value(proc: Proc, prefix: str) -> float:
    """The sum of every sample line that starts with ``prefix`` (0 when none)."""
    text = requests.get(proc.url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    )


def test_a_crafted_noise_batch_cannot_make_later_batches_fail(
    spawn: Spawner, tmp_path: Path
) -> None:
    # Found against today's gate: 1e308 then 499 x 1.0 then 500 x 0.0 baseline-baseline
    # made the running noise sum negative; every later batch with a baseline-canary
    # comparison in 4k+ then answered 500, for good.
    _, api, gate = setup_stack(spawn, tmp_path)
    crafted = [noise(1e308)] + [noise(1.0) for _ in range(499)] + [noise(0.0) for _ in range(500)]
    r = post(gate, batch(crafted))
    assert r.status_code == 200, r.text
    for _ in range(3):
        r = post(gate, batch([comparison("4k+", 0.01)]))
        assert r.status_code == 200, r.text
        assert r.json()["accepted"]["comparisons"] == 1
    state = gate_state(gate)
    floor = state["noise_floor"]["4k+"]
    assert floor["kl"] == 0.0 and floor["samples"] == 500
    # A broken canary's astronomically large KL is accepted and counted at the clip.
    r = post(gate, batch([comparison("4k+", 1e308)]))
    assert r.status_code == 200, r.text
    assert gate_state(gate)["buckets"]["4k+"]["drift"]["kl"]["mean"] <= 1.0
    status, body = health(gate)
    assert status == 200 and body["status"] == "ok", body
    assert api.release("default")["phase"] == "progressing"


def test_out_of_bounds_sample_values_get_a_400_naming_the_field(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, _, gate = setup_stack(spawn, tmp_path)
    cases = [
        (batch([comparison("4k+", 0.1, ttft_a_s=1e9)]), "comparisons[0].ttft_a_s", "3600"),
        (batch([comparison("4k+", 0.1, time=1e300)]), "comparisons[0].time", "less than"),
        ({**batch(), "batch_id": ""}, "batch_id", "at least 1"),
        ({**batch(), "dropped": 10**20}, "dropped", "less than"),
    ]
    for body, param, text in cases:
        r = post(gate, body)
        assert r.status_code == 400, (param, r.text)
        err = r.json()["error"]
        assert err["param"] == param, err
        assert text in err["message"], err
    # A batch whose last sample is bad is refused whole: nothing of it was counted.
    good = [comparison("4k+", 0.01) for _ in range(10)]
    r = post(gate, batch([*good, {**comparison("4k+", 0.01), "bucket": "3k-5k"}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "comparisons[10].bucket"
    assert gate_state(gate)["samples"]["comparisons"] == 0
    # A body larger than any router batch is refused before it is parsed (it would
    # hold the event loop): 413 naming the limit.
    big = b'{"router_id": "r", "release": "default"' + b" " * SAMPLES_BODY_LIMIT + b"}"
    r = requests.post(gate.url + "/v1/samples", data=big, headers=ADMIN, timeout=10)
    assert r.status_code == 413, r.text[:300]
    assert str(SAMPLES_BODY_LIMIT) in r.json()["error"]["message"]


def test_a_resent_batch_counts_once(spawn: Spawner, tmp_path: Path) -> None:
    _, _, gate = setup_stack(spawn, tmp_path)
    body = {**batch([comparison("4k+", 0.01) for _ in range(7)]), "batch_id": "r-1/42"}
    first = post(gate, body)
    assert first.status_code == 200, first.text
    assert first.json()["duplicate"] is False
    assert first.json()["accepted"]["comparisons"] == 7
    again = post(gate, body)  # the router's retry after a lost answer
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    assert again.json()["accepted"]["comparisons"] == 0
    state = gate_state(gate)
    assert state["samples"]["comparisons"] == 7
    assert state["buckets"]["4k+"]["comparisons"] == 7
    assert state["duplicate_batches"] == 1
    assert metric_value(gate, 'canarystack_gate_batches_total{result="duplicate"}') == 1


def test_a_refused_credential_never_loses_the_trip(spawn: Spawner, tmp_path: Path) -> None:
    # The gate holds a token the broker does not accept: today the 401 abandoned the
    # trip for good. Now it is retried and reported, and lands once the credential works.
    gate_token = "gate-token-the-broker-does-not-know"
    broker, api = broker_with_versions(spawn, tmp_path / "broker")
    # Degraded from the start (its credential check at the broker's /v1/whoami fails).
    gate = spawn(
        "canarystack.gate", "--broker", broker.url, admin_token=gate_token, wait_health=False
    )
    wait_for(lambda: gate_state(gate)["revision"] is not None, what="the gate to read it")
    headers = {"Authorization": f"Bearer {gate_token}"}
    r = post(gate, batch([comparison("4k+", 0.8) for _ in range(20)]), headers=headers)
    assert r.status_code == 200 and r.json()["state"] == "tripped", r.text
    body = wait_degraded(gate, what="the gate's health to say degraded")
    assert body["status"] == "degraded"
    assert body["broker_auth"] == "unauthorized"
    assert "broker_auth_unauthorized" in body["degraded_reasons"]
    # degraded came from the start-up credential check: wait for the trip's own first
    # write to have been refused (on a slow machine it may not have been tried yet)
    wait_for(lambda: gate_state(gate)["trip_status_reason"], what="the trip's write refused")
    state = gate_state(gate)
    assert state["state"] == "tripped"  # the gate's own decision shows meanwhile
    assert state["trip_status"] == "writing"
    assert "401" in state["trip_status_reason"]
    assert metric_value(gate, "canarystack_gate_broker_auth_errors_total") >= 1
    assert metric_value(gate, 'canarystack_gate_degraded{reason="broker_auth_unauthorized"}') == 1
    assert any(e.get("event") == "trip_unauthorized" for e in gate.log_events())
    assert api.release("default")["phase"] == "progressing"
    # The operator fixes the credential (here: the broker now accepts the gate's token).
    broker.stop()
    spawn(
        "canarystack.broker",
        "--state-dir",
        str(tmp_path / "broker"),
        port=broker.port,
        admin_token=gate_token,
    )
    wait_trip_landed(api, gate, "4k+", what="the trip to land once the credential works")
    status, body = health(gate)
    assert status == 200 and body["broker_auth"] == "ok", body


def test_a_watch_timeout_above_the_broker_limit_does_not_blind_the_gate(
    spawn: Spawner, tmp_path: Path
) -> None:
    # Today the broker's 400 for timeout_s killed the watch task silently: the gate kept
    # its first view of the release and never saw a later change.
    broker = start_broker(spawn, tmp_path / "broker", "--max-watch-s", "1")
    api = Api(broker.url)
    for v in ("v1", "v2", "v3"):
        api.register(v)
    api.create("default", stable="v1", canary="v2", weight=5)
    gate = spawn("canarystack.gate", "--broker", broker.url, "--watch-timeout-s", "30")
    wait_for(lambda: gate_state(gate)["revision"] is not None, what="the gate to read it")
    time.sleep(1.5)  # long enough for today's watch task to have died
    rel = api.patch_ok("default", weights={"canary": 20}, reason="next step")
    state = wait_for(
        lambda: (s := gate_state(gate))["revision"] == rel["revision"] and s,
        timeout=10,
        what="the gate to see the new revision",
    )
    assert isinstance(state, dict) and state["canary_weight"] == 20
    wait_for(lambda: health(gate)[0] == 200, what="the gate healthy again")
    _, body = health(gate)
    assert body["watch_timeout_s"] <= 1
    assert body["watch_timeout_lowered_from"] == 30
    assert any(e.get("event") == "watch_timeout_lowered" for e in gate.log_events())


def test_a_gate_without_an_admin_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    done = subprocess.run(
        [sys.executable, "-m", "canarystack.gate", "--broker", "http://127.0.0.1:9", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no trip credential" in done.stderr and "--broker-token-file" in done.stderr
    assert ENV_VAR in done.stderr and "--admin-token-file" in done.stderr


# ------------------------------------------------------------------ the watch loops
# In-process: the gate's own watch coroutine against a real broker, with one bug put
# into the gate's handling of an answer (what no real input should do any more).


def _service(broker_url: str) -> GateService:
    app = build_app(
        GateConfig(), broker_url, ["default"], admin_token=ADMIN_TOKEN, max_fault_ttl_s=60
    )
    return app[SERVICE]


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def test_the_watch_loop_survives_an_error_and_says_so_until_it_recovers(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, api = broker_with_versions(spawn, tmp_path / "broker")

    async def scenario() -> None:
        service = _service(broker.url)
        service.watch_timeout_s = 1.0
        gate = service.gates["default"]
        real = gate.on_release
        calls = {"n": 0}

        def flaky(release: Release | None, now_mono: float) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("a bug in the gate's handling of a broker answer")
            real(release, now_mono)

        gate.on_release = flaky  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as session:
            service.client = BrokerClient(session, broker.url, ADMIN_TOKEN, actor="gate")
            task = asyncio.create_task(service.watch("default"))
            service._loops["watch:default"] = task
            try:
                await _until(
                    lambda: "loop_failing:watch:default" in service.degraded_reasons(),
                    10,
                    "the error to be reported",
                )
                body = service.health()
                assert body["status"] == "degraded"
                assert "RuntimeError" in body["loop_errors"]["watch:default"]
                await asyncio.to_thread(
                    api.patch_ok, "default", weights={"canary": 20}, reason="next step"
                )
                await _until(lambda: gate.canary_weight == 20, 10, "the loop to go on")
                await _until(lambda: service.degraded_reasons() == [], 10, "recovery")
                assert not task.done()
                assert "status" not in service.health()  # ok (the base app's default)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        errors = service.watch_errors_total.labels(loop="watch:default", error="RuntimeError")
        assert errors._value.get() == 1

    asyncio.run(scenario())


def test_a_watch_loop_that_ends_anyway_makes_the_gate_degraded() -> None:
    async def scenario() -> None:
        service = _service("http://127.0.0.1:9")
        # No client: the loop cannot even start (a bug of this kind ends the task).
        task = asyncio.create_task(service.watch("default"))
        service._loops["watch:default"] = task
        with contextlib.suppress(AssertionError):
            await task
        body = service.health()
        assert body["status"] == "degraded"
        assert "loop_died:watch:default" in body["degraded_reasons"]
        assert service.degraded_total.labels(reason="loop_died")._value.get() == 1

    asyncio.run(scenario())


def test_an_error_while_writing_a_trip_is_retried_not_lost(spawn: Spawner, tmp_path: Path) -> None:
    broker, api = broker_with_versions(spawn, tmp_path / "broker")

    async def scenario() -> None:
        service = _service(broker.url)
        gate = service.gates["default"]
        gate.on_release(
            Release.from_wire(await asyncio.to_thread(api.release, "default")), time.monotonic()
        )
        real = gate.on_release
        calls = {"n": 0}

        def flaky(release: Release | None, now_mono: float) -> None:
            calls["n"] += 1
            if calls["n"] == 1:  # the writer's first look at the broker's answer
                raise RuntimeError("a bug in the gate's handling of the written release")
            real(release, now_mono)

        gate.on_release = flaky  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as session:
            service.client = BrokerClient(session, broker.url, ADMIN_TOKEN, actor="gate")
            answer = await service.ingest(batch([comparison("4k+", 0.8) for _ in range(20)]))
            assert answer["state"] == "tripped"
            await _until(
                lambda: gate.trip_status is TripStatus.WRITTEN, 10, "the trip to be written"
            )
            assert service.degraded_reasons() == []
        errors = service.watch_errors_total.labels(loop="trip:default", error="RuntimeError")
        assert errors._value.get() == 1

    asyncio.run(scenario())
    release = api.release("default")
    assert release["phase"] == "tripped" and release["trip"]["bucket"] == "4k+"
    trips = [e for e in api.events("default") if "trip" in e["change"]]
    assert len(trips) == 1  # written once, not twice
