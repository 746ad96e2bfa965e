"""The rollback executor as a real process against a real broker.

The routers are stood in for by ``Routers``, a thread that sends the broker the same
heartbeats a router does (``POST /v1/routers/heartbeat`` with the revision it applied,
when, and since when its canary is off — or, like an older router, the revision only),
optionally late or stuck — real API calls to a real broker. Every test checks the
broker's event history: each step exactly once, with a timestamp.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.broker_support import Api, broker_with_versions, trip_evidence
from tests.procs import ADMIN_TOKEN, Proc, Spawner, inject_fault, post_fault, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CRASH_EXIT_CODE = 70


FAIL_SAFE_PHASES = ("tripped", "rolling_back", "rolled_back")


class Routers(threading.Thread):
    """Heartbeats like routers: each applies the broker's revision ``delay_s`` after it
    appears; a router in ``stuck`` never applies past the revision it had. Each beat says
    when the router applied its revision and since when its canary is off (0%: a
    fail-safe phase or weight 0), unless ``report_off`` is false (an older router)."""

    def __init__(
        self, api: Api, ids: list[str], delay_s: float = 0.0, report_off: bool = True
    ) -> None:
        super().__init__(daemon=True)
        self.api = Api(api.url)
        self.ids = ids
        self.delay_s = delay_s
        self.report_off = report_off
        self.stuck: set[str] = set()
        self.applied: dict[str, int] = {}
        self.applied_at: dict[tuple[str, int], float] = {}
        self.off_since: dict[str, float] = {}
        self._seen_at: dict[int, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                release = self.api.release("default")
            except (requests.RequestException, AssertionError):
                self._halt.wait(0.05)
                continue
            revision = int(release["revision"])
            canary_off = release["phase"] in FAIL_SAFE_PHASES or release["weights"]["canary"] == 0
            self._seen_at.setdefault(revision, time.time())
            for rid in self.ids:
                ready = time.time() - self._seen_at[revision] >= self.delay_s
                if rid not in self.stuck and ready and self.applied.get(rid) != revision:
                    self.applied[rid] = revision
                    now = time.time()
                    self.applied_at[(rid, revision)] = now
                    if not canary_off:
                        self.off_since.pop(rid, None)
                    elif rid not in self.off_since:
                        self.off_since[rid] = now
                with_rev = self.applied.get(rid)
                beat: dict[str, Any] = {
                    "router_id": rid,
                    "release": "default",
                    "applied_revision": with_rev,
                }
                if self.report_off and with_rev is not None:
                    beat["applied_at"] = self.applied_at[(rid, with_rev)]
                    beat["canary_off_since"] = self.off_since.get(rid)
                try:
                    self.api.write("POST", "/v1/routers/heartbeat", beat)
                except requests.RequestException:
                    pass
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def setup(spawn: Spawner, tmp_path: Path, *executor_args: str) -> tuple[Proc, Api, Proc]:
    broker, api = broker_with_versions(spawn, tmp_path / "broker", "--router-expiry-s", "2")
    executor = start_executor(spawn, broker, *executor_args)
    return broker, api, executor


def start_executor(spawn: Spawner, broker: Proc, *args: str, port: int = 0) -> Proc:
    return spawn("canarystack.rollback", "--broker", broker.url, *args, port=port)


def trip(api: Api) -> dict[str, Any]:
    """Trip the release as the gate does (phase=tripped with evidence, CAS)."""
    return api.patch_ok("default", phase="tripped", trip=trip_evidence(), reason="gate")


def rolled_back(api: Api, timeout: float = 20) -> dict[str, Any]:
    release = wait_for(
        lambda: (rel := api.release("default"))["phase"] == "rolled_back" and rel,
        timeout=timeout,
        what="phase=rolled_back",
    )
    assert isinstance(release, dict)
    return release


def step_events(api: Api) -> dict[str, list[dict[str, Any]]]:
    """The rollback's side effects as the broker recorded them."""
    out: dict[str, list[dict[str, Any]]] = {
        "weights_zero": [],
        "routers_applied": [],
        "quarantined": [],
        "rolled_back": [],
    }
    for ev in api.events("default"):
        change = ev["change"]
        phase = change.get("phase", {})
        if phase.get("new") == "rolling_back":
            out["weights_zero"].append(ev)
        elif phase.get("new") == "rolled_back":
            out["rolled_back"].append(ev)
        if change.get("annotation") == "routers_applied":
            out["routers_applied"].append(ev)
        if change.get("canary.quarantined", {}).get("new") is True:
            out["quarantined"].append(ev)
    return out


