"""Broker faults (latency, unavailable, drop_watch) with their TTLs, and router heartbeats
with expiry — each against its own real broker process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.broker_support import Api, start_broker
from tests.procs import Spawner, wait_for


def _broker(spawn: Spawner, tmp_path: Path, *extra: str) -> Api:
    api = Api(start_broker(spawn, tmp_path / "state", *extra).url)
    api.register("v1")
    api.register("v2")
    return api


def _inject(api: Api, **body: Any) -> dict[str, Any]:
    r = api.write("POST", "/admin/faults", body, headers={"x-actor": "test"})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _no_faults(api: Api) -> bool:
    return api.get("/admin/faults", headers=api.headers).json()["faults"] == []


def test_latency_fault_delays_api_requests_until_its_ttl(spawn: Spawner, tmp_path: Path) -> None:
    api = _broker(spawn, tmp_path)
    api.create("default")
    _inject(api, kind="latency", ttl_s=3, ms=1500)
    started = time.monotonic()
    assert api.get("/v1/releases/default").status_code == 200
    assert time.monotonic() - started >= 1.5
    started = time.monotonic()
    assert api.get("/health").status_code == 200
    assert api.get("/admin/faults", headers=api.headers).status_code == 200
    assert time.monotonic() - started < 1.5, "/health and /admin must not be delayed"
    wait_for(lambda: _no_faults(api), timeout=10, what="the latency fault to expire")
    started = time.monotonic()
    assert api.get("/v1/releases/default").status_code == 200
    assert time.monotonic() - started < 1.5


def test_unavailable_fault_503s_the_api_until_its_ttl(spawn: Spawner, tmp_path: Path) -> None:
    api = _broker(spawn, tmp_path)
    release = api.create("default")
    fault = _inject(api, kind="unavailable", ttl_s=1.5)
    assert fault["kind"] == "unavailable" and fault["ttl_s"] == 1.5
    r = api.get("/v1/releases/default")
    assert r.status_code == 503
    assert "unavailable" in r.json()["error"]["message"]
    assert api.patch("default", 1, weights={"canary": 9}).status_code == 503
    assert api.get("/health").status_code == 200
    assert api.get("/metrics").status_code == 200
    assert api.get("/admin/faults", headers=api.headers).json()["faults"][0]["id"] == fault["id"]
    wait_for(
        lambda: api.get("/v1/releases/default").status_code == 200,
        timeout=10,
        what="the broker to answer again after the fault's TTL",
    )
    assert api.release("default") == release  # the refused PATCH changed nothing


def test_drop_watch_hangs_long_polls_until_the_fault_ends(spawn: Spawner, tmp_path: Path) -> None:
    api = _broker(spawn, tmp_path)
    rev = api.create("default")["revision"]
    injected_before = time.monotonic()
    _inject(api, kind="drop_watch", ttl_s=3)
    out: dict[str, Any] = {}

    def watch() -> None:
        out["response"] = requests.get(
            api.url + "/v1/releases/default",
            params={"after": rev, "timeout_s": 0.3},
            timeout=30,
        )
        out["done"] = time.monotonic()

    thread = threading.Thread(target=watch)
    thread.start()
    wait_for(lambda: api.watchers() == 1, what="the watch to be held")
    # Plain reads and writes still work; the change does not release the watch.
    assert api.get("/v1/releases/default").status_code == 200
    assert api.patch("default", rev, weights={"canary": 3}).status_code == 200
    thread.join(timeout=20)
    assert not thread.is_alive()
    # It answered only once the fault's TTL ran out, and then normally.
    assert out["done"] >= injected_before + 2.9
    r = out["response"]
    assert r.status_code == 200
    assert r.json()["revision"] == rev + 1
    assert "x-watch-timeout" not in r.headers


def test_drop_watch_releases_a_client_that_gives_up(spawn: Spawner, tmp_path: Path) -> None:
    api = _broker(spawn, tmp_path)
    api.create("default")
    fault = _inject(api, kind="drop_watch", ttl_s=60)
    try:
        requests.get(
            api.url + "/v1/releases/default", params={"after": 1, "timeout_s": 1}, timeout=0.5
        )
        raise AssertionError("the watch answered under drop_watch")
    except requests.ReadTimeout:
        pass
    # The broker notices the disconnect and drops the hung long-poll.
    wait_for(lambda: api.watchers() == 0, timeout=10, what="the hung watch to be dropped")
    r = api.write("DELETE", f"/admin/faults/{fault['id']}")
    assert r.status_code == 200
    r = api.get("/v1/releases/default", params={"after": 1, "timeout_s": 0.2})
    assert r.status_code == 200 and r.headers["x-watch-timeout"] == "true"


def test_heartbeats_and_expiry(spawn: Spawner, tmp_path: Path) -> None:
    api = _broker(spawn, tmp_path, "--router-expiry-s", "1")

    def beat(router_id: str, release: str, applied: int | None, **more: float | None) -> None:
        body = {"router_id": router_id, "release": release, "applied_revision": applied, **more}
        r = api.write("POST", "/v1/routers/heartbeat", body)
        assert r.status_code == 200 and r.json() == {"ok": True}, r.text

    beat("router-0", "default", 3)
    beat("router-1", "other", None)
    body = api.get("/v1/routers").json()
    assert body["expiry_s"] == 1
    assert [(x["router_id"], x["release"], x["applied_revision"]) for x in body["routers"]] == [
        ("router-0", "default", 3),
        ("router-1", "other", None),
    ]
    assert all(x["age_s"] >= 0 and x["last_seen"] > 1e9 for x in body["routers"])
    # Beats without the optional fields (older routers) list them as null.
    assert all((x["applied_at"], x["canary_off_since"]) == (None, None) for x in body["routers"])
    # A router that says when it applied the revision and since when its canary is off.
    beat("router-0", "default", 3, applied_at=1_700_000_002.5, canary_off_since=1_700_000_001)
    (r0,) = api.get("/v1/routers", params={"release": "default"}).json()["routers"]
    assert (r0["applied_at"], r0["canary_off_since"]) == (1_700_000_002.5, 1_700_000_001.0)
    # Each beat replaces the last: canary traffic again (no canary_off_since) shows as null.
    beat("router-0", "default", 3, applied_at=1_700_000_003.0, canary_off_since=None)
    (r0,) = api.get("/v1/routers", params={"release": "default"}).json()["routers"]
    assert (r0["applied_at"], r0["canary_off_since"]) == (1_700_000_003.0, None)
    only = api.get("/v1/routers", params={"release": "default"}).json()["routers"]
    assert [x["router_id"] for x in only] == ["router-0"]
    beat("router-0", "default", 4)
    assert (
        api.get("/v1/routers", params={"release": "default"}).json()["routers"][0][
            "applied_revision"
        ]
        == 4
    )

    def only_router0_live() -> bool:
        beat("router-0", "default", 4)  # router-0 keeps beating; router-1 stopped
        ids = [x["router_id"] for x in api.get("/v1/routers").json()["routers"]]
        return ids == ["router-0"]

    wait_for(only_router0_live, timeout=10, interval=0.2, what="router-1 to expire")
    wait_for(
        lambda: api.get("/v1/routers").json()["routers"] == [],
        timeout=10,
        what="router-0 to expire once it stops beating",
    )
    metrics = api.get("/metrics").text
    assert "canarystack_broker_live_routers 0.0" in metrics


def test_second_broker_on_the_same_state_dir_is_refused(spawn: Spawner, tmp_path: Path) -> None:
    first = start_broker(spawn, tmp_path / "state")
    # Run directly, not through spawn: it must exit by itself, at once.
    second = subprocess.run(
        [sys.executable, "-m", "canarystack.broker", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode != 0
    assert "another broker" in second.stderr
    assert str(first.pid) in second.stderr
    assert requests.get(first.url + "/health", timeout=5).status_code == 200
