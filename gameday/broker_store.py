"""The broker store-loss game day (``experiments/broker/store-lost.yaml``, #27 finding 5):
the broker's disk comes back empty, and the harness checks that the broker knows it.

What a release stack must do when its version broker restarts on a store older than what
it acknowledged: not answer ``/health`` ok, not hand out an older release (routers go to
0 % canary), and never let a version quarantined before the loss become a canary again.
The steps, in order:

1. ``mark_before_loss``: record what the broker holds (its versions with their manifests,
   the release) in the run folder, then register a marker version and quarantine it —
   the acknowledged write the loss must not undo.
2. ``lose_store``: the broker's SQLite files (database, WAL) are emptied and the broker
   SIGKILLed (stopped first where the target can); supervisord restarts it on
   an empty store, as a volume that came back blank would. Local target only.
3. ``loss_reported``: the restarted broker's ``/health`` must not say ``ok``.
4. ``routers_canary_off``: every router at 0 % canary within the fail-safe bound.
5. ``accept_loss``: the operator accepts the loss (``POST /v1/store/accept-loss``), as the
   broker's message says to.
6. ``quarantine_holds``: the marker registered again comes back quarantined, and a
   release with it as canary is refused.
7. ``restore``: the versions and the release put back as they were before (idempotent; the
   experiment's rollback runs it too).

This module must never touch a broker it was not pointed at by the target, nor write
anything but the marker, the scratch release and what ``restore`` puts back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

import requests

from canary_contract.digest import manifest_digest
from canary_contract.json import JsonObject, JsonValue
from gameday.atomic import write_json
from gameday.errors import GamedayError
from gameday.faults import FaultLedger, kill_pod
from gameday.run.collect import read_json
from gameday.targets import Target, TargetError

SNAPSHOT_FILE = "store_lost.json"
SCRATCH_RELEASE = "gameday-store-lost-check"
HTTP_TIMEOUT_S = 5.0
POLL_S = 0.25
# The broker's SQLite files in the local stack's state folder (the broker's --state-dir).
STORE_FILES = ("broker.sqlite", "broker.sqlite-wal")


class MarkerManifest(TypedDict):
    gameday: str
    release: str


class MarkerVersion(TypedDict):
    """The marker version as ``mark_before_loss`` registers it (and ``restore`` again)."""

    version: str
    manifest: MarkerManifest
    digest: str


class StoreSnapshot(TypedDict):
    """``store_lost.json``: what the broker held before the loss, as it answered it."""

    versions: list[Mapping[str, object]]  # each as the broker listed it
    release: Mapping[str, object]
    marker: MarkerVersion
    broker_pid: object  # the broker's PID as its /health gave it
    at: float


# What each step answers (the activities' outputs to chaos run).
class Marked(TypedDict):
    marker: str
    release_revision: object  # as the broker gave it


class StoreLost(TypedDict):
    stopped_pid: object  # the stopped broker's PID, None where the target cannot stop it
    emptied: list[str]
    killed_at: float


class LossReported(TypedDict):
    health_status: int
    status: object
    reasons: str


class RoutersOff(TypedDict):
    after_s: float
    routers: dict[str, object]  # each router's effective canary weight (0), by replica


class LossAccepted(TypedDict):
    """``why`` when nothing was accepted, ``lost`` (as the broker said) when it was."""

    accepted: bool
    why: NotRequired[str]
    lost: NotRequired[object]


class QuarantineHeld(TypedDict):
    quarantined: Literal[True]
    as_canary: int  # the HTTP status of the release that named it as canary
    code: object  # the refusal's error code, as the broker gave it


class Restored(TypedDict):
    """``why`` when there was nothing to restore; else what was accepted and the revision."""

    restored: bool
    why: NotRequired[str]
    accepted: NotRequired[LossAccepted]
    revision: NotRequired[object]


class StoreCheckFailed(GamedayError):
    """What the broker did after the loss is not what a store that knows it lost data does
    (the message says expected and actual)."""


def _broker(target: Target) -> str:
    return target.service_url("broker")


def _get(http: requests.Session, url: str) -> requests.Response:
    return http.get(url, timeout=HTTP_TIMEOUT_S)


def _write(
    http: requests.Session, target: Target, method: str, path: str, body: Mapping[str, object]
) -> requests.Response:
    return http.request(
        method,
        _broker(target) + path,
        json={"actor": "gameday", **body} if path != "/v1/versions" else body,
        headers=target.operator_headers(),
        timeout=HTTP_TIMEOUT_S,
    )


def _ok(resp: requests.Response, what: str) -> JsonObject:
    if resp.status_code >= 300:
        raise StoreCheckFailed(f"{what}: the broker answered {resp.status_code}: {resp.text[:300]}")
    body = resp.json()
    return body if isinstance(body, dict) else {}


# -- 1. before the loss -------------------------------------------------------------------
def mark_before_loss(target: Target, run_dir: Path, http: requests.Session) -> Marked:
    """Snapshot the broker, then register and quarantine a marker version."""
    versions = _ok(_get(http, _broker(target) + "/v1/versions"), "listing versions")
    release = _ok(
        _get(http, f"{_broker(target)}/v1/releases/{target.release}"), "reading the release"
    )
    marker = f"gameday-quarantined-{int(time.time())}"
    manifest: MarkerManifest = {"gameday": "store-lost marker", "release": target.release}
    registered: MarkerVersion = {
        "version": marker,
        "manifest": manifest,
        "digest": manifest_digest(manifest),
    }
    _ok(_write(http, target, "POST", "/v1/versions", registered), f"registering {marker}")
    quarantine = {"reason": "gameday store-lost: must survive the loss"}
    _ok(
        _write(http, target, "POST", f"/v1/versions/{marker}/quarantine", quarantine),
        f"quarantining {marker}",
    )
    health = _ok(_get(http, _broker(target) + "/health"), "reading the broker's /health")
    snapshot: StoreSnapshot = {
        "versions": versions.get("versions", []),
        "release": release,
        "marker": registered,
        "broker_pid": health.get("pid"),
        "at": time.time(),
    }
    write_json(run_dir / SNAPSHOT_FILE, snapshot)
    return {"marker": marker, "release_revision": release.get("revision")}


def _snapshot(run_dir: Path) -> StoreSnapshot:
    found = read_json(run_dir / SNAPSHOT_FILE)
    if not isinstance(found, dict):
        raise StoreCheckFailed(
            f"no {SNAPSHOT_FILE} in {run_dir}: run probes.broker_store.mark_before_loss "
            "before the loss"
        )
    return cast(StoreSnapshot, found)


# -- 2. the loss ----------------------------------------------------------------------------
def lose_store(target: Target, ledger: FaultLedger | None) -> StoreLost:
    """Empty the broker's SQLite files and SIGKILL it (local target: stopped first)."""
    target.check_allowed("broker")
    state_dir = getattr(target, "state_dir", None)
    if not isinstance(state_dir, Path):
        raise TargetError(
            f"{target.kind} target: emptying the broker's store needs the local target (its "
            "state folder holds broker.sqlite); run this experiment against targets/local.yaml."
        )
    # Stopped first where the target can (SIGSTOP by PID), so the broker writes nothing
    # between the emptying and the kill; else the kill follows at once.
    stop = getattr(target, "stop_pod", None)
    stopped = stop("broker") if callable(stop) else {"pid": None}
    emptied = []
    for name in STORE_FILES:
        path = state_dir / name
        if path.exists():
            with open(path, "r+b") as f:
                f.truncate(0)
            emptied.append(str(path))
    entry = kill_pod(target, "broker", None, ledger)
    return {"stopped_pid": stopped["pid"], "emptied": emptied, "killed_at": entry.time}


