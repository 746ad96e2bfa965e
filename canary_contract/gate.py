"""The gate's per-release state, as ``GET /v1/gate/{release}`` and its metrics name it."""

from __future__ import annotations

import enum


class GateState(enum.StrEnum):
    IDLE = "idle"  # no canary in progress
    WATCHING = "watching"  # a canary in progress, samples arriving
    TRIPPED = "tripped"  # this gate tripped it, or the release is in a canary-off phase
    INCONCLUSIVE = "inconclusive"  # a canary in progress, too few samples to decide: fail closed
