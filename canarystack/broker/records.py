"""The broker's own JSON records, as the store builds them from its rows and the handlers
answer them: the keys of each are fixed, so mypy checks every read and write of them.

They are the dict form of the contract's records (``canary_contract.broker``: ``Release``,
``Version``, ``Event``, ``RouterBeat``), which read the same answers on the other side of
the wire; the broker keeps dicts because it answers them as they are, without a round trip
through pydantic on every watch. A trip is the contract's ``TripRecord`` (the gate's
evidence as ``TripEvidence`` validated and wrote it); an event's change stays a JSON
object: the store keeps it as the sender wrote it.

This module must never do I/O or import anything of the broker.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from canary_contract.broker import TripRecord
from canary_contract.json import JsonValue


class StableJson(TypedDict):
    version: str
    digest: str


class CanaryJson(TypedDict):
    version: str
    digest: str
    quarantined: bool


class WeightsJson(TypedDict):
    # Read back as an int when whole (5, not 5.0), as clients wrote it (``changes.number``).
    canary: float | int


class OverdueJson(TypedDict):
    """A release's ``rollback_overdue`` (``overdue.Overdue.to_json``)."""

    phase: str
    revision: int
    for_s: float
    limit_s: float
    reason: str


class ReleaseJson(TypedDict):
    """A release (``GET /v1/releases/{name}``); ``rollback_overdue`` only while overdue."""

    name: str
    phase: str
    revision: int
    stable: StableJson
    canary: CanaryJson | None
    weights: WeightsJson
    # The gate's evidence as it sent it (``trip_json`` of the PATCH's ``TripEvidence``).
    trip: TripRecord | None
    created_at: float
    updated_at: float
    rollback_overdue: NotRequired[OverdueJson]


class QuarantineJson(TypedDict):
    time: float | None
    actor: str | None
    reason: str | None


class VersionJson(TypedDict):
    """A version (``GET /v1/versions/{v}``); ``quarantine`` only once it is."""

    version: str
    digest: str
    manifest: JsonValue
    quarantined: bool
    registered_at: float
    quarantine: NotRequired[QuarantineJson]


class EventJson(TypedDict):
    """One entry of a release's history; ``change`` is what the write changed (or what an
    annotation added), as stored."""

    seq: int
    release: str
    time: float
    revision: int
    actor: str
    change: dict[str, object]
    reason: str


class RouterBeatJson(TypedDict):
    """One router as the broker last heard it (``GET /v1/routers``)."""

    router_id: str
    release: str
    applied_revision: int | None
    applied_at: float | None
    canary_off_since: float | None
    identity: str  # "bound", "pod", "shared" or "operator" (``service.RouterBeat``)
    last_seen: float
    age_s: float
