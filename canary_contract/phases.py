"""The release phase and the transition table, written down once for both halves.

``CANARY_OFF`` names the phases in which routers send the canary nothing; it is THE answer
to "which phases mean the canary is off?" for the stack and the harness alike. The broker
applies the table (``canarystack/broker/phases.py``: the checks and their messages).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


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


def is_canary_off(phase: str | None) -> bool:
    """Whether a release in ``phase`` (as read off the wire) sends the canary nothing."""
    return phase in CANARY_OFF_VALUES


# The same set as plain strings, for code that reads phases off the wire.
CANARY_OFF_VALUES: frozenset[str] = frozenset(p.value for p in CANARY_OFF)
