"""A release change: the PATCH (``ReleasePatch``), the release it leads to under the phase
rules (``plan``) and the fields an event records of it (``diff``).

This module must never do I/O: the store passes in how to look a version up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from canary_contract.broker import TripRecord
from canary_contract.json import JsonValue
from canarystack.broker import phases
from canarystack.broker.errors import Conflicting, Refused
from canarystack.broker.phases import Phase
from canarystack.broker.records import CanaryJson, ReleaseJson, StableJson


@dataclass(frozen=True)
class ReleasePatch:
    """One PATCH, already schema-validated. ``canary_set`` tells an explicit null apart."""

    expected_revision: int
    canary_weight: float | None = None
    phase: Phase | None = None
    canary_set: bool = False
    canary: str | None = None
    trip: TripRecord | None = None


def number(x: float) -> float | int:
    """Weights read back as ints when whole (5, not 5.0), as clients wrote them."""
    return int(x) if float(x).is_integer() else x


class FieldChange(TypedDict):
    """One field of an event's ``change``: its value before and after."""

    old: JsonValue
    new: JsonValue


def _flat(release: ReleaseJson | None) -> dict[str, JsonValue]:
    """The fields an event's ``change`` compares, flattened (``weights.canary``)."""
    if release is None:
        return {}
    canary = release["canary"]
    return {
        "phase": release["phase"],
        "stable.version": release["stable"]["version"],
        "stable.digest": release["stable"]["digest"],
        "canary.version": None if canary is None else canary["version"],
        "canary.digest": None if canary is None else canary["digest"],
        "canary.quarantined": None if canary is None else canary["quarantined"],
        "weights.canary": release["weights"]["canary"],
        "trip": release["trip"],
    }


def diff(old: ReleaseJson | None, new: ReleaseJson) -> dict[str, FieldChange]:
    """``{field: {"old": a, "new": b}}`` for every field that differs."""
    before, after = _flat(old), _flat(new)
    return {
        key: FieldChange(old=before.get(key), new=value)
        for key, value in after.items()
        if before.get(key) != value
    }


def plan(
    old: ReleaseJson,
    patch: ReleasePatch,
    *,
    check_canary: Callable[[str], None],
    canary_ref: Callable[[str], CanaryJson],
) -> ReleaseJson:
    """The release after ``patch``, or a domain error saying why it is refused.

    ``check_canary(version)`` refuses a version that cannot become the canary (unknown or
    quarantined); ``canary_ref(version)`` is the registered canary's
    ``{"version", "digest", "quarantined"}``. The store passes both, reading its database.
    """
    current = Phase(old["phase"])
    target = patch.phase or current
    old_canary = old["canary"]["version"] if old["canary"] else None
    canary_after = patch.canary if patch.canary_set else old_canary
    canary_changed = canary_after != old_canary
    if canary_changed and canary_after is not None:
        check_canary(canary_after)
    try:
        phases.check_transition(
            current,
            target,
            new_canary=canary_changed and canary_after is not None,
            trip_given=patch.trip is not None,
            has_canary=canary_after is not None,
        )
        if canary_changed:
            phases.check_canary_change(current, target)
        if patch.canary_weight is not None:
            phases.check_weight(target, patch.canary_weight, current)
    except phases.IllegalTransition as exc:
        raise Conflicting(
            exc.message,
            param="phase",
            code="illegal_transition",
            extra={"current_phase": exc.current.value, "allowed": exc.allowed},
        ) from None

    weight = old["weights"]["canary"] if patch.canary_weight is None else patch.canary_weight
    trip = old["trip"]
    stable: StableJson = old["stable"].copy()
    if (current, target) in phases.NEEDS_NEW_CANARY:
        # A fresh start: the old evidence belongs to the old canary, and traffic
        # starts at the weight this change gives (0 unless it says otherwise).
        trip = None
        weight = patch.canary_weight or 0
    if target in phases.NEEDS_TRIP and patch.trip is not None:
        trip = patch.trip
    if target == Phase.PROMOTED and current != Phase.PROMOTED:
        # Promotion: the canary becomes the stable version; nothing is left to split.
        assert old["canary"] is not None  # check_transition needs has_canary
        stable = {"version": old["canary"]["version"], "digest": old["canary"]["digest"]}
        canary_after = None
        weight = 0
    if canary_after is None and weight > 0:
        raise Refused(
            f"weights.canary would be {weight:g} but the release would have no canary: "
            "give a canary version or set the weight to 0.",
            param="weights.canary",
            code="no_canary",
        )
    canary = None if canary_after is None else canary_ref(canary_after)
    return {
        **old,
        "phase": target.value,
        "stable": stable,
        "canary": canary,
        "weights": {"canary": number(weight)},
        "trip": trip,
    }
