"""A clock for tests of timed logic: time is moved, never slept."""

from __future__ import annotations


class ManualClock:
    """Callable like ``time.monotonic``; it moves only when a test moves it
    (``clock.now += 2.0``)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
