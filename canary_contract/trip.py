"""Enums of the gate's trip decision, shared by the gate, the broker's evidence and the harness."""

from __future__ import annotations

import enum


class TripStatus(enum.StrEnum):
    """Where a gate's own trip decision stands."""

    PENDING = "pending"  # decided, not handed to the writer yet
    WRITING = "writing"  # the writer is at it (retrying while the broker is down or refuses)
    WRITTEN = "written"  # the broker carries the trip
    ABANDONED = "abandoned"  # no longer makes sense; why is in ``trip_status_reason``


class GateTest(enum.StrEnum):
    """The tests a gate runs per bucket; a trip names the one that fired."""

    DRIFT_KL = "drift_kl"
    DRIFT_TOP1 = "drift_top1"
    LATENCY = "latency"
    ERRORS = "errors"
