"""Pacing: when each trace request must start (open loop), and the ramp curve.

This module keeps no global state and does no I/O; the clock is a parameter so tests can
drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Slot:
    index: int  # index into the trace
    due: float  # clock time at which the request should start


@dataclass(eq=False)
class TraceSchedule:
    """A trace says when requests arrived. Replaying it closed-loop (each user sends its next
    request when its previous one ends) would let a slow server push the arrivals back and
    hide the very overload the trace contains. Here every request has a due time — its trace
    offset × ``time_scale`` after the schedule starts — and a free user takes the next due
    request and waits until it is due. When no user is free the request starts late; the
    schedule counts every start later than ``late_tolerance_s`` and keeps the worst lag, so a
    run that could not keep up says so (add users, or slow the trace down with a larger
    time scale).

    With several Locust processes, process ``worker_index`` of ``worker_count`` takes every
    ``worker_count``-th request, so together they replay the whole trace once.
    """

    offsets_s: Sequence[float]
    time_scale: float = 1.0
    worker_index: int = 0
    worker_count: int = 1
    late_tolerance_s: float = 0.1
    clock: Callable[[], float] = time.monotonic
    t0: float | None = field(default=None, init=False)
    _next: int = field(default=0, init=False)
    taken: int = field(default=0, init=False)
    started: int = field(default=0, init=False)
    abandoned: int = field(default=0, init=False)
    late: int = field(default=0, init=False)
    max_lag_s: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError(f"--trace-time-scale must be > 0, got {self.time_scale}")
        if not 0 <= self.worker_index < self.worker_count:
            raise ValueError(f"worker index {self.worker_index} outside 0..{self.worker_count - 1}")
        self._next = self.worker_index

    def __len__(self) -> int:
        """Requests this process replays."""
        n = len(self.offsets_s)
        return max(0, (n - self.worker_index + self.worker_count - 1) // self.worker_count)

    @property
    def duration_s(self) -> float:
        """Scaled time from the first to the last request of the whole trace."""
        return (self.offsets_s[-1] if self.offsets_s else 0.0) * self.time_scale

    def start(self, t0: float | None = None) -> None:
        self.t0 = self.clock() if t0 is None else t0

    def take(self) -> Slot | None:
        """The next request for this process, or None once all are taken."""
        if self.t0 is None:
            self.start()
        assert self.t0 is not None
        i = self._next
        if i >= len(self.offsets_s):
            return None
        self._next += self.worker_count
        self.taken += 1
        return Slot(i, self.t0 + self.offsets_s[i] * self.time_scale)

    @property
    def finished(self) -> bool:
        """Every request of this process has started (or was given up when the run stopped)."""
        return self.taken == len(self) and self.started + self.abandoned == self.taken

    def abandon(self, slot: Slot) -> None:
        """``slot`` will never start (the run is stopping)."""
        self.abandoned += 1

    def mark_started(self, slot: Slot, now: float | None = None) -> float:
        """Note that ``slot`` started now; returns its lag (0 when on time or early)."""
        now = self.clock() if now is None else now
        lag = max(0.0, now - slot.due)
        self.started += 1
        self.max_lag_s = max(self.max_lag_s, lag)
        if lag > self.late_tolerance_s:
            self.late += 1
        return lag


def ramp_users(t_s: float, start: int, end: int, ramp_s: float) -> int:
    """Users at ``t_s`` seconds of a linear ramp from ``start`` to ``end`` over ``ramp_s``."""
    if ramp_s <= 0 or t_s >= ramp_s:
        return end
    return max(0, round(start + (end - start) * t_s / ramp_s))
