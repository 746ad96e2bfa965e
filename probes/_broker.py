"""The release's history from the target's broker, for activities that hold only a target:
``gameday.api`` over a session of their own. The writes a cluster's fresh canary needs are
the core's (``gameday.targets.broker_writes``)."""

from __future__ import annotations

from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.evidence.events import phase_events
from gameday.targets import Target
from gameday.targets.broker_writes import over_api
from probes._context import reported

__all__ = ["phase_events", "release_events"]  # phase_events: for the tests


def release_events(target: Target) -> list[JsonObject]:
    """The release's whole event history, oldest first (every page); ActivityFailed when
    the broker cannot say."""
    with reported(ApiError):
        return over_api(target, StackApi.events)
