"""Helpers for the broker tests: a small synchronous API wrapper over ``requests`` and
ways to put a release into a given phase along legal edges only."""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import requests

from canary_contract.broker import TripRecord
from tests.procs import ADMIN_TOKEN, Proc, Spawner, free_port, wait_for

_names = itertools.count(1)


def start_broker(spawn: Spawner, state_dir: Path, *extra: str, port: int = 0) -> Proc:
    return spawn("canarystack.broker", "--state-dir", str(state_dir), *extra, port=port)


def restartable_broker(
    spawn: Spawner, state_dir: Path, *extra: str
) -> tuple[Proc, Callable[[], Proc]]:
    """A real broker on a port of its own, and a function that starts it again on that
    port and state directory (after a kill): routers pointed at it find it back."""
    port = free_port()
    proc = start_broker(spawn, state_dir, *extra, port=port)
    return proc, lambda: start_broker(spawn, state_dir, *extra, port=port)


def broker_with_versions(
    spawn: Spawner, state_dir: Path, *extra: str, release: str | None = "default"
) -> tuple[Proc, Api]:
    """A real broker with versions v1 and v2 registered and, unless ``release`` is None, a
    release of that name (v1 stable, v2 canary at 5 %): the process and its API."""
    proc = start_broker(spawn, state_dir, *extra)
    api = Api(proc.url)
    for v in ("v1", "v2"):
        api.register(v)
    if release is not None:
        api.create(release, stable="v1", canary="v2", weight=5)
    return proc, api


def digest_of(manifest: Any) -> str:
    """The contract's digest, computed independently of canarystack.broker.digest."""
    if isinstance(manifest, str):
        raw = manifest.encode("utf-8")
    else:
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return "sha256:" + hashlib.sha256(raw).hexdigest()


# The credentials a broker's ``--credentials-dir`` holds (the ``creds`` fixture writes them).
CREDENTIALS = ("operator", "trip", "rollback", "heartbeat", "faults-broker", "faults-rollback")


def credentials_dir(folder: Path) -> Path:
    """``folder`` made a broker's ``--credentials-dir``: a fresh token per credential."""
    folder.mkdir()
    for name in CREDENTIALS:
        (folder / name).write_text(secrets.token_urlsafe(24) + "\n")
    return folder


def trip_evidence(**over: Any) -> dict[str, Any]:
    now = time.time()
    evidence: dict[str, Any] = {
        "test": "drift",
        "bucket": "2k-4k",
        "statistic": 0.31,
        "threshold": 0.05,
        "samples": 48,
        "first_sample_time": now - 3,
        "last_sample_time": now - 1,
        "tripped_at": now,
        "detail": {"kl_mean": 0.31},
    }
    evidence.update(over)
    return evidence


def trip_record(**over: Any) -> TripRecord:
    """``trip_evidence`` as the ``TripRecord`` the stack's code takes (unchecked: a test
    may give it values the broker must refuse)."""
    return cast(TripRecord, trip_evidence(**over))


