"""Numeric bounds declared on a dataclass's fields and checked in one place.

A configuration declares each bounded field with ``bounded`` and checks them all with
``check_bounds`` (in ``__post_init__``, or where it validates)::

    @dataclass(frozen=True)
    class Pool:
        slots: int = bounded(32, ge=1)
        jitter: float = bounded(0.05, ge=0, lt=1)

        def __post_init__(self) -> None:
            check_bounds(self)

``Pool(slots=0)`` raises ``ValueError("slots must be >= 1, got 0")``: the field (or the
label the caller gives it, e.g. the flag that sets it), every bound, and the value. NaN
never satisfies a bound; ``finite=True`` refuses infinities too; ``None`` (an optional
field left unset) always passes.

Pure: no I/O, standard library only.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any, TypeVar, cast

_T = TypeVar("_T")
_KEY = "canary_contract.bounds"

# The comparisons a bound may make, by how its message writes them.
_TESTS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


@dataclasses.dataclass(frozen=True)
class Bound:
    """What one field's value must be: ``value <op> limit`` for every ``(op, limit)`` of
    ``limits`` (ops of ``_TESTS``), and finite where ``finite``."""

    limits: tuple[tuple[str, float], ...]
    finite: bool = False

    def holds(self, value: float) -> bool:
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        return all(_TESTS[op](value, limit) for op, limit in self.limits)

    def describe(self) -> str:
        """E.g. ``>= 0 and < 1``, ``> 0 and finite``."""
        parts = [f"{op} {limit}" for op, limit in self.limits]
        return " and ".join([*parts, "finite"] if self.finite else parts)


def bounded(
    default: _T = cast(Any, dataclasses.MISSING),
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = False,
) -> _T:
    """A dataclass field (``default``; none given: a required field) whose value
    ``check_bounds`` holds to ``>= ge``, ``> gt``, ``<= le``, ``< lt`` (those given) and,
    with ``finite``, to a finite number."""
    asked = ((">=", ge), (">", gt), ("<=", le), ("<", lt))
    limits = tuple((op, limit) for op, limit in asked if limit is not None)
    return dataclasses.field(default=default, metadata={_KEY: Bound(limits, finite)})


def check_bounds(
    obj: object,
    error: type[ValueError] = ValueError,
    label: Callable[[str], str] = str,
) -> None:
    """Raise ``error`` for the first ``bounded`` field of the dataclass ``obj`` whose value
    is out of bounds: ``"<label(field)> must be <bounds>, got <value>"``."""
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"check_bounds needs a dataclass, got {type(obj).__name__}")
    for f in dataclasses.fields(obj):
        bound = f.metadata.get(_KEY)
        value = getattr(obj, f.name)
        if isinstance(bound, Bound) and value is not None and not bound.holds(value):
            raise error(f"{label(f.name)} must be {bound.describe()}, got {value}")
