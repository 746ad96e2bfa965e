"""The harness's strict JSON reading: the contract's (``canary_contract.strictjson``, the
same rules the stack applies), with the harness's own error class."""

from __future__ import annotations

from typing import Any

from canary_contract import strictjson
from gameday.errors import GamedayError


class WireJsonError(GamedayError, ValueError):
    """A JSON document the harness refuses; the message says why."""


def loads(raw: bytes | str, keep_non_finite: bool = False) -> Any:
    """Parse ``raw`` strictly; WireJsonError when refused.

    ``loads(raw)`` refuses what a well-behaved server never sends and what would make a
    harness reader misbehave: the non-standard constants ``NaN``/``Infinity``/``-Infinity``,
    integers longer than ``strictjson.MAX_INT_DIGITS`` digits, nesting deeper than
    ``strictjson.MAX_DEPTH`` and text that is not UTF-8. ``keep_non_finite=True`` reads the
    constants as floats, for the oracle, which judges them (``canary_contract.strictjson``).
    """
    try:
        return strictjson.loads(raw, keep_non_finite=keep_non_finite)
    except strictjson.StrictJsonError as exc:
        raise WireJsonError(f"JSON refused: {exc}") from None
