"""The broker reads and operator writes a cluster's fresh canary needs
(``gameday.targets.rollout.Broker``): the release, a compare-and-set PATCH of it, a version
name the broker does not know yet and its registration, each over the session its caller
hands in (``session=``), else over a short-lived one of its own.

Errors: ``RolloutError`` with a whole message (an activity reports it as it is);
``over_api`` leaves the ``ApiError`` to its caller.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import requests

from canary_contract.digest import manifest_digest
from canary_contract.json import JsonObject
from gameday.api import BROKER_WRITE_TIMEOUT_S, ApiError, StackApi, error_text
from gameday.evidence.rollouts import RolloutError
from gameday.sessions import given_or_own
from gameday.targets.base import Target
from gameday.targets.rollout import Broker

__all__ = ["FRESH_SUFFIX", "over_api", "target_broker"]

T = TypeVar("T")

CAS_TRIES = 5
FREE_NAMES = 100
FRESH_SUFFIX = re.compile(r"-g\d+$")


def over_api(
    target: Target, read: Callable[[StackApi], T], *, session: requests.Session | None = None
) -> T:
    """``read`` of the target's APIs over ``session``, else over a session of its own
    (``ApiError`` when the stack cannot say)."""
    with given_or_own(session) as http:
        return read(StackApi(http, target))


def _read(
    target: Target, read: Callable[[StackApi], T], session: requests.Session | None = None
) -> T:
    try:
        return over_api(target, read, session=session)
    except ApiError as exc:
        raise RolloutError(str(exc)) from None


def release(target: Target, *, session: requests.Session | None = None) -> Mapping[str, object]:
    """The release as the broker has it."""
    return _read(target, StackApi.release, session)


def broker_write(
    target: Target,
    method: str,
    path: str,
    body: Mapping[str, object],
    *,
    session: requests.Session | None = None,
) -> requests.Response:
    """One operator write to the broker (``target``'s operator headers); RolloutError
    naming the URL when the broker cannot be reached."""
    url = f"{target.service_url('broker')}{path}"
    try:
        with given_or_own(session) as http:
            return http.request(
                method,
                url,
                json=body,
                headers=target.operator_headers(),
                timeout=BROKER_WRITE_TIMEOUT_S,
            )
    except requests.RequestException as exc:
        name = exc.__class__.__name__
        raise RolloutError(f"cannot reach the broker ({url}): {name}") from None


def patch_release(
    target: Target,
    change: Mapping[str, object],
    reason: str,
    *,
    session: requests.Session | None = None,
) -> JsonObject:
    """A compare-and-set PATCH of the release, retried on a revision conflict."""
    for _ in range(CAS_TRIES):
        revision = release(target, session=session)["revision"]
        body = {"expected_revision": revision, "actor": "gameday", "reason": reason, **change}
        path = f"/v1/releases/{target.release}"
        resp = broker_write(target, "PATCH", path, body, session=session)
        if resp.status_code == 200:
            return dict(resp.json())
        if resp.status_code == 409 and "current_revision" in (resp.json() or {}):
            continue  # someone wrote in between (a heartbeat does not, a quarantine does)
        raise RolloutError(
            f"the broker refused {change} for release {target.release!r}: "
            f"HTTP {resp.status_code}: {error_text(resp)}"
        )
    raise RolloutError(f"release {target.release!r} kept changing under the harness; retry")


def unused_version(
    target: Target, previous: str, *, session: requests.Session | None = None
) -> str:
    """``<stem>-g<epoch ms>`` (``previous`` less its own ``-g<ms>``), a name the broker
    does not know yet (versions are immutable)."""
    stem = FRESH_SUFFIX.sub("", previous)
    stamp = int(time.time() * 1000)
    names = [f"{stem}-g{stamp + i}" for i in range(FREE_NAMES)]
    free = _read(
        target, lambda api: next((n for n in names if not api.version_known(n)), None), session
    )
    if free is None:
        raise RolloutError(
            f"no free version name after {stem}-g{stamp + FREE_NAMES}: clean up the broker"
        )
    return free


def register_version(
    target: Target,
    version: str,
    manifest: Mapping[str, object],
    *,
    session: requests.Session | None = None,
) -> None:
    """Register ``version`` with ``manifest`` (and its digest) on the broker."""
    body = {"version": version, "manifest": manifest, "digest": manifest_digest(manifest)}
    resp = broker_write(target, "POST", "/v1/versions", body, session=session)
    if resp.status_code not in (200, 201):
        raise RolloutError(
            f"registering version {version}: HTTP {resp.status_code}: {error_text(resp)}"
        )


def target_broker(target: Target, *, session: requests.Session | None = None) -> Broker:
    """``gameday.targets.rollout.Broker`` over ``target``'s broker (every call over
    ``session`` when given, else each over a short-lived session of its own)."""
    return Broker(
        lambda: release(target, session=session),
        lambda change, reason: patch_release(target, change, reason, session=session),
        lambda previous: unused_version(target, previous, session=session),
        lambda version, manifest: register_version(target, version, manifest, session=session),
    )
