"""A circuit breaker for one dependency (closed, open, half-open).

Pure: time comes from ``clock`` (monotonic), so tests move it instead of sleeping. This
module never sleeps and never does I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "open", "half_open"]
STATES: tuple[State, ...] = ("closed", "open", "half_open")


@dataclass
class CircuitBreaker:
    """A circuit breaker: closed -> open after ``failures`` consecutive failures, or after
    ``failures`` failures within ``window_s`` seconds that are also at least
    ``min_failure_ratio`` of the calls in that window (a flapping dependency) -> half-open
    after ``cooldown_s`` (one probe call) -> closed on the probe's success, open again on its
    failure. An outage fails every call, so the consecutive rule (failures at most ``window_s``
    apart) opens within a few calls; the
    ratio keeps a busy, healthy dependency's occasional timeout (a loaded machine) from
    opening it.
    """

    failures: int = 5
    window_s: float = 10.0
    cooldown_s: float = 2.0
    min_failure_ratio: float = 0.5
    clock: Callable[[], float] = time.monotonic
    _state: State = "closed"
    _recent: deque[tuple[float, bool]] = field(default_factory=deque)  # (time, failed)
    _opened_at: float = 0.0
    _probing: bool = False
    _consecutive: int = 0
    _last_failure: float = float("-inf")

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"failures is {self.failures}: give at least 1")
        for name in ("window_s", "cooldown_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} is {value!r}: give a finite number of seconds > 0")
        if not 0 < self.min_failure_ratio <= 1:
            raise ValueError(
                f"min_failure_ratio is {self.min_failure_ratio!r}: give a share in (0, 1]"
            )

    @property
    def state(self) -> State:
        if self._state == "open" and self.clock() - self._opened_at >= self.cooldown_s:
            self._state = "half_open"
            self._probing = False
        return self._state

    def allow(self) -> bool:
        """Whether a call may go to the dependency now. In half-open, only one (the
        probe) until it reports back."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> None:
        if self._state in ("half_open", "open"):
            self._state = "closed"
            self._recent.clear()
        else:
            self._note(self.clock(), failed=False)
        self._consecutive = 0
        self._probing = False

    def _note(self, now: float, *, failed: bool) -> None:
        self._recent.append((now, failed))
        while self._recent and now - self._recent[0][0] > self.window_s:
            self._recent.popleft()

    def failure(self) -> None:
        now = self.clock()
        if self._state == "half_open":
            self._open(now)
            return
        if self._state == "open":
            return
        self._note(now, failed=True)
        # Consecutive within the window: failures far apart are not one outage.
        if now - self._last_failure > self.window_s:
            self._consecutive = 0
        self._last_failure = now
        self._consecutive += 1
        failed = sum(1 for _, f in self._recent if f)
        if self._consecutive >= self.failures or (
            failed >= self.failures and failed >= self.min_failure_ratio * len(self._recent)
        ):
            self._open(now)

    def release(self) -> None:
        """A call that was allowed but never reached the dependency (cancelled): the
        half-open probe slot is free again."""
        self._probing = False

    def _open(self, now: float) -> None:
        self._state = "open"
        self._opened_at = now
        self._probing = False
        self._consecutive = 0
        self._recent.clear()