# -- 3. what the restarted broker says ------------------------------------------------------
def _restarted_health(
    http: requests.Session, target: Target, old_pid: Any, deadline: float
) -> tuple[int, JsonObject]:
    while True:
        try:
            resp = _get(http, _broker(target) + "/health")
            body = resp.json()
            if isinstance(body, dict) and body.get("pid") != old_pid:
                return resp.status_code, body
        except (requests.RequestException, ValueError):
            pass
        if time.monotonic() > deadline:
            raise StoreCheckFailed(
                "expected the broker to come back after the kill, but its /health did not "
                "answer from a new process in time"
            )
        time.sleep(POLL_S)


def loss_reported(
    target: Target, run_dir: Path, http: requests.Session, deadline_s: float
) -> LossReported:
    """The restarted broker's /health must not be ok, and must say the store lost data."""
    snap = _snapshot(run_dir)
    status, body = _restarted_health(
        http, target, snap.get("broker_pid"), time.monotonic() + deadline_s
    )
    release = snap.get("release") or {}
    lost = (
        f"release {target.release!r} at revision {release.get('revision')} and the "
        f"quarantine of {snap['marker']['version']!r}"
    )
    if status == 200 or body.get("status") == "ok":
        raise StoreCheckFailed(
            f"expected the broker, restarted on an emptied store, to report the loss of "
            f"every acknowledged write ({lost}) and not answer /health ok; but /health "
            f"answered {status} status {body.get('status')!r} with {body.get('releases')} "
            "release(s): a store that went backwards is served as if nothing happened"
        )
    said = " ".join(str(r) for r in body.get("degraded_reasons") or [])
    if str(target.release) not in said:
        raise StoreCheckFailed(
            f"expected the broker's /health to say what was lost ({lost}); it answered "
            f"{status} {body.get('status')!r} with reasons {said[:300]!r}"
        )
    return {"health_status": status, "status": body.get("status"), "reasons": said[:1000]}


