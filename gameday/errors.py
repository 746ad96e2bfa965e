"""The harness's one error root: every error the harness raises on purpose is a
``GamedayError`` (and keeps the standard base it had, ``ValueError`` for a wrong input,
``RuntimeError`` for a failed step), so a caller can catch the harness's errors apart
from bugs."""

from __future__ import annotations


class GamedayError(Exception):
    """An error the harness raises on purpose; the message names the input or the step
    and says what to do."""
