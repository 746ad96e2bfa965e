"""The simulated engine's capacity: sequence slots, a FIFO queue, and the latency model.

This module must never compute tokens or touch HTTP; it only decides *when*.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from canary_contract.bounds import bounded, check_bounds

# A wait shorter than this is not worth a timer wakeup (the loop's granularity is ~1 ms).
MIN_SLEEP_S = 0.0005


@dataclass(frozen=True)
class CapacityModel:
    slots: int = bounded(32, ge=1)
    ttft_base_s: float = bounded(0.020, ge=0)
    prefill_s_per_1k: float = bounded(0.050, ge=0)
    itl_base_s: float = bounded(0.005, ge=0)
    itl_batch_k: float = bounded(1.0, ge=0)
    itl_jitter: float = bounded(0.05, ge=0, lt=1)

    def __post_init__(self) -> None:
        check_bounds(self)

    def prefill_s(self, prompt_tokens: int) -> float:
        """Time from admission to the first token (without faults)."""
        return self.ttft_base_s + self.prefill_s_per_1k * prompt_tokens / 1000.0

    def itl_s(self, running: int, rng: random.Random) -> float:
        """One inter-token gap with ``running`` sequences decoding together."""
        base = self.itl_base_s * (1.0 + self.itl_batch_k * running / self.slots)
        if self.itl_jitter:
            base *= 1.0 + self.itl_jitter * (2.0 * rng.random() - 1.0)
        return base


class SlotScheduler:
    """``slots`` sequence slots and a FIFO queue of requests waiting for one.

    A request waits in a FIFO queue until one of ``slots`` sequence slots is free (as in
    a continuous-batching engine: at most ``slots`` sequences decode together). Then:

    - time to first token = queue wait + ``ttft_base_s`` + ``prefill_s_per_1k`` x prompt
      tokens / 1000 (+ a latency fault's extra);
    - each further token after ``itl_base_s`` x (1 + ``itl_batch_k`` x running / slots),
      times (1 +/- ``itl_jitter``) (x a latency fault's multiplier).

    Token times are absolute deadlines (t_first, then deadline += itl), so the event loop's
    timer lateness does not accumulate over a stream: ``asyncio.sleep(0.002)`` lasts ~2.3 ms
    here, and 64 of them would add ~20 ms.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Wait (FIFO) for a slot. Cancelled while waiting: leaves the queue cleanly."""
        if self.running < self.slots and not self._waiters:
            self.running += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Free a slot: hand it to the oldest waiter, or count it free."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot moves to the waiter; running is unchanged
                return
        self.running -= 1


async def sleep_until(deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep until an absolute monotonic deadline (no-op if it has passed)."""
    delay = deadline - clock()
    if delay > MIN_SLEEP_S:
        await asyncio.sleep(delay)
