"""Waiting on a target: one reading taken again until it says what is wanted or a
deadline passes. The caller says what a reading that never got there means."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(
    read: Callable[[], T], done: Callable[[T], bool], deadline: float, every: float
) -> tuple[T, bool]:
    """``read()``, again every ``every`` seconds until ``done`` says so or ``deadline``
    (``time.monotonic()``) has passed: (the last reading, whether it was done). It reads
    at least once."""
    while True:
        value = read()
        if done(value):
            return value, True
        if time.monotonic() >= deadline:
            return value, False
        time.sleep(every)
