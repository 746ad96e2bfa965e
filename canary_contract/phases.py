"""The release phase and the transition table, written down once for both halves.

``CANARY_OFF`` names the phases in which routers send the canary nothing; it is THE answer
to "which phases mean the canary is off?" for the stack and the harness alike, and
``canary_share`` / ``canary_live`` THE answer to "does this release send its canary
traffic, and how much?" (router, gate, rollback executor and harness read it here). The
broker applies the table (``canarystack/broker/phases.py``: the checks and their messages).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class Phase(enum.StrEnum):
    """A release's phase. A release moves along these edges and no others:

    - ``progressing -> tripped | rolling_back | promoted``
    - ``tripped -> rolling_back``
    - ``rolling_back -> rolled_back``
    - ``rolled_back -> progressing`` and ``promoted -> progressing`` only together with a new
      canary version.
    """

    PROGRESSING = "progressing"
    TRIPPED = "tripped"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"


# THE transition table. Every phase change in the broker is checked against it.
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.PROGRESSING: frozenset({Phase.TRIPPED, Phase.ROLLING_BACK, Phase.PROMOTED}),
    Phase.TRIPPED: frozenset({Phase.ROLLING_BACK}),
    Phase.ROLLING_BACK: frozenset({Phase.ROLLED_BACK}),
    Phase.ROLLED_BACK: frozenset({Phase.PROGRESSING}),
    Phase.PROMOTED: frozenset({Phase.PROGRESSING}),
}

# Edges that are legal only when the same change brings a new canary version.
NEEDS_NEW_CANARY: frozenset[tuple[Phase, Phase]] = frozenset(
    {(Phase.ROLLED_BACK, Phase.PROGRESSING), (Phase.PROMOTED, Phase.PROGRESSING)}
)

# Phases that can only be entered with trip evidence in the same change.
NEEDS_TRIP: frozenset[Phase] = frozenset({Phase.TRIPPED})

# Phases in which a canary weight above 0 may be set.
WEIGHTS_ALLOWED_IN: frozenset[Phase] = frozenset({Phase.PROGRESSING})

# Phases in which the canary version may be replaced without a phase change.
CANARY_CHANGE_ALLOWED_IN: frozenset[Phase] = frozenset({Phase.PROGRESSING})

# Phases whose routers must send no traffic to the canary, whatever the weights say.
CANARY_OFF: frozenset[Phase] = frozenset({Phase.TRIPPED, Phase.ROLLING_BACK, Phase.ROLLED_BACK})


def is_canary_off(phase: object) -> bool:
    """Whether a release in ``phase`` (as read off the wire) sends the canary nothing."""
    return phase in CANARY_OFF_VALUES


# The same set as plain strings, for code that reads phases off the wire.
CANARY_OFF_VALUES: frozenset[str] = frozenset(p.value for p in CANARY_OFF)


def canary_share(release: Mapping[str, Any] | None) -> float:
    """The share of traffic (percent, 0-100) a release sends its canary, as read off the
    wire: 0 with no release, in a canary-off phase (``CANARY_OFF``), with no canary version
    or a quarantined one, or a weight that is not a number; else ``weights.canary``,
    clamped to 0-100. (A promoted release has no canary, so only ``progressing`` can give
    more than 0.)"""
    if not release or is_canary_off(release.get("phase")):
        return 0.0
    canary = release.get("canary")
    if not isinstance(canary, Mapping) or not canary.get("version") or canary.get("quarantined"):
        return 0.0
    weights = release.get("weights")
    w = weights.get("canary") if isinstance(weights, Mapping) else None
    if isinstance(w, bool) or not isinstance(w, int | float) or w != w:
        return 0.0
    return float(min(100.0, max(0.0, w)))


def canary_live(release: Mapping[str, Any] | None) -> bool:
    """Whether a release sends its canary any traffic (``canary_share`` above 0)."""
    return canary_share(release) > 0.0
