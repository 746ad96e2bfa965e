"""The broker's request bodies: the pydantic models that validate them, field by field
(the HTTP layer, ``server``, parses bodies with them; ``api_spec`` is generated from them).
Unknown fields are refused, so a typo shows instead of being ignored.

This module must never do I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from canary_contract import broker as contract_broker
from canary_contract import strictjson
from canary_contract.broker import MAX_TRIP_COLOURS
from canarystack.broker.phases import Phase
from canarystack.broker.wire import MAX_INT64

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# For path segments: fullmatch, because re's '$' also matches before a trailing newline.
_NAME_RE = re.compile(NAME_PATTERN[1:-1])
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Actor = Annotated[str, Field(min_length=1, max_length=200)]
Reason = Annotated[str, Field(max_length=4000)]
# Every number the broker stores must be finite (strictjson already refuses NaN and
# Infinity on the wire; the models refuse them again for any other path) and every integer
# must fit SQLite's signed 64 bits.
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
EpochSeconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_INT64)]


# An event's change is part of every page of history (up to MAX_EVENTS_PER_PAGE of them
# per answer), so what a client adds to one (an annotation, trip detail) stays small.
MAX_EVENT_FIELD_BYTES = 16 * 1024


def _small_json(field: str) -> AfterValidator:
    """A validator refusing a JSON object over ``MAX_EVENT_FIELD_BYTES``, naming ``field``."""

    def check(value: dict[str, object]) -> dict[str, object]:
        size = len(strictjson.dumps(value))
        if size > MAX_EVENT_FIELD_BYTES:
            raise ValueError(
                f"{field} is {size} bytes as JSON, over the limit of {MAX_EVENT_FIELD_BYTES}: "
                "it is stored in the release's event history and read back on every page; "
                "keep it to a few fields"
            )
        return value

    return AfterValidator(check)


class _Body(BaseModel):
    # Unknown fields are refused so that typos show instead of being ignored.
    model_config = ConfigDict(extra="forbid")


class Weights(_Body):
    canary: Annotated[float, Field(strict=True, ge=0, le=100, allow_inf_nan=False)]


class TripColour(contract_broker.TripColour):
    """The contract's ``TripColour`` as a sender writes it: unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TripEvidence(contract_broker.TripEvidence):
    """The contract's ``TripEvidence`` (its fields are defined there, once) as the gate
    sends it in a PATCH: unknown fields refused, ``detail`` kept small (it is stored in
    the history), ``colours`` (at most MAX_TRIP_COLOURS request and trace ids behind the
    trip) refusing unknown fields too."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    order_message: ClassVar[str] = (
        "trip.last_sample_time is before trip.first_sample_time; send the window's first "
        "and last sample times in order"
    )

    detail: Annotated[dict[str, object], _small_json("trip.detail")] = Field(default_factory=dict)
    colours: Annotated[tuple[TripColour, ...], Field(max_length=MAX_TRIP_COLOURS)] | None = None


class RegisterVersion(_Body):
    version: Name
    manifest: Any
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class QuarantineVersion(_Body):
    actor: Actor | None = None
    reason: Reason = ""


class CreateRelease(_Body):
    name: Name
    stable: Name
    canary: Name | None = None
    weights: Weights = Field(default_factory=lambda: Weights(canary=0))
    actor: Actor | None = None
    reason: Reason = ""


class PatchRelease(_Body):
    expected_revision: Count
    weights: Weights | None = None
    phase: Phase | None = None
    canary: Name | None = None
    trip: TripEvidence | None = None
    actor: Actor | None = None
    reason: Reason = ""


class AcceptLoss(_Body):
    """``POST /v1/store/accept-loss``: an operator accepts what the store lost (recorded)."""

    actor: Actor | None = None
    reason: Annotated[str, Field(min_length=1, max_length=4000)]


class Annotation(_Body):
    actor: Actor | None = None
    change: Annotated[dict[str, object], _small_json("change")]
    reason: Reason = ""

    @model_validator(mode="after")
    def _has_annotation(self) -> Annotation:
        note = self.change.get("annotation")
        if not isinstance(note, str) or not note:
            raise ValueError(
                "change.annotation must be a non-empty string naming the annotation "
                "(e.g. 'fault_injected')"
            )
        return self


class Heartbeat(_Body):
    router_id: Annotated[str, Field(min_length=1, max_length=200)]
    release: Name
    applied_revision: Count | None
    # Optional (older routers omit them): when the router applied that revision, and since
    # when its effective canary weight is 0 (null while the canary gets traffic).
    applied_at: EpochSeconds | None = None
    canary_off_since: EpochSeconds | None = None
