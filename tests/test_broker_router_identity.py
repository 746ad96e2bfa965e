"""Identity-bound heartbeats (#27, finding 7): a router's credential speaks for that router
only, a heartbeat cannot claim a revision the broker never issued, the routers listed are
capped, and a flood of phantom router ids never delays a rollback."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import requests

from tests.broker_support import Api, start_broker, trip_evidence
from tests.procs import Proc, Spawner, wait_for


def mint(creds: Path, router_id: str) -> str:
    """A router-bound credential, minted the way an operator does."""
    out = subprocess.run(
        [sys.executable, "-m", "canarystack.broker.router_token",
         "--credentials-dir", str(creds), router_id],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.strip()


def broker(spawn: Spawner, tmp_path: Path, creds: Path, *extra: str) -> tuple[Proc, Api]:
    proc = start_broker(
        spawn, tmp_path / "broker", "--credentials-dir", str(creds),
        "--admin-token-file", str(creds / "faults-broker"), "--router-expiry-s", "2", *extra,
    )  # fmt: skip
    api = Api(proc.url, (creds / "operator").read_text().strip())
    for v in ("v1", "v2"):
        api.register(v)
    api.create("default", stable="v1", canary="v2", weight=5)
    return proc, api


def beat(url: str, token: str, router_id: str, revision: int | None) -> requests.Response:
    body = {"router_id": router_id, "release": "default", "applied_revision": revision}
    return Api(url, token).write("POST", "/v1/routers/heartbeat", body)


def listed(api: Api) -> dict[str, dict[str, Any]]:
    return {r["router_id"]: r for r in api.get("/v1/routers").json()["routers"]}


def test_a_router_credential_speaks_for_its_own_router_only(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    proc, api = broker(spawn, tmp_path, creds)
    own = mint(creds, "router-0")
    assert beat(proc.url, own, "router-0", 1).status_code == 200
    assert listed(api)["router-0"]["identity"] == "bound"

    r = beat(proc.url, own, "router-1", 1)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "router_identity"
    assert "belongs to router 'router-0'" in r.json()["error"]["message"]
    # The shared heartbeat credential cannot speak for a router that has its own.
    shared = (creds / "heartbeat").read_text().strip()
    r = beat(proc.url, shared, "router-0", 0)
    assert r.status_code == 403, r.text
    assert "has its own credential" in r.json()["error"]["message"]
    assert listed(api)["router-0"]["applied_revision"] == 1
    # A token that looks bound but was not minted from this broker's heartbeat token.
    forged = own.rsplit(".", 1)[0] + "." + "0" * 64
    assert beat(proc.url, forged, "router-0", 1).status_code == 401


def test_a_heartbeat_cannot_claim_a_revision_the_broker_never_issued(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    proc, api = broker(spawn, tmp_path, creds)
    current = api.release("default")["revision"]
    r = beat(proc.url, mint(creds, "router-0"), "router-0", current + 1)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["error"]["code"] == "revision_ahead"
    assert body["known_revision"] == current
    assert "router-0" not in listed(api)


def test_the_shared_credential_is_refused_when_router_credentials_are_required(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    proc, _ = broker(spawn, tmp_path, creds, "--require-router-credentials")
    shared = (creds / "heartbeat").read_text().strip()
    r = beat(proc.url, shared, "router-0", 1)
    assert r.status_code == 403, r.text
    assert "canarystack.broker.router_token" in r.json()["error"]["message"]
    assert beat(proc.url, mint(creds, "router-0"), "router-0", 1).status_code == 200


def test_a_flood_of_router_ids_stops_at_the_cap_with_a_clear_429(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    proc, api = broker(spawn, tmp_path, creds, "--max-routers", "5")
    shared = (creds / "heartbeat").read_text().strip()
    codes = [beat(proc.url, shared, f"phantom-{i}", 1).status_code for i in range(40)]
    assert codes[:5] == [200] * 5 and set(codes[5:]) == {429}
    r = beat(proc.url, shared, "phantom-99", 1)
    assert r.json()["error"]["code"] == "too_many_routers"
    assert "--max-routers" in r.json()["error"]["message"]
    # A router already listed keeps beating; a router-bound one is admitted past the cap.
    assert beat(proc.url, shared, "phantom-0", 1).status_code == 200
    assert beat(proc.url, mint(creds, "router-0"), "router-0", 1).status_code == 200
    assert len(listed(api)) == 6


class BoundRouters(threading.Thread):
    """Routers that heartbeat with their own credentials and apply every revision at once."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens = url, tokens
        self._halt = threading.Event()

    def run(self) -> None:
        reader = Api(self.url, None)
        while not self._halt.is_set():
            try:
                revision = reader.release("default")["revision"]
                for rid, token in self.tokens.items():
                    beat(self.url, token, rid, revision)
            except (requests.RequestException, AssertionError):
                pass
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def test_phantom_routers_never_delay_a_rollback(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    proc, api = broker(spawn, tmp_path, creds, "--require-router-credentials")
    executor = spawn(
        "canarystack.rollback", "--broker", proc.url, "--release", "default",
        "--broker-token-file", str(creds / "rollback"),
        "--admin-token-file", str(creds / "faults-rollback"),
        "--apply-timeout-s", "30",
        admin_token=None,
    )  # fmt: skip
    real = BoundRouters(proc.url, {"router-0": mint(creds, "router-0")})
    real.start()
    try:
        wait_for(lambda: "router-0" in listed(api), what="router-0 listed")
        # Phantoms: lagging routers claimed with the shared credential and with router-0's.
        shared = (creds / "heartbeat").read_text().strip()
        own = mint(creds, "router-0")
        answers = {
            beat(proc.url, token, f"phantom-{i}", 0).status_code
            for i in range(50)
            for token in (shared, own)
        }
        assert answers == {403}
        api.patch_ok("default", phase="tripped", trip=trip_evidence(), reason="gate")
        wait_for(
            lambda: api.release("default")["phase"] == "rolled_back",
            timeout=60,
            what="phase=rolled_back",
        )
    finally:
        real.stop()
    note = next(
        e["change"]
        for e in api.events("default")
        if e["change"].get("annotation") == "routers_applied"
    )
    assert note["routers"] == ["router-0"]
    assert "timed_out" not in note and "lagging" not in note
    assert executor.alive()