class Api:
    """``requests`` against one broker; admin calls carry the token and an actor."""

    def __init__(self, url: str, token: str | None = ADMIN_TOKEN) -> None:
        self.url = url
        self.session = requests.Session()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 10)
        return self.session.get(self.url + path, **kw)

    def write(self, method: str, path: str, body: Any = None, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 10)
        headers = {**self.headers, **kw.pop("headers", {})}
        return self.session.request(method, self.url + path, json=body, headers=headers, **kw)

    # -- shortcuts that assert success ---------------------------------------------------
    def register(self, version: str, manifest: Any = None) -> dict[str, Any]:
        manifest = {"image": f"model:{version}"} if manifest is None else manifest
        r = self.write(
            "POST",
            "/v1/versions",
            {"version": version, "manifest": manifest, "digest": digest_of(manifest)},
        )
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    def release(self, name: str) -> dict[str, Any]:
        r = self.get(f"/v1/releases/{name}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def create(
        self, name: str | None = None, stable: str = "v1", canary: str | None = "v2", weight=5
    ) -> dict[str, Any]:
        name = name or f"rel-{next(_names)}"
        r = self.write(
            "POST",
            "/v1/releases",
            {
                "name": name,
                "stable": stable,
                "canary": canary,
                "weights": {"canary": weight},
                "actor": "test",
                "reason": "created by a test",
            },
        )
        assert r.status_code == 201, r.text
        return dict(r.json())

    def patch(self, name: str, expected_revision: int, **fields: Any) -> requests.Response:
        body = {"expected_revision": expected_revision, "actor": "test", **fields}
        return self.write("PATCH", f"/v1/releases/{name}", body)

    def patch_ok(self, name: str, **fields: Any) -> dict[str, Any]:
        r = self.patch(name, self.release(name)["revision"], **fields)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def events_page(
        self, name: str, after_seq: int = 0, limit: int | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"after_seq": after_seq}
        if limit is not None:
            params["limit"] = limit
        r = self.get(f"/v1/releases/{name}/events", params=params)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def events(self, name: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """Every event after ``after_seq``: all pages, as every reader must."""
        out: list[dict[str, Any]] = []
        for _ in range(1000):
            page = self.events_page(name, after_seq)
            out.extend(page["events"])
            if len(page["events"]) < page["limit"]:
                return out
            after_seq = page["next_after_seq"]
        raise AssertionError("more than 1000 pages of events")

    def watchers(self) -> int:
        return int(self.get("/health").json()["watchers"])


def preload_history(
    state_dir: Path, events: int, release: str = "default", versions: tuple[str, ...] = ("v1", "v2")
) -> None:
    """A long-lived broker's database, written before the broker starts: the versions, the
    release (stable first version, canary second, weight 5) and ``events`` annotations.
    Written through ``Store`` with fsync off (test setup only: 10,000 commits in ~1 s)."""
    from canarystack.broker.store import Store

    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(state_dir)
    try:
        store._conn.execute("PRAGMA synchronous=OFF")
        now = time.time()
        for v in versions:
            manifest = {"image": f"model:{v}"}
            store.register_version(v, digest_of(manifest), manifest, now)
        store.create_release(release, versions[0], versions[1], 5, "test", "preloaded", now)
        for i in range(events):
            store.annotate(release, {"annotation": "filler", "i": i}, "test", "", now)
    finally:
        store.close()


def drive_to(api: Api, name: str, phase: str) -> dict[str, Any]:
    """Move a fresh progressing release to ``phase`` along legal edges."""
    paths: dict[str, list[dict[str, Any]]] = {
        "progressing": [],
        "tripped": [{"phase": "tripped", "trip": trip_evidence()}],
        "rolling_back": [
            {"phase": "tripped", "trip": trip_evidence()},
            {"phase": "rolling_back", "weights": {"canary": 0}},
        ],
        "rolled_back": [
            {"phase": "tripped", "trip": trip_evidence()},
            {"phase": "rolling_back", "weights": {"canary": 0}},
            {"phase": "rolled_back"},
        ],
        "promoted": [{"phase": "promoted", "weights": {"canary": 0}}],
    }
    release = api.release(name)
    for step in paths[phase]:
        release = api.patch_ok(name, **step)
    assert release["phase"] == phase
    return release


@contextmanager
def not_a_broker(tmp_path: Path, release_body: str) -> Iterator[str]:
    """A misconfigured --broker: a plain file server on loopback that answers
    ``GET /v1/releases/default`` 200 with ``release_body`` (not a release). Yields its URL;
    stopped by its PID at the end."""
    root = tmp_path / "not-a-broker"
    (root / "v1" / "releases").mkdir(parents=True)
    (root / "v1" / "releases" / "default").write_text(release_body)
    port = free_port()
    static = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: requests.get(url + "/v1/releases/default", timeout=1).status_code == 200,
            what="the file server",
        )
        yield url
    finally:
        static.terminate()
        static.wait(timeout=10)