# -- 4. routers ----------------------------------------------------------------------------
def routers_canary_off(target: Target, http: requests.Session, deadline_s: float) -> RoutersOff:
    """Every router replica at 0 % canary (its /health ``config``) before ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    started = time.monotonic()
    while True:
        weights: dict[str, object] = {}
        for replica in target.replicas("router"):
            try:
                config = _get(http, replica.url + "/health").json().get("config") or {}
                weights[replica.name] = config.get("effective_canary_weight")
            except (requests.RequestException, ValueError) as exc:
                weights[replica.name] = f"unreadable ({type(exc).__name__})"
        if weights and all(w == 0 for w in weights.values()):
            return {"after_s": round(time.monotonic() - started, 2), "routers": weights}
        if time.monotonic() > deadline:
            raise StoreCheckFailed(
                f"expected every router at 0 % canary within {deadline_s:g} s of the store "
                f"loss, but their effective canary weights are {weights}"
            )
        time.sleep(POLL_S)


# -- 5. the operator's acceptance -----------------------------------------------------------
def accept_loss(target: Target, http: requests.Session) -> LossAccepted:
    """``POST /v1/store/accept-loss`` when the broker reports a loss; says what it did."""
    store = _get(http, _broker(target) + "/v1/store")
    if store.status_code == 404:
        return {"accepted": False, "why": "the broker has no /v1/store: it tracks no loss"}
    if _ok(store, "reading /v1/store").get("status") != "lost":
        return {"accepted": False, "why": "the broker reports no loss"}
    reason = "gameday store-lost: the emptied store is accepted, then restored"
    body = _ok(
        _write(http, target, "POST", "/v1/store/accept-loss", {"reason": reason}),
        "accepting the loss",
    )
    return {"accepted": True, "lost": (body.get("accepted") or {}).get("lost")}


# -- 6. the quarantine ----------------------------------------------------------------------
def quarantine_holds(target: Target, run_dir: Path, http: requests.Session) -> QuarantineHeld:
    """The marker, registered again, is quarantined; as a canary it is refused (422)."""
    snap = _snapshot(run_dir)
    marker = snap["marker"]
    name = marker["version"]
    _restore_versions(target, snap, http, requarantine=False)
    version = _ok(_get(http, f"{_broker(target)}/v1/versions/{name}"), f"reading {name}")
    # the release's stable part as the broker gave it (read as it always was)
    stable_ref: JsonValue = (snap.get("release") or {}).get("stable")
    stable = (stable_ref or {}).get("version")
    resp = _write(
        http,
        target,
        "POST",
        "/v1/releases",
        {"name": SCRATCH_RELEASE, "stable": stable, "canary": name, "weights": {"canary": 0}},
    )
    if resp.status_code in (200, 201) or not version.get("quarantined"):
        raise StoreCheckFailed(
            f"expected version {name!r}, quarantined before the store loss, to stay "
            f"quarantined and be refused as a canary; but it is registered with quarantined="
            f"{version.get('quarantined')} and a release with it as canary was answered "
            f"{resp.status_code}: the loss undid a quarantine"
        )
    code = (resp.json().get("error") or {}).get("code") if resp.status_code < 500 else None
    return {"quarantined": True, "as_canary": resp.status_code, "code": code}


# -- 7. putting it back ---------------------------------------------------------------------
def _restore_versions(
    target: Target, snap: StoreSnapshot, http: requests.Session, *, requarantine: bool
) -> None:
    wanted: list[Mapping[str, object]] = [*snap.get("versions", []), snap["marker"]]
    for v in wanted:
        body = {"version": v["version"], "manifest": v["manifest"], "digest": v["digest"]}
        resp = _write(http, target, "POST", "/v1/versions", body)
        if resp.status_code not in (200, 201, 409):
            _ok(resp, f"registering {v['version']} again")
        quarantined = v.get("quarantined") or v is snap["marker"]
        if requarantine and quarantined:
            path = f"/v1/versions/{v['version']}/quarantine"
            _write(http, target, "POST", path, {"reason": "gameday store-lost: restored"})


def restore(target: Target, run_dir: Path, http: requests.Session) -> Restored:
    """Put the versions and the release back as the snapshot has them (idempotent)."""
    snap = read_json(run_dir / SNAPSHOT_FILE)
    if not isinstance(snap, dict):
        return {"restored": False, "why": f"no {SNAPSHOT_FILE}: nothing was changed"}
    accepted = accept_loss(target, http)
    _restore_versions(target, cast(StoreSnapshot, snap), http, requarantine=True)
    before: JsonObject = snap.get("release") or {}
    url = f"{_broker(target)}/v1/releases/{target.release}"
    weight = (before.get("weights") or {}).get("canary", 0)
    now = _get(http, url)
    if now.status_code == 404:
        canary = (before.get("canary") or {}).get("version")
        _ok(
            _write(
                http,
                target,
                "POST",
                "/v1/releases",
                {
                    "name": target.release,
                    "stable": (before.get("stable") or {}).get("version"),
                    "canary": canary,
                    "weights": {"canary": weight if canary else 0},
                    "reason": "gameday store-lost: restored after the loss",
                },
            ),
            "creating the release again",
        )
    else:
        current = _ok(now, "reading the release")
        if (current.get("weights") or {}).get("canary") != weight:
            _ok(
                _write(
                    http,
                    target,
                    "PATCH",
                    f"/v1/releases/{target.release}",
                    {
                        "expected_revision": current["revision"],
                        "weights": {"canary": weight},
                        "reason": "gameday store-lost: canary weight restored",
                    },
                ),
                "restoring the canary weight",
            )
    release = _ok(_get(http, url), "reading the restored release")
    return {"restored": True, "accepted": accepted, "revision": release.get("revision")}
