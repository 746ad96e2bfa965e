"""The dependency's circuit breaker (issue #16 item 3): closed -> open after N failures
within the window -> half-open after the cool-down (exactly one probe) -> closed on its
success, open again on its failure. Time is moved, never slept."""

from __future__ import annotations

import pytest

from canarystack.dependency.breaker import CircuitBreaker
from tests.clock_support import ManualClock


def breaker(clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(failures=3, window_s=10.0, cooldown_s=2.0, clock=clock)


def opened() -> tuple[ManualClock, CircuitBreaker]:
    """A breaker just opened by three failures, and its clock."""
    clock = ManualClock()
    b = breaker(clock)
    for _ in range(3):
        b.failure()
    return clock, b


def test_opens_after_n_failures_within_the_window() -> None:
    clock = ManualClock()
    b = breaker(clock)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.state == "closed"
    b.failure()
    assert b.state == "open"
    assert not b.allow()


def test_failures_outside_the_window_do_not_count() -> None:
    clock = ManualClock()
    b = breaker(clock)
    b.failure()
    b.failure()
    clock.now += 10.5
    b.failure()
    assert b.state == "closed"


def test_a_success_does_not_reset_the_window_while_closed_but_closes_a_half_open() -> None:
    clock, b = opened()
    clock.now += 1.9
    assert b.state == "open" and not b.allow()
    clock.now += 0.2
    assert b.state == "half_open"
    assert b.allow()  # the one probe
    assert not b.allow()  # nobody else while it is out
    b.success()
    assert b.state == "closed" and b.allow()


def test_a_failed_probe_opens_again_for_a_full_cool_down() -> None:
    clock, b = opened()
    clock.now += 2.0
    assert b.allow()
    b.failure()
    assert b.state == "open"
    clock.now += 1.9
    assert not b.allow()
    clock.now += 0.1
    assert b.allow()


def test_a_cancelled_probe_frees_the_probe_slot() -> None:
    clock, b = opened()
    clock.now += 2.0
    assert b.allow()
    b.release()
    assert b.allow()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"failures": 0}, "failures is 0"),
        ({"window_s": 0.0}, "window_s"),
        ({"cooldown_s": float("inf")}, "cooldown_s"),
        ({"cooldown_s": float("nan")}, "cooldown_s"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]


def test_occasional_failures_among_successes_do_not_open_it() -> None:
    """A loaded machine's odd timeout on a healthy Redis (the first pod-kill game day had
    breakers opening before any fault) is not an outage: fewer than half of the window's
    calls failed."""
    clock = ManualClock()
    b = breaker(clock)
    for _ in range(10):
        for _ in range(3):
            b.success()
        b.failure()
        clock.now += 0.5
    assert b.state == "closed"


def test_consecutive_failures_open_it_however_many_successes_came_before() -> None:
    """An outage fails every call: it opens within ``failures`` calls (the 4 s stall of
    the second latency game day never opened a ratio-only breaker: its 10 s window held
    more earlier successes than stalled calls, so every stalled request paid the deadline)."""
    clock = ManualClock()
    b = breaker(clock)
    for _ in range(20):
        b.success()
    b.failure()
    b.failure()
    assert b.state == "closed"
    b.failure()
    assert b.state == "open"


def test_a_flapping_dependency_opens_it_once_failures_are_the_majority() -> None:
    clock = ManualClock()
    b = breaker(clock)
    for _ in range(2):
        b.failure()
        b.success()
    assert b.state == "closed"  # 2 of 4, never 3 in a row
    b.failure()
    assert b.state == "open"  # 3 of 5


def test_a_bad_ratio_is_refused() -> None:
    with pytest.raises(ValueError, match="min_failure_ratio"):
        CircuitBreaker(min_failure_ratio=0.0)
