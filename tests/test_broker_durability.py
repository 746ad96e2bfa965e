"""Durability: SIGKILL the broker in the middle of a stream of acknowledged writes, restart
it on the same state folder, and find every acknowledged write (revision and event)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import requests

from tests.broker_support import Api, start_broker
from tests.procs import Spawner, wait_for

# Bounds for the write stream: it ends at the kill, or at these counts if the kill is late.
MAX_PATCHES = 5_000
MAX_ANNOTATIONS = 5_000


class Writer(threading.Thread):
    """Writes until the broker stops answering; records only what was acknowledged."""

    def __init__(self, api: Api, name: str, kind: str) -> None:
        super().__init__(daemon=True)
        self.api = Api(api.url)  # own connection
        self.release = name
        self.kind = kind
        self.acked: list[dict[str, Any]] = []
        self.failed: str | None = None

    def run(self) -> None:
        revision = self.api.release(self.release)["revision"]
        limit = MAX_PATCHES if self.kind == "patch" else MAX_ANNOTATIONS
        for i in range(limit):
            try:
                if self.kind == "patch":
                    weight = i % 100 + 1  # differs from the last one: never a no-op
                    r = self.api.patch(
                        self.release, revision, weights={"canary": weight}, reason=f"w{i}"
                    )
                    if r.status_code == 409:  # cannot happen: this thread is the only patcher
                        self.failed = f"unexpected conflict: {r.text}"
                        return
                    if r.status_code != 200:
                        self.failed = f"{r.status_code}: {r.text}"
                        return
                    revision = r.json()["revision"]
                    self.acked.append({"revision": revision, "weight": weight, "i": i})
                else:
                    r = self.api.write(
                        "POST",
                        f"/v1/releases/{self.release}/events",
                        {"actor": "annotator", "change": {"annotation": "tick", "n": i}},
                    )
                    if r.status_code != 201:
                        self.failed = f"{r.status_code}: {r.text}"
                        return
                    self.acked.append({"seq": r.json()["seq"], "n": i})
            except requests.RequestException:
                return  # the broker died mid-request: this write was not acknowledged


def test_acknowledged_writes_survive_sigkill(spawn: Spawner, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = start_broker(spawn, state)
    api = Api(proc.url)
    api.register("v1")
    api.register("v2")
    api.create("default", weight=0)
    patcher = Writer(api, "default", "patch")
    annotator = Writer(api, "default", "annotate")
    patcher.start()
    annotator.start()
    wait_for(
        lambda: len(patcher.acked) >= 40 and len(annotator.acked) >= 40,
        timeout=60,
        what="a stream of acknowledged writes",
    )
    assert patcher.is_alive() and annotator.is_alive(), (patcher.failed, annotator.failed)
    proc.kill()  # SIGKILL while both writers are mid-stream
    patcher.join(timeout=30)
    annotator.join(timeout=30)
    assert patcher.failed is None and annotator.failed is None, (patcher.failed, annotator.failed)
    assert len(patcher.acked) < MAX_PATCHES and len(annotator.acked) < MAX_ANNOTATIONS

    restarted = Api(start_broker(spawn, state).url)
    release = restarted.release("default")
    last = patcher.acked[-1]
    # At most the one write in flight at the kill may have committed unacknowledged.
    assert last["revision"] <= release["revision"] <= last["revision"] + 1
    if release["revision"] == last["revision"]:
        assert release["weights"]["canary"] == last["weight"]

    events = restarted.events("default")
    by_revision = {e["revision"]: e for e in events if "annotation" not in e["change"]}
    for ack in patcher.acked:
        event = by_revision[ack["revision"]]
        assert event["change"]["weights.canary"]["new"] == ack["weight"]
        assert event["reason"] == f"w{ack['i']}"
    # Revisions have no gaps: 1 (create) .. current, one event each.
    assert sorted(by_revision) == list(range(1, release["revision"] + 1))
    by_seq = {e["seq"]: e for e in events}
    for ack in annotator.acked:
        assert by_seq[ack["seq"]]["change"] == {"annotation": "tick", "n": ack["n"]}

    # The restarted broker keeps going from where the data says it is.
    fresh = 0 if release["weights"]["canary"] else 1  # the writers never set 0
    r = restarted.patch("default", release["revision"], weights={"canary": fresh})
    assert r.status_code == 200 and r.json()["revision"] == release["revision"] + 1
    conn = sqlite3.connect(state / "broker.sqlite")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
