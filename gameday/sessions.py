"""``given_or_own``: the ``requests.Session`` a harness call was handed, or one of its own.

A leaf module (it imports only ``requests``), so every harness module that speaks HTTP can
take a caller's session, ``gameday.targets.history`` included (``gameday.api`` imports
that one, so it cannot import ``gameday.api``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import requests

__all__ = ["given_or_own"]


@contextmanager
def given_or_own(session: requests.Session | None) -> Iterator[requests.Session]:
    """``session`` as it is (its caller owns pooling and lifetime), or when None a
    short-lived session of this call's own, closed when the block ends."""
    if session is not None:
        yield session
        return
    with requests.Session() as own:
        yield own
