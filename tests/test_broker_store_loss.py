"""A store that knows when it went backwards (#27, finding 5): the broker holds its SQLite
store to a high-water mark kept outside it, so a store that comes back older (a WAL
truncated before a SIGKILL, an old copy put back) is refused, said so with what was lost
and how to recover, and a loss an operator accepts never brings a quarantined version
back to the canary nor a revision number back to one a router already applied."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tests.broker_support import Api
from tests.procs import Proc, Spawner, free_port


def restartable(spawn: Spawner, state: Path) -> tuple[Proc, Callable[[], Proc], Api]:
    """A broker on a port of its own, how to start it again there (a restart does not
    wait for /health 200: a broker on a lost store answers 503 on purpose), and its API."""
    port = free_port()

    def start(wait_health: bool) -> Proc:
        return spawn(
            "canarystack.broker", "--state-dir", str(state), port=port, wait_health=wait_health
        )

    first = start(True)
    return first, lambda: start(False), Api(first.url)


def lost_wal(spawn: Spawner, state: Path) -> tuple[Proc, Callable[[], Proc], Api, int]:
    """What the issue did: a history (``_history``) whose committed writes sit in the WAL;
    the WAL emptied, the broker SIGKILLed and restarted. The restarted broker, how to
    restart it again, its API and the revision acknowledged before the loss."""
    proc, restart, api = restartable(spawn, state)
    acked = _history(api)["revision"]
    wal = state / "broker.sqlite-wal"
    assert wal.exists() and wal.stat().st_size > 0
    with open(wal, "r+b") as f:
        f.truncate(0)
    proc.kill()
    return restart(), restart, api, acked


def _history(api: Api) -> dict[str, int]:
    """v1 stable, v2 canary at 5 %, a few weight changes, then v2 quarantined."""
    api.register("v1")
    api.register("v2")
    api.create("default", weight=5)
    for w in (10, 20):
        api.patch_ok("default", weights={"canary": w}, reason=f"to {w}")
    r = api.write("POST", "/v1/versions/v2/quarantine", {"actor": "test", "reason": "bad"})
    assert r.status_code == 200, r.text
    return {"revision": api.release("default")["revision"]}


def test_a_store_that_lost_its_wal_refuses_to_serve_and_says_what_was_lost(
    spawn: Spawner, tmp_path: Path
) -> None:
    proc, restart, api, acked = lost_wal(spawn, tmp_path / "state")
    health = api.get("/health")
    assert health.status_code == 503, health.text
    assert health.json()["status"] == "store_lost"
    assert health.json()["store"] == "lost"
    assert f"release 'default': all of revisions 1..{acked}" in health.text

    r = api.get("/v1/releases/default")
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "store_lost"
    assert "version 'v2': its quarantine" in error["message"]
    assert "accept-loss" in error["message"] and "backup" in error["message"]
    # A write is refused too: nothing is built on the older store.
    assert api.write("POST", "/v1/versions", {"version": "v9"}).status_code == 503

    store = api.get("/v1/store").json()
    assert store["status"] == "lost"
    assert store["lost"]["releases"]["default"] == {
        "store_revision": 0,
        "acknowledged_revision": acked,
    }
    # A restart alone does not make it go away: the mark is outside the store.
    proc.stop()
    proc = restart()
    assert api.get("/health").json()["status"] == "store_lost"


def test_an_accepted_loss_keeps_the_quarantine_and_never_reuses_a_revision(
    spawn: Spawner, tmp_path: Path
) -> None:
    proc, restart, api, acked = lost_wal(spawn, tmp_path / "state")
    missing_reason = api.write("POST", "/v1/store/accept-loss", {"actor": "ops"})
    assert missing_reason.status_code == 400, missing_reason.text
    assert "reason" in missing_reason.text
    stranger = Api(proc.url, token="not-a-credential")
    assert (
        stranger.write("POST", "/v1/store/accept-loss", {"actor": "ops", "reason": "x"}).status_code
        == 401
    )
    ok = api.write(
        "POST", "/v1/store/accept-loss", {"actor": "ops", "reason": "no backup of the WAL"}
    )
    assert ok.status_code == 200, ok.text
    assert api.get("/health").status_code == 200
    assert api.get("/v1/store").json()["status"] == "ok"
    again = api.write("POST", "/v1/store/accept-loss", {"actor": "ops", "reason": "twice"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "no_store_loss"

    # The quarantined version, registered again, comes back quarantined: never a canary.
    assert api.register("v1")["quarantined"] is False
    assert api.register("v2")["quarantined"] is True
    refused = api.write(
        "POST",
        "/v1/releases",
        {
            "name": "default",
            "stable": "v1",
            "canary": "v2",
            "weights": {"canary": 5},
            "actor": "test",
        },
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "version_quarantined"
    # The release made again starts above every revision a router may have applied.
    created = api.create("default", canary=None, weight=0)
    assert created["revision"] == acked + 1

    # And all of it holds across a restart.
    proc.stop()
    proc = restart()
    assert api.get("/health").status_code == 200
    assert api.get("/v1/versions/v2").json()["quarantined"] is True


def test_an_old_copy_put_back_is_refused_and_accepting_it_bumps_past_the_loss(
    spawn: Spawner, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    proc, restart, api = restartable(spawn, state)
    api.register("v1")
    api.register("v2")
    api.create("default", weight=5)
    proc.stop()  # a clean stop checkpoints the WAL: the copy is the whole store
    backup = tmp_path / "backup"
    backup.mkdir()
    shutil.copy(state / "broker.sqlite", backup / "broker.sqlite")
    proc = restart()
    api.patch_ok("default", weights={"canary": 50}, reason="more canary")
    r = api.write("POST", "/v1/versions/v2/quarantine", {"actor": "test", "reason": "bad"})
    assert r.status_code == 200, r.text
    acked = api.release("default")["revision"]
    proc.stop()
    for leftover in state.glob("broker.sqlite*"):
        leftover.unlink()
    shutil.copy(backup / "broker.sqlite", state / "broker.sqlite")

    proc = restart()
    store = api.get("/v1/store").json()
    assert store["status"] == "lost"
    assert f"release 'default': revisions 2..{acked} (the store has 1)" in store["lost"]["lost"]
    assert "version 'v2': its quarantine" in store["lost"]["lost"]

    ok = api.write("POST", "/v1/store/accept-loss", {"actor": "ops", "reason": "old backup"})
    assert ok.status_code == 200, ok.text
    release = api.release("default")
    assert release["revision"] > acked
    assert release["canary"]["quarantined"] is True
    assert release["weights"]["canary"] == 0
    notes = [e for e in api.events("default") if e["change"].get("annotation")]
    assert notes[-1]["change"]["annotation"] == "store_loss_accepted"
    assert notes[-1]["actor"] == "ops"


def test_a_fresh_state_folder_and_an_ordinary_restart_are_not_a_loss(
    spawn: Spawner, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    proc, restart, api = restartable(spawn, state)
    assert api.get("/v1/store").json()["status"] == "ok"
    _history(api)
    proc.kill()  # SIGKILL keeps every acknowledged write: nothing is lost
    restart()
    assert api.get("/health").json()["store"] == "ok"
    assert api.get("/v1/store").json()["status"] == "ok"
