"""What the broker sends and accepts: versions, releases, trip evidence, events, routers.

Each record reads exactly what ``canarystack.broker`` answers today (``from_wire``) and
writes it back unchanged (``to_wire``); ``tests/test_contract.py`` holds both to a live
broker.
"""

from __future__ import annotations

import enum
from typing import Annotated, ClassVar, Literal, NotRequired, TypedDict

from pydantic import Field, model_validator

from canary_contract._record import Flag, Int, IntOrNumber, Number, Record, Text
from canary_contract.json import JsonObject, JsonValue
from canary_contract.phases import CANARY_OFF, Phase, canary_live
from canary_contract.samples import TOKEN_PATTERN, TraceId

Count = Annotated[Int, Field(ge=0, le=2**63 - 1)]


class TripTest(enum.StrEnum):
    """The test a broker-carried trip names (``TripEvidence.test``)."""

    DRIFT = "drift"
    LATENCY = "latency"
    ERRORS = "errors"
    NO_DATA = "no_data"


# A trip's example colours (#16): at most this many, each a request id and trace id the
# gate saw in the samples behind the trip, and their tag.
MAX_TRIP_COLOURS = 8
Token = Annotated[Text, Field(pattern=TOKEN_PATTERN)]


def check_sample_order(first_sample_time: float, last_sample_time: float, message: str) -> None:
    """Refuse a trip's sample window whose last sample comes before its first: a
    ``ValueError`` with ``message`` (each reader of ``TripEvidence`` words it for its
    caller)."""
    if last_sample_time < first_sample_time:
        raise ValueError(message)


class TripColour(Record):
    request_id: Token
    trace_id: TraceId
    tag: Token | None = None


class TripEvidence(Record):
    """The gate's evidence for a trip: THE one definition of its fields, which the gate
    builds (``canarystack.gate.trip_record``), the broker takes in a PATCH (its body model
    subclasses this one, refusing unknown fields) and stores, and every reader reads
    (``colours`` only when the gate sent them: older gates send none)."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"colours"})
    # What a reader is told when the window's times come out of order (a subclass that
    # speaks to a sender names the fields as the sender wrote them).
    order_message: ClassVar[str] = (
        "last_sample_time is before first_sample_time; the window's first and last "
        "sample times come in order"
    )

    test: TripTest
    bucket: Annotated[Text, Field(min_length=1, max_length=64)]
    statistic: Number
    threshold: Number
    samples: Count
    first_sample_time: Number
    last_sample_time: Number
    tripped_at: Number
    detail: dict[str, object] = Field(default_factory=dict)
    colours: Annotated[tuple[TripColour, ...], Field(max_length=MAX_TRIP_COLOURS)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TripEvidence:
        check_sample_order(self.first_sample_time, self.last_sample_time, self.order_message)
        return self


class TripColourJson(TypedDict):
    """One example colour of a trip as JSON (``TripColour.to_wire()``)."""

    request_id: str
    trace_id: str
    tag: str | None


class TripRecord(TypedDict):
    """A trip's evidence as JSON: ``TripEvidence.to_wire()``'s keys in its order,
    ``colours`` only when the evidence has them. The gate keeps, serves and sends it, the
    broker stores and answers it, the executor and the judge show it. ``tripped_at`` is 0
    until the gate's service stamps it; ``detail`` is the test's own free-form evidence."""

    test: str
    bucket: str
    statistic: float
    threshold: float
    samples: int
    first_sample_time: float
    last_sample_time: float
    tripped_at: float
    detail: dict[str, object]
    colours: NotRequired[list[TripColourJson]]


def _colour_json(colour: TripColour) -> TripColourJson:
    return {"request_id": colour.request_id, "trace_id": colour.trace_id, "tag": colour.tag}


def trip_json(trip: TripEvidence) -> TripRecord:
    """``trip`` as JSON (what ``trip.to_wire()`` gives, key by key, typed)."""
    out: TripRecord = {
        "test": trip.test.value,
        "bucket": trip.bucket,
        "statistic": trip.statistic,
        "threshold": trip.threshold,
        "samples": trip.samples,
        "first_sample_time": trip.first_sample_time,
        "last_sample_time": trip.last_sample_time,
        "tripped_at": trip.tripped_at,
        "detail": trip.to_wire()["detail"],
    }
    if trip.colours is not None:
        out["colours"] = [_colour_json(c) for c in trip.colours]
    return out


class Quarantine(Record):
    time: Number
    actor: Text | None
    reason: Text | None


class Version(Record):
    """A registered version (``GET /v1/versions/{v}``); ``quarantine`` only once it is."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"quarantine"})

    version: Text
    digest: Text
    manifest: JsonValue
    quarantined: Flag
    registered_at: Number
    quarantine: Quarantine | None = None


