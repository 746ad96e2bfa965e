"""End to end: the stack trips itself on a faulty-kernel canary and rolls back, and does
not trip on a healthy canary — also under router latency and a killed baseline replica.

Every part is a real process: broker, two baseline model servers (v1), one canary model
server (v2, the simulator's version drift), two routers on one port (SO_REUSEPORT) that
shadow-sample and push to the gate, the gate, and the rollback executor. Traffic is
scripted mixed-length completions (about 14 % of prompts >= 2k tokens) sent through the
routers' shared port by a thread pool, bounded in count and time.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests.broker_support import Api, start_broker
from tests.procs import ADMIN_TOKEN, Proc, Spawner, free_port, wait_for
from tests.router_support import instance_url, start_model, start_router
from tests.test_rollback import assert_each_step_once

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

RATE_PER_S = 15.0
LONG_SHARE = 0.14
MAX_REQUESTS = 2_000


@dataclass
class Stack:
    broker: Proc
    api: Api
    baselines: list[Proc]
    canary: Proc
    routers: list[Proc]
    gate: Proc
    rollback: Proc
    url: str


def start_stack(spawn: Spawner, tmp_path: Path, *gate_args: str) -> Stack:
    broker = start_broker(spawn, tmp_path / "broker")
    api = Api(broker.url)
    api.register("v1")
    api.register("v2")
    api.create("default", stable="v1", canary="v2", weight=5)
    baselines = [start_model(spawn, "v1") for _ in range(2)]
    canary = start_model(spawn, "v2")
    gate = spawn("canarystack.gate", "--broker", broker.url, *gate_args)
    rollback = spawn("canarystack.rollback", "--broker", broker.url)
    port = free_port()
    routers = [
        start_router(
            spawn,
            tmp_path / "routers",
            [b.url for b in baselines],
            [canary.url],
            router_id=f"router-{i}",
            broker=broker.url,
            gate=gate.url,
            port=port,
        )
        for i in range(2)
    ]
    wait_for(
        lambda: len(api.get("/v1/routers", params={"release": "default"}).json()["routers"]) == 2,
        what="both routers heartbeating",
    )
    return Stack(
        broker, api, baselines, canary, routers, gate, rollback, f"http://127.0.0.1:{port}"
    )


class Traffic(threading.Thread):
    """Open-loop completions at ``rate_per_s``: mixed prompt lengths, random users."""

    def __init__(self, url: str, seed: int, rate_per_s: float = RATE_PER_S) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rate_per_s = rate_per_s
        self.rng = random.Random(seed)
        self.records: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def _one(self, n: int, prompt_tokens: int, user: str) -> None:
        start = time.time()
        rec: dict[str, Any] = {"start": start, "prompt_tokens": prompt_tokens, "served_by": ""}
        try:
            # A new connection per request, so SO_REUSEPORT spreads them over both routers.
            r = requests.post(
                self.url + "/v1/completions",
                json={
                    "model": "default",
                    "prompt": make_prompt(prompt_tokens, seed=n),
                    "max_tokens": 8,
                    "temperature": 0,
                },
                headers={"x-user-id": user, "connection": "close"},
                timeout=30,
            )
            rec["status"] = r.status_code
            rec["served_by"] = r.headers.get("x-served-by", "")
            rec["router_id"] = r.headers.get("x-router-id", "")
        except requests.RequestException as exc:
            rec["status"] = 0
            rec["error"] = type(exc).__name__
        rec["end"] = time.time()
        self.records.append(rec)

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=16) as pool:
            t0 = time.monotonic()
            for n in range(MAX_REQUESTS):
                if self._halt.is_set():
                    break
                delay = t0 + n / self.rate_per_s - time.monotonic()
                if delay > 0 and self._halt.wait(delay):
                    break
                if self.rng.random() < LONG_SHARE:
                    tokens = self.rng.randint(2048, 6000)
                else:
                    tokens = self.rng.randint(16, 1500)
                pool.submit(self._one, n, tokens, f"user-{self.rng.getrandbits(32)}")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=40)


def gate_state(stack: Stack) -> dict[str, Any]:
    return dict(requests.get(stack.gate.url + "/v1/gate/default", timeout=5).json())


def inject(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(url + "/admin/faults", json=body, headers=ADMIN, timeout=5)
    assert r.status_code == 201, r.text
    return dict(r.json())


def long_comparisons(state: dict[str, Any]) -> int:
    return int(sum(state["buckets"][b]["comparisons"] for b in ("2k-4k", "4k+")))


def wait_long_comparisons(stack: Stack) -> None:
    """Until the gate holds five comparisons of long prompts (the buckets a kernel fault
    from 2k tokens on reaches)."""
    wait_for(
        lambda: long_comparisons(gate_state(stack)) >= 5,
        timeout=30,
        what="long-prompt comparisons at the gate",
    )


def test_faulty_kernel_canary_trips_and_rolls_back(spawn: Spawner, tmp_path: Path) -> None:
    stack = start_stack(spawn, tmp_path)
    traffic = Traffic(stack.url, seed=1)
    traffic.start()
    try:
        wait_long_comparisons(stack)
        assert stack.api.release("default")["phase"] == "progressing"
        fault_time = time.time()
        inject(
            stack.canary.url,
            {"kind": "kernel", "ttl_s": 120, "mode": "fp8-kv-scale", "min_prompt_tokens": 2048},
        )
        release = wait_for(
            lambda: (rel := stack.api.release("default"))["phase"] == "rolled_back" and rel,
            timeout=60,
            what="trip and rollback",
        )
        time.sleep(1.0)  # keep traffic going: it must all stay on the baseline now
    finally:
        traffic.stop()
    assert isinstance(release, dict)
    trip = release["trip"]
    assert trip["test"] == "drift", trip
    assert trip["bucket"] in ("2k-4k", "4k+"), trip
    assert trip["tripped_at"] >= fault_time
    assert release["weights"]["canary"] == 0
    assert release["canary"]["quarantined"] is True
    once = assert_each_step_once(stack.api)
    assert sorted(once["routers_applied"]["change"]["routers"]) == ["router-0", "router-1"]
    # The routers said when their canary went off: after the trip (they apply it from
    # the broker), before the rollback executor saw them all at its own revision.
    applied = once["routers_applied"]["change"]
    trip_event = next(
        e
        for e in stack.api.events("default")
        if e["change"].get("phase", {}).get("new") == "tripped"
    )
    off_at = applied["canary_off_at"]
    assert trip_event["time"] <= off_at <= once["routers_applied"]["time"]
    assert {s["router_id"] for s in applied["router_states"]} == {"router-0", "router-1"}
    assert off_at == max(s["canary_off_since"] for s in applied["router_states"])
    # Users were protected: no request that started after the last router's canary went
    # off was served by the canary.
    late_canary = [r for r in traffic.records if r["served_by"] == "canary" and r["start"] > off_at]
    assert late_canary == []
    ok = [r for r in traffic.records if r.get("status") == 200]
    assert len(ok) >= 0.95 * len(traffic.records)
    state = gate_state(stack)
    assert state["state"] == "tripped" and state["trip_status"] == "written"


def run_healthy(stack: Stack, seconds: float, during: Any = None) -> Traffic:
    traffic = Traffic(stack.url, seed=2)
    traffic.start()
    try:
        wait_long_comparisons(stack)
        if during is not None:
            during()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert stack.api.release("default")["phase"] == "progressing", gate_state(stack)
            time.sleep(0.5)
    finally:
        traffic.stop()
    return traffic


def test_healthy_canary_does_not_trip(spawn: Spawner, tmp_path: Path) -> None:
    stack = start_stack(spawn, tmp_path)
    traffic = run_healthy(stack, seconds=10)
    state = gate_state(stack)
    assert state["state"] == "watching", state
    assert state["trip"] is None
    assert long_comparisons(state) >= 20
    assert state["noise_floor"]["all"]["samples"] > 0  # baseline-baseline comparisons came
    assert any(r["served_by"] == "canary" for r in traffic.records)
    assert stack.api.release("default")["phase"] == "progressing"


def test_router_latency_and_a_killed_baseline_replica_do_not_trip(
    spawn: Spawner, tmp_path: Path
) -> None:
    stack = start_stack(spawn, tmp_path)

    def faults() -> None:
        inject(instance_url(stack.routers[0]), {"kind": "latency", "ttl_s": 60, "ms": 150})
        stack.baselines[1].kill()

    traffic = run_healthy(stack, seconds=10, during=faults)
    state = gate_state(stack)
    assert state["state"] == "watching", state
    assert state["trip"] is None
    assert stack.api.release("default")["phase"] == "progressing"
    # The faults did hit: some requests were slow and the survivor served the baseline.
    via_0 = [r for r in traffic.records if r.get("router_id") == "router-0"]
    assert via_0, {r.get("router_id") for r in traffic.records}
    assert any(r["end"] - r["start"] >= 0.15 for r in via_0), sorted(
        round(r["end"] - r["start"], 3) for r in via_0
    )[-10:]
