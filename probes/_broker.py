"""The release and its history from the target's broker, for activities that hold only a
target (``probes.kubernetes``): ``gameday.api`` over a session of their own; and the few
operator writes (a release PATCH, a version) that a cluster's fresh canary needs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import requests
from chaoslib.exceptions import ActivityFailed

from canary_contract.digest import manifest_digest
from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.evidence.events import annotation_events, new_value, phase_events
from gameday.faults import error_text
from gameday.targets import Target

__all__ = ["annotation_events", "get_release", "new_value", "phase_events", "release_events"]

T = TypeVar("T")


def _read(target: Target, read: Callable[[StackApi], T]) -> T:
    """``read`` of the target's APIs over a session of its own; ActivityFailed when the
    broker cannot say."""
    try:
        with requests.Session() as session:
            return read(StackApi(session, target))
    except ApiError as exc:
        raise ActivityFailed(str(exc)) from None


def get_release(target: Target) -> JsonObject:
    """The release as the broker has it; ActivityFailed when the broker cannot say."""
    return _read(target, StackApi.release)


def release_events(target: Target) -> list[JsonObject]:
    """The release's whole event history, oldest first (every page)."""
    return _read(target, StackApi.events)


# --- writes, for the actions that give a cluster a fresh canary (probes.kubernetes) -----
HTTP_TIMEOUT_S = 5.0
FRESH_SUFFIX = re.compile(r"-g\d+$")


def broker_write(target: Target, method: str, path: str, body: JsonObject) -> requests.Response:
    """One operator write to the broker (``target``'s operator headers); ActivityFailed
    naming the URL when the broker cannot be reached."""
    url = f"{target.service_url('broker')}{path}"
    try:
        return requests.request(
            method, url, json=body, headers=target.operator_headers(), timeout=HTTP_TIMEOUT_S
        )
    except requests.RequestException as exc:
        name = exc.__class__.__name__
        raise ActivityFailed(f"cannot reach the broker ({url}): {name}") from None


def patch_release(target: Target, change: JsonObject, reason: str) -> JsonObject:
    """A compare-and-set PATCH of the release, retried on a revision conflict."""
    for _ in range(5):
        revision = get_release(target)["revision"]
        body = {"expected_revision": revision, "actor": "gameday", "reason": reason, **change}
        resp = broker_write(target, "PATCH", f"/v1/releases/{target.release}", body)
        if resp.status_code == 200:
            return dict(resp.json())
        if resp.status_code == 409 and "current_revision" in (resp.json() or {}):
            continue  # someone wrote in between (a heartbeat does not, a quarantine does)
        raise ActivityFailed(
            f"the broker refused {change} for release {target.release!r}: "
            f"HTTP {resp.status_code}: {error_text(resp)}"
        )
    raise ActivityFailed(f"release {target.release!r} kept changing under the harness; retry")


def unused_version(target: Target, stem: str) -> str:
    """``<stem>-g<epoch ms>``, a name the broker does not know yet (versions are immutable)."""
    stamp = int(time.time() * 1000)
    names = [f"{stem}-g{stamp + i}" for i in range(100)]
    free = _read(target, lambda api: next((n for n in names if not api.version_known(n)), None))
    if free is None:
        raise ActivityFailed(
            f"no free version name after {stem}-g{stamp + 100}: clean up the broker"
        )
    return free


def register_version(target: Target, version: str, manifest: JsonObject) -> None:
    """Register ``version`` with ``manifest`` (and its digest) on the broker."""
    body = {"version": version, "manifest": manifest, "digest": manifest_digest(manifest)}
    resp = broker_write(target, "POST", "/v1/versions", body)
    if resp.status_code not in (200, 201):
        raise ActivityFailed(
            f"registering version {version}: HTTP {resp.status_code}: {error_text(resp)}"
        )
