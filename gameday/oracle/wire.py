"""The harness's own strict JSON reading (it never imports ``canarystack``)."""

from __future__ import annotations

import json
from typing import Any

from gameday.errors import GamedayError

MAX_INT_DIGITS = 32
MAX_DEPTH = 64


class WireJsonError(GamedayError, ValueError):
    """A JSON document the harness refuses; the message says why."""


def _refuse_constant(name: str) -> Any:
    raise WireJsonError(
        f"JSON holds the non-standard constant {name} (JSON has no NaN or Infinity)"
    )


def _keep_constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise WireJsonError(
            f"JSON holds an integer of {len(text.lstrip('-'))} digits "
            f"(at most {MAX_INT_DIGITS} are read)"
        )
    return int(text)


def _depth(raw: str) -> int:
    """The deepest nesting of brackets outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads(raw: bytes | str, keep_non_finite: bool = False) -> Any:
    """Parse ``raw`` strictly (below); WireJsonError when refused.

    ``loads(raw)`` refuses what a well-behaved server never sends and what would make a
    harness reader misbehave: the non-standard constants ``NaN``/``Infinity``/``-Infinity``,
    integers longer than ``MAX_INT_DIGITS`` digits, nesting deeper than ``MAX_DEPTH``, and
    bytes that are not UTF-8. Each refusal is a ``WireJsonError`` (a ValueError) that says
    what was wrong.

    ``loads(raw, keep_non_finite=True)`` reads the constants as the floats they stand for,
    for the one reader that must *judge* them rather than refuse them: the oracle, which
    counts a canary that answers ``NaN`` logprobs as maximally divergent (``gameday.oracle.kl``)
    instead of dropping the pair as unreadable.
    """
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireJsonError(f"JSON is not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if _depth(text) > MAX_DEPTH:
        raise WireJsonError(f"JSON is nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            text,
            parse_constant=_keep_constant if keep_non_finite else _refuse_constant,
            parse_int=_parse_int,
        )
    except WireJsonError:
        raise
    except (json.JSONDecodeError, RecursionError) as exc:
        raise WireJsonError(f"not valid JSON: {exc}") from None