class VersionList(Record):
    versions: tuple[Version, ...]


class StableRef(Record):
    version: Text
    digest: Text


class CanaryRef(Record):
    version: Text
    digest: Text
    quarantined: Flag


class Weights(Record):
    canary: Annotated[IntOrNumber, Field(ge=0, le=100)]


class RollbackOverdue(Record):
    """A release tripped or rolling back with no phase change for the broker's
    ``--rollback-overdue-s``: the rollback executor is not moving it."""

    phase: Phase
    revision: Count
    for_s: Number
    limit_s: Number
    reason: Text


class Release(Record):
    """A release as the broker answers it (``GET /v1/releases/{name}``, a watch, a PATCH)."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"rollback_overdue"})

    name: Text
    phase: Phase
    revision: Count
    stable: StableRef
    canary: CanaryRef | None
    weights: Weights
    trip: TripEvidence | None
    created_at: Number
    updated_at: Number
    # Only while the rollback is overdue (the broker leaves it out otherwise).
    rollback_overdue: RollbackOverdue | None = None

    @property
    def canary_off(self) -> bool:
        """Whether routers must send the canary nothing in this release's phase."""
        return self.phase in CANARY_OFF

    @property
    def canary_live(self) -> bool:
        """Whether this release sends its canary any traffic (``phases.canary_live``)."""
        return canary_live(self.to_wire())

    @property
    def canary_weight(self) -> float:
        return float(self.weights.canary)


class ReleaseList(Record):
    releases: tuple[Release, ...]


class Event(Record):
    """One entry of a release's history: ``change`` is ``{field: {"old", "new"}}`` for a
    write, or what an annotation added."""

    seq: Count
    release: Text
    time: Number
    revision: Count
    actor: Text
    change: JsonObject
    reason: Text


class EventPage(Record):
    """``GET /v1/releases/{name}/events?after_seq=N&limit=L``: oldest first; a page shorter
    than ``limit`` is the last; ask again with ``after_seq=next_after_seq``."""

    events: tuple[Event, ...]
    next_after_seq: Count
    limit: Annotated[Int, Field(ge=1)]

    @property
    def last(self) -> bool:
        return len(self.events) < self.limit


class Heartbeat(Record):
    """What a router reports to ``POST /v1/routers/heartbeat``."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"applied_at", "canary_off_since"})

    router_id: Annotated[Text, Field(min_length=1, max_length=200)]
    release: Text
    applied_revision: Count | None
    applied_at: Annotated[Number, Field(ge=0)] | None = None
    canary_off_since: Annotated[Number, Field(ge=0)] | None = None


class RouterBeat(Record):
    """One router as the broker last heard it (``GET /v1/routers``). ``applied_at`` and
    ``canary_off_since`` are the router's clock; ``canary_off_since`` is null while the
    canary gets traffic. ``identity`` says what vouches for ``router_id``: ``bound`` (a
    credential minted for that router), ``pod`` (the router pod's own Kubernetes
    service-account token, reviewed by the API server), ``shared`` (the heartbeat
    credential any router may hold) or ``operator``; absent from a broker before #27."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"identity"})

    router_id: Text
    release: Text
    applied_revision: Count | None
    applied_at: Number | None
    canary_off_since: Number | None
    identity: Literal["bound", "pod", "shared", "operator"] | None = None
    last_seen: Number
    age_s: Number


class RouterList(Record):
    """``GET /v1/routers``: ``recent`` are routers no longer live that beat less than
    ``recent_s`` ago; an empty ``routers`` is "no router exists" only while it is empty."""

    routers: tuple[RouterBeat, ...]
    expiry_s: Number
    recent: tuple[RouterBeat, ...]
    recent_s: Number
