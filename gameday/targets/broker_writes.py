"""The broker reads and operator writes a cluster's fresh canary needs
(``gameday.targets.rollout.Broker``): the release, a compare-and-set PATCH of it, a version
name the broker does not know yet and its registration, each over a session of its own.

Errors: ``RolloutError`` with a whole message (an activity reports it as it is);
``over_api`` leaves the ``ApiError`` to its caller.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import requests

from canary_contract.digest import manifest_digest
from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.evidence.rollouts import RolloutError
from gameday.faults import error_text
from gameday.targets.base import Target
from gameday.targets.rollout import Broker

__all__ = ["FRESH_SUFFIX", "over_api", "target_broker"]

T = TypeVar("T")

HTTP_TIMEOUT_S = 5.0
CAS_TRIES = 5
FREE_NAMES = 100
FRESH_SUFFIX = re.compile(r"-g\d+$")


def over_api(target: Target, read: Callable[[StackApi], T]) -> T:
    """``read`` of the target's APIs over a session of its own (``ApiError`` when the
    stack cannot say)."""
    with requests.Session() as session:
        return read(StackApi(session, target))


def _read(target: Target, read: Callable[[StackApi], T]) -> T:
    try:
        return over_api(target, read)
    except ApiError as exc:
        raise RolloutError(str(exc)) from None


def release(target: Target) -> JsonObject:
    """The release as the broker has it."""
    return _read(target, StackApi.release)


def broker_write(target: Target, method: str, path: str, body: JsonObject) -> requests.Response:
    """One operator write to the broker (``target``'s operator headers); RolloutError
    naming the URL when the broker cannot be reached."""
    url = f"{target.service_url('broker')}{path}"
    try:
        return requests.request(
            method, url, json=body, headers=target.operator_headers(), timeout=HTTP_TIMEOUT_S
        )
    except requests.RequestException as exc:
        name = exc.__class__.__name__
        raise RolloutError(f"cannot reach the broker ({url}): {name}") from None


def patch_release(target: Target, change: JsonObject, reason: str) -> JsonObject:
    """A compare-and-set PATCH of the release, retried on a revision conflict."""
    for _ in range(CAS_TRIES):
        revision = release(target)["revision"]
        body = {"expected_revision": revision, "actor": "gameday", "reason": reason, **change}
        resp = broker_write(target, "PATCH", f"/v1/releases/{target.release}", body)
        if resp.status_code == 200:
            return dict(resp.json())
        if resp.status_code == 409 and "current_revision" in (resp.json() or {}):
            continue  # someone wrote in between (a heartbeat does not, a quarantine does)
        raise RolloutError(
            f"the broker refused {change} for release {target.release!r}: "
            f"HTTP {resp.status_code}: {error_text(resp)}"
        )
    raise RolloutError(f"release {target.release!r} kept changing under the harness; retry")


def unused_version(target: Target, previous: str) -> str:
    """``<stem>-g<epoch ms>`` (``previous`` less its own ``-g<ms>``), a name the broker
    does not know yet (versions are immutable)."""
    stem = FRESH_SUFFIX.sub("", previous)
    stamp = int(time.time() * 1000)
    names = [f"{stem}-g{stamp + i}" for i in range(FREE_NAMES)]
    free = _read(target, lambda api: next((n for n in names if not api.version_known(n)), None))
    if free is None:
        raise RolloutError(
            f"no free version name after {stem}-g{stamp + FREE_NAMES}: clean up the broker"
        )
    return free


def register_version(target: Target, version: str, manifest: JsonObject) -> None:
    """Register ``version`` with ``manifest`` (and its digest) on the broker."""
    body = {"version": version, "manifest": manifest, "digest": manifest_digest(manifest)}
    resp = broker_write(target, "POST", "/v1/versions", body)
    if resp.status_code not in (200, 201):
        raise RolloutError(
            f"registering version {version}: HTTP {resp.status_code}: {error_text(resp)}"
        )


def target_broker(target: Target) -> Broker:
    """``gameday.targets.rollout.Broker`` over ``target``'s broker."""
    return Broker(
        lambda: release(target),
        lambda change, reason: patch_release(target, change, reason),
        lambda previous: unused_version(target, previous),
        lambda version, manifest: register_version(target, version, manifest),
    )
