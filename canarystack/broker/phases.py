"""The release phase rules: THE transition table of ``canary_contract.phases`` (the harness
reads it too) applied, and the side rules that belong to a phase. Like httpx's
``ClientState``, a refusal lists the allowed moves.

This module must never do I/O or know about HTTP or SQLite: it is the pure rule book that
the store applies inside its transaction.
"""

from __future__ import annotations

from canary_contract.phases import (
    CANARY_CHANGE_ALLOWED_IN,
    CANARY_OFF,
    NEEDS_NEW_CANARY,
    NEEDS_TRIP,
    TRANSITIONS,
    WEIGHTS_ALLOWED_IN,
    Phase,
)
from canarystack.common.error_fields import CanaryStackError

__all__ = [
    "CANARY_CHANGE_ALLOWED_IN",
    "CANARY_OFF",
    "NEEDS_NEW_CANARY",
    "NEEDS_TRIP",
    "TRANSITIONS",
    "WEIGHTS_ALLOWED_IN",
    "IllegalTransition",
    "Phase",
    "allowed_from",
    "check_canary_change",
    "check_transition",
    "check_weight",
    "parse_phase",
]


class IllegalTransition(CanaryStackError):
    """A change the phase rules refuse; carries the current phase and the allowed moves."""

    def __init__(self, current: Phase, allowed: list[str], message: str) -> None:
        super().__init__(message)
        self.current = current
        self.allowed = allowed
        self.message = message


def allowed_from(current: Phase) -> list[str]:
    """The phases ``current`` may move to, sorted (for messages and 409 bodies)."""
    return sorted(p.value for p in TRANSITIONS[current])


def parse_phase(value: str) -> Phase:
    """``Phase(value)`` with a message listing the phases (raises ValueError)."""
    try:
        return Phase(value)
    except ValueError:
        names = ", ".join(p.value for p in Phase)
        raise ValueError(f"unknown phase {value!r}: use one of {names}") from None


def _hint(current: Phase, target: Phase) -> str:
    if current == Phase.TRIPPED and target == Phase.ROLLED_BACK:
        return " Move to rolling_back first."
    if target == Phase.TRIPPED and current != Phase.PROGRESSING:
        return " Only a progressing release can trip."
    return ""


def check_transition(
    current: Phase,
    target: Phase,
    *,
    new_canary: bool = False,
    trip_given: bool = False,
    has_canary: bool = True,
) -> None:
    """Raise ``IllegalTransition`` unless ``current -> target`` is allowed with these extras.

    A release moves along these edges and no others: ``progressing -> tripped |
    rolling_back | promoted``; ``tripped -> rolling_back``; ``rolling_back ->
    rolled_back``; ``rolled_back -> progressing`` and ``promoted -> progressing`` only
    together with a new canary version (the version check itself, registered and not
    quarantined, is the store's; this table only says that a new one is needed).
    Entering ``tripped`` needs trip evidence (and evidence is accepted only then);
    promotion needs a canary to promote. A "move" to the phase a release is already in is
    not a transition and is accepted (so a client can resend the phase it read), unless it
    carries trip evidence. The refusal's message lists the allowed moves.

    ``new_canary``: the same change sets a canary version different from the current one.
    ``trip_given``: the same change carries trip evidence.
    ``has_canary``: the release has a canary version after the change (promotion needs one).
    """
    allowed = allowed_from(current)
    if target == current:
        if trip_given:
            raise IllegalTransition(
                current,
                allowed,
                f"Trip evidence is only accepted when the phase moves to tripped; the release "
                f"is already {current.value}. Allowed next phases: {', '.join(allowed)}.",
            )
        return
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(
            current,
            allowed,
            f"Illegal phase transition {current.value} -> {target.value}: from "
            f"{current.value} the release may move only to {', '.join(allowed)}."
            + _hint(current, target),
        )
    if (current, target) in NEEDS_NEW_CANARY and not new_canary:
        raise IllegalTransition(
            current,
            allowed,
            f"Phase {current.value} -> {target.value} needs a new canary version in the same "
            "change: send 'canary' with a registered, not quarantined version other than "
            "the current canary.",
        )
    if target in NEEDS_TRIP and not trip_given:
        raise IllegalTransition(
            current,
            allowed,
            f"Phase {target.value} needs trip evidence: send 'trip' with test, bucket, "
            "statistic, threshold, samples, first_sample_time, last_sample_time, tripped_at.",
        )
    if target not in NEEDS_TRIP and trip_given:
        raise IllegalTransition(
            current,
            allowed,
            f"Trip evidence is only accepted when the phase moves to tripped, not to "
            f"{target.value}.",
        )
    if target == Phase.PROMOTED and not has_canary:
        raise IllegalTransition(
            current,
            allowed,
            "Cannot promote: the release has no canary version to promote.",
        )


def check_weight(phase_after: Phase, canary_weight: float, current: Phase) -> None:
    """Refuse a canary weight above 0 unless the phase after the change allows traffic."""
    if canary_weight > 0 and phase_after not in WEIGHTS_ALLOWED_IN:
        raise IllegalTransition(
            current,
            allowed_from(current),
            f"A canary weight above 0 ({canary_weight:g}) is refused in phase "
            f"{phase_after.value}: weights above 0 are allowed only while "
            f"{', '.join(sorted(p.value for p in WEIGHTS_ALLOWED_IN))}.",
        )


def check_canary_change(current: Phase, phase_after: Phase) -> None:
    """Refuse replacing the canary version except in progressing or when re-entering it."""
    if current in CANARY_CHANGE_ALLOWED_IN and phase_after == current:
        return
    if (current, phase_after) in NEEDS_NEW_CANARY:
        return
    raise IllegalTransition(
        current,
        allowed_from(current),
        f"The canary version cannot change in phase {current.value}"
        + (f" -> {phase_after.value}" if phase_after != current else "")
        + ": change it while progressing, or together with the move from rolled_back or "
        "promoted back to progressing.",
    )
