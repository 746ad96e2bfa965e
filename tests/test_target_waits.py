"""``gameday.targets.waits.poll``: the one wait every probe's deadline goes through."""

from __future__ import annotations

import time

from gameday.targets.waits import poll


def test_it_reads_until_done() -> None:
    readings = iter([1, 2, 3, 4])
    assert poll(lambda: next(readings), lambda v: v == 3, time.monotonic() + 30, 0.0) == (3, True)


def test_it_reads_once_when_the_deadline_has_passed_and_gives_the_last_reading() -> None:
    readings = iter([1, 2])
    assert poll(lambda: next(readings), lambda v: False, time.monotonic(), 5.0) == (1, False)
    assert next(readings) == 2  # read once, and no sleep of 5 s


def test_it_waits_between_readings_until_the_deadline() -> None:
    t0 = time.monotonic()
    value, done = poll(time.monotonic, lambda v: False, t0 + 0.2, 0.05)
    assert not done and value >= t0 + 0.2
    assert time.monotonic() - t0 < 2.0
