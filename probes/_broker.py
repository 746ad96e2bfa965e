"""Reading the release and its history from the target's broker (HTTP, read-only).

Broker events carry changes as ``{"phase": {"old": ..., "new": ...}}`` (docs/ARCHITECTURE.md
§2); ``new_value`` reads one key of such a change. This module never writes.
"""

from __future__ import annotations

from typing import Any

import requests
from chaoslib.exceptions import ActivityFailed

from gameday.targets import Target
from gameday.targets.history import HistoryError, read_events

HTTP_TIMEOUT_S = 3.0


def _get(target: Target, path: str) -> dict[str, Any]:
    url = f"{target.service_url('broker')}{path}"
    try:
        resp = requests.get(url, timeout=HTTP_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ActivityFailed(f"cannot reach the broker ({url}): {exc.__class__.__name__}") from None
    if resp.status_code == 404:
        raise ActivityFailed(
            f"release {target.release!r} does not exist on the broker ({url}); check "
            "'release' in the target file"
        )
    if resp.status_code != 200:
        raise ActivityFailed(f"the broker answered HTTP {resp.status_code} for {url}")
    return dict(resp.json())


def get_release(target: Target) -> dict[str, Any]:
    """The release as the broker has it; ActivityFailed when the broker cannot say."""
    return _get(target, f"/v1/releases/{target.release}")


def release_events(target: Target) -> list[dict[str, Any]]:
    """The release's whole event history, oldest first (every page: a long-lived broker
    holds more than one page, and the first page is the *oldest* events)."""
    try:
        return read_events(target.service_url("broker"), target.release, timeout_s=HTTP_TIMEOUT_S)
    except HistoryError as exc:
        if exc.status == 404:
            raise ActivityFailed(
                f"release {target.release!r} does not exist on the broker; check "
                "'release' in the target file"
            ) from None
        raise ActivityFailed(f"reading the release's history: {exc}") from None


def new_value(change: Any, key: str) -> Any:
    """The new value of ``key`` in an event's change (``{"old", "new"}`` or plain)."""
    if not isinstance(change, dict) or key not in change:
        return None
    value = change[key]
    if isinstance(value, dict) and "new" in value:
        return value["new"]
    return value


def phase_events(
    events: list[dict[str, Any]], phase: str, since: float | None = None
) -> list[dict[str, Any]]:
    """Events that set the release's phase to ``phase`` (at or after ``since``)."""
    return [
        e
        for e in events
        if new_value(e.get("change"), "phase") == phase
        and (since is None or float(e.get("time") or 0.0) >= since)
    ]


def annotation_events(
    events: list[dict[str, Any]], name: str, since: float | None = None
) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if isinstance(e.get("change"), dict)
        and e["change"].get("annotation") == name
        and (since is None or float(e.get("time") or 0.0) >= since)
    ]
