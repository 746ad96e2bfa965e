"""The release and its history from the target's broker, for activities that hold only a
target (``probes.kubernetes``): ``gameday.api`` over a session of their own."""

from __future__ import annotations

import requests
from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.evidence.events import annotation_events, new_value, phase_events
from gameday.targets import Target

__all__ = ["annotation_events", "get_release", "new_value", "phase_events", "release_events"]


def get_release(target: Target) -> JsonObject:
    """The release as the broker has it; ActivityFailed when the broker cannot say."""
    try:
        with requests.Session() as session:
            return StackApi(session, target).release()
    except ApiError as exc:
        raise ActivityFailed(str(exc)) from None


def release_events(target: Target) -> list[JsonObject]:
    """The release's whole event history, oldest first (every page)."""
    try:
        with requests.Session() as session:
            return StackApi(session, target).events()
    except ApiError as exc:
        raise ActivityFailed(str(exc)) from None
