"""Strict JSON in and out: what both halves use for bytes that crossed the wire.

A value that is not finite must never enter a statistic, a store or an answer silently.
This module must never do I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 32


class StrictJsonError(ValueError):
    """The bytes are not strict JSON; the message says why."""


def _reject_constant(name: str) -> Any:
    raise StrictJsonError(
        f"{name} is not a JSON number (non-finite values are refused); send a finite number"
    )


# 10**32 needs 107 bits: an integer longer than MAX_INT_DIGITS digits is refused.
_MAX_INT_BITS = (10**MAX_INT_DIGITS).bit_length()


def _keep_constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def _check_number(item: int | float, keep_non_finite: bool) -> None:
    if isinstance(item, float):
        if not keep_non_finite and not math.isfinite(item):
            raise StrictJsonError("a number overflows a double; send a finite number")
    elif item.bit_length() > _MAX_INT_BITS:
        raise StrictJsonError(
            f"an integer of {len(str(abs(item)))} digits is out of range "
            f"(at most {MAX_INT_DIGITS} digits)"
        )


def _check_text(text: str) -> None:
    # A lone surrogate (written as an escape such as "\ud800") decodes to a str that
    # cannot be encoded again: refuse it here rather than fail later with a 500.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StrictJsonError(
            f"the text holds a lone surrogate at character {exc.start} "
            "(not valid Unicode); send valid UTF-8"
        ) from None


def _check_tree(obj: Any, max_depth: int, check_strings: bool, keep_non_finite: bool) -> None:
    """Refuse nesting deeper than ``max_depth``, integers longer than ``MAX_INT_DIGITS``,
    floats that overflowed and (when escapes were present) lone surrogates, in one
    iterative walk over the parsed value. Numbers are checked here rather than through
    ``parse_int``/``parse_float`` hooks, which cost a Python call per number; containers
    and their depths go on two lists (no tuple per item, so no garbage-collector storms
    holding the GIL on a body of many small items)."""
    containers: list[Any] = [obj]
    depths: list[int] = [0]
    while containers:
        item = containers.pop()
        depth = depths.pop()
        if isinstance(item, dict):
            values: Any = item.values()
            if check_strings:
                for key in item:
                    _check_text(key)
        elif isinstance(item, list):
            values = item
        else:
            values = (item,)
            depth -= 1
        for value in values:
            if isinstance(value, dict | list):
                if depth + 1 >= max_depth:
                    raise StrictJsonError(
                        f"nested deeper than {max_depth} levels; flatten the document"
                    )
                containers.append(value)
                depths.append(depth + 1)
            elif isinstance(value, bool) or value is None:
                continue
            elif isinstance(value, int | float):
                _check_number(value, keep_non_finite)
            elif check_strings and isinstance(value, str):
                _check_text(value)


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH, keep_non_finite: bool = False) -> Any:
    """Parse strict JSON; ``StrictJsonError`` (a ``ValueError``) says what was wrong.

    Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity``, integers of any
    length (a 5000-digit one raises only past ``sys.get_int_max_str_digits``) and nesting
    until ``RecursionError``; this refuses the non-finite constants, integers longer than
    ``MAX_INT_DIGITS``, nesting deeper than ``max_depth`` and invalid UTF-8 (lone
    surrogates included).

    ``keep_non_finite=True`` reads the constants (and a float that overflows) as the floats
    they stand for, for the one reader that must *judge* them rather than refuse them: the
    harness's oracle, which counts a canary answering ``NaN`` logprobs as maximally divergent
    (``gameday.oracle.kl``) instead of dropping the pair as unreadable."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJsonError(f"not valid UTF-8 at byte {exc.start}") from None
    else:
        text = data
    try:
        obj = json.loads(
            text, parse_constant=_keep_constant if keep_non_finite else _reject_constant
        )
    except StrictJsonError:
        raise
    except RecursionError:
        # json recurses per level: the document is far deeper than any limit here
        raise StrictJsonError(
            f"nested deeper than {max_depth} levels; flatten the document"
        ) from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own digit limit
            found = re.search(r"value has (\d+) digits", str(exc))
            digits = found.group(1) if found else "thousands of"
            raise StrictJsonError(
                f"an integer of {digits} digits is out of range (at most {MAX_INT_DIGITS} digits)"
            ) from None
        raise StrictJsonError(str(exc)) from None
    _check_tree(obj, max_depth, "\\u" in text, keep_non_finite)
    return obj


def dumps(obj: Any) -> str:
    """Compact JSON; ``ValueError`` for a non-finite float rather than writing ``NaN``
    (``json.dumps`` would write it)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def dumps_bytes(obj: Any) -> bytes:
    return dumps(obj).encode()