def assert_each_step_once(api: Api) -> dict[str, dict[str, Any]]:
    steps = step_events(api)
    for name, events in steps.items():
        assert len(events) == 1, (name, events)
    once = {name: events[0] for name, events in steps.items()}
    wz = once["weights_zero"]
    assert wz["change"]["weights.canary"]["new"] == 0
    assert wz["actor"] == "rollback"
    assert once["routers_applied"]["change"]["revision"] == wz["revision"]
    times = [once[n]["time"] for n in ("weights_zero", "routers_applied", "quarantined")]
    assert times == sorted(times)
    assert once["rolled_back"]["time"] >= times[-1]
    return once


@contextmanager
def routers_listed(api: Api, ids: list[str], **kw: Any) -> Iterator[Routers]:
    """Simulated routers ``ids`` heartbeating until the block ends; the broker lists them
    all before it begins."""
    routers = Routers(api, ids, **kw)
    routers.start()
    try:
        wait_for(lambda: len(api.get("/v1/routers").json()["routers"]) == len(ids), what="routers")
        yield routers
    finally:
        routers.stop()


def test_rollback_completes_in_three_steps_after_every_router_applied(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, executor = setup(spawn, tmp_path)
    with routers_listed(api, ["router-0", "router-1"], delay_s=0.5) as routers:
        trip(api)
        release = rolled_back(api)
    assert release["weights"]["canary"] == 0
    assert release["canary"]["quarantined"] is True
    assert release["trip"]["test"] == "drift"
    once = assert_each_step_once(api)
    applied = once["routers_applied"]["change"]
    revision = once["weights_zero"]["revision"]
    assert sorted(applied["routers"]) == ["router-0", "router-1"]
    assert applied["retries"] == 0
    # Step 2 waited for the (late) routers: annotated only after both applied.
    last_apply = max(routers.applied_at[(r, revision)] for r in ("router-0", "router-1"))
    assert once["routers_applied"]["time"] >= last_apply
    assert applied["waited_s"] >= 0.3
    # When users stopped getting the canary: the last router's canary_off_since, as each
    # router reported it, and each router's own times.
    off = {r: routers.off_since[r] for r in ("router-0", "router-1")}
    assert applied["canary_off_at"] == max(off.values())
    assert applied["canary_off_at"] <= once["routers_applied"]["time"]
    states = {s["router_id"]: s for s in applied["router_states"]}
    assert set(states) == {"router-0", "router-1"}
    for rid, state in states.items():
        assert state["canary_off_since"] == off[rid]
        assert state["applied_revision"] == revision
        assert state["applied_at"] == routers.applied_at[(rid, revision)]
    status = requests.get(executor.url + "/v1/rollbacks/default", timeout=5).json()
    assert status["state"] == "done"
    assert [s["name"] for s in status["steps"]] == [
        "weights_zero",
        "routers_applied",
        "quarantined",
        "rolled_back",
    ]
    assert all(s["time"] > 0 for s in status["steps"])
    assert status["steps"][1]["canary_off_at"] == applied["canary_off_at"]
    metrics = requests.get(executor.url + "/metrics", timeout=5).text
    assert 'canarystack_rollback_completed_total{release="default"} 1.0' in metrics


@pytest.mark.parametrize("step", [1, 2, 3])
def test_killed_after_each_step_the_restarted_executor_completes_once(
    spawn: Spawner, tmp_path: Path, step: int
) -> None:
    broker, api, executor = setup(spawn, tmp_path)
    routers = Routers(api, ["router-0"], report_off=False)  # an older router
    routers.start()
    try:
        inject_fault(executor.url, {"kind": "crash_after_step", "ttl_s": 60, "step": step})
        wait_for(lambda: api.get("/v1/routers").json()["routers"], what="a router")
        trip(api)
        wait_for(lambda: not executor.alive(), timeout=20, what="the crash after the step")
        assert executor.popen.returncode == CRASH_EXIT_CODE
        done = {name: len(evs) for name, evs in step_events(api).items()}
        expected = {
            1: {"weights_zero": 1, "routers_applied": 0, "quarantined": 0, "rolled_back": 0},
            2: {"weights_zero": 1, "routers_applied": 1, "quarantined": 0, "rolled_back": 0},
            3: {"weights_zero": 1, "routers_applied": 1, "quarantined": 1, "rolled_back": 1},
        }[step]
        assert done == expected
        # The restart (same port, as supervisord would) resumes from the broker's state.
        restarted = start_executor(spawn, broker, port=executor.port)
        rolled_back(api)
    finally:
        routers.stop()
    applied = assert_each_step_once(api)["routers_applied"]["change"]
    # The router did not say when its canary went off: no canary_off_at (readers fall back
    # to the annotation's time), and its state says what it did report.
    assert applied["canary_off_at"] is None
    assert applied["router_states"] == [
        {
            "router_id": "router-0",
            "applied_revision": applied["revision"],
            "applied_at": None,
            "canary_off_since": None,
        }
    ]
    status = requests.get(restarted.url + "/v1/rollbacks/default", timeout=5).json()
    assert status["state"] == "done" and len(status["steps"]) == 4


def test_sigkill_while_waiting_for_a_stuck_router_then_resume(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, api, executor = setup(spawn, tmp_path)
    with routers_listed(api, ["router-0", "router-1"]) as routers:
        routers.stuck.add("router-1")
        trip(api)

        def waiting_for_router_1() -> bool:
            status = requests.get(executor.url + "/v1/rollbacks/default", timeout=5).json()
            waiting = status["waiting"]
            return bool(waiting) and waiting["lagging"] == ["router-1"]

        wait_for(waiting_for_router_1, what="step 2 waiting for the stuck router only")
        executor.kill()
        routers.stuck.clear()
        start_executor(spawn, broker)
        rolled_back(api)
    once = assert_each_step_once(api)
    assert sorted(once["routers_applied"]["change"]["routers"]) == ["router-0", "router-1"]


def test_a_stuck_router_is_retried_recorded_and_the_rollback_goes_on(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, _ = setup(spawn, tmp_path, "--apply-timeout-s", "0.3", "--apply-retries", "2")
    with routers_listed(api, ["router-0", "router-1"]) as routers:
        routers.stuck.add("router-1")
        trip(api)
        rolled_back(api)
    applied = assert_each_step_once(api)["routers_applied"]["change"]
    assert applied["retries"] == 2
    assert applied["timed_out"] is True
    assert [lag["router_id"] for lag in applied["lagging"]] == ["router-1"]
    # router-1 never applied the trip: it still sends canary traffic, so no canary_off_at.
    assert applied["canary_off_at"] is None
    states = {s["router_id"]: s for s in applied["router_states"]}
    assert states["router-1"]["canary_off_since"] is None
    assert states["router-0"]["canary_off_since"] == routers.off_since["router-0"]
    assert applied["waited_s"] >= 0.9


def test_manual_rollback_and_its_errors(spawn: Spawner, tmp_path: Path) -> None:
    _, api, executor = setup(spawn, tmp_path, "--empty-routers-grace-s", "0.2")
    url = executor.url + "/v1/rollbacks/default"
    assert requests.post(url, json={"reason": "x"}, timeout=5).status_code == 401
    r = requests.post(url, json={"reason": "x", "force": True}, headers=ADMIN, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "force"
    r = requests.post(executor.url + "/v1/rollbacks/other", json={}, headers=ADMIN, timeout=5)
    assert r.status_code == 404 and "--release other" in r.json()["error"]["message"]
    r = requests.post(url, json={"reason": "users report gibberish"}, headers=ADMIN, timeout=15)
    assert r.status_code == 202, r.text
    # Answered once step 1 is in the broker.
    assert api.release("default")["phase"] in ("rolling_back", "rolled_back")
    assert r.json()["steps"][0]["name"] == "weights_zero"
    rolled_back(api)
    once = assert_each_step_once(api)
    assert "users report gibberish" in once["weights_zero"]["reason"]
    assert once["routers_applied"]["change"]["routers"] == []  # no live router
    assert once["routers_applied"]["change"]["canary_off_at"] is None
    again = requests.post(url, json={}, headers=ADMIN, timeout=5)
    assert again.status_code == 200 and again.json()["state"] == "done"
    # A promoted release has nothing to roll back.
    api.register("v3")
    api.patch_ok("default", phase="progressing", canary="v3", weights={"canary": 5})
    api.patch_ok("default", phase="promoted", weights={"canary": 0})
    r = requests.post(url, json={}, headers=ADMIN, timeout=5)
    assert r.status_code == 409 and "promoted" in r.json()["error"]["message"]


def test_latency_fault_delays_each_step(spawn: Spawner, tmp_path: Path) -> None:
    _, api, executor = setup(spawn, tmp_path, "--empty-routers-grace-s", "0")
    inject_fault(executor.url, {"kind": "latency", "ttl_s": 60, "ms": 300})
    tripped = trip(api)
    rolled_back(api)
    once = assert_each_step_once(api)
    # Each of the three steps waited 300 ms before it ran.
    assert once["weights_zero"]["time"] - tripped["updated_at"] >= 0.3
    assert once["routers_applied"]["time"] - once["weights_zero"]["time"] >= 0.3
    assert once["quarantined"]["time"] - once["routers_applied"]["time"] >= 0.3
    bad = post_fault(executor.url, {"kind": "crash_after_step", "ttl_s": 60, "step": 4})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "step"
