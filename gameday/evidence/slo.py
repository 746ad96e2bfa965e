"""The SLO result every checking probe returns (docs/ARCHITECTURE.md §7.1):
``{"check", "measured", "allowed", "unit", "ok", "detail"}``, with ``detail.status``
``measured`` (a figure), ``failed`` (no figure: ``detail.why`` says why) or
``not_measured`` (before the method, where there is nothing to measure yet).

Built here for every probe and read here by both verdicts, so the shape is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeGuard


class Slo(TypedDict):
    """One SLO result as a probe returns it to ``chaos run`` (and the journal keeps it)."""

    check: str
    measured: float | None
    allowed: float
    unit: str
    ok: bool
    # ``status`` and ``why`` and whatever figures the probe adds: open by design.
    detail: dict[str, object]


SLO_KEYS = frozenset({"check", "measured", "allowed", "ok"})
NOT_MEASURED = "not_measured"
NOT_APPLICABLE = "not_applicable"


def result(
    check: str, measured: float | None, allowed: float, unit: str, ok: bool, **detail: object
) -> Slo:
    """A measured result; without a figure (``measured`` None) it is a failed one."""
    return {
        "check": check,
        "measured": None if measured is None else round(float(measured), 6),
        "allowed": float(allowed),
        "unit": unit,
        "ok": bool(ok),
        "detail": {"status": "measured" if measured is not None else "failed", **detail},
    }


def failed_result(check: str, allowed: float, unit: str, why: str, **detail: object) -> Slo:
    """No figure, and ``why`` not."""
    return result(check, None, allowed, unit, False, why=why, **detail)


def _unjudged(check: str, allowed: float, unit: str, status: str, why: str) -> Slo:
    return {
        "check": check,
        "measured": None,
        "allowed": float(allowed),
        "unit": unit,
        "ok": True,
        "detail": {"status": status, "why": why},
    }


def not_measured(check: str, allowed: float, unit: str, why: str) -> Slo:
    """Nothing to measure yet: not a check (the report leaves it out), so ``ok``."""
    return _unjudged(check, allowed, unit, NOT_MEASURED, why)


def not_applicable(check: str, allowed: float, unit: str, why: str) -> Slo:
    """The target cannot answer this check (a foreign stack lacks the part it reads): not
    a pass and not a failure, said with ``why`` (``detail.status`` ``not_applicable``)."""
    return _unjudged(check, allowed, unit, NOT_APPLICABLE, why)


def is_slo(output: object) -> TypeGuard[Mapping[str, object]]:
    """Whether a probe's output (decoded JSON) is an SLO result: its keys, not their types."""
    return isinstance(output, dict) and set(output) >= SLO_KEYS


def is_not_measured(output: Mapping[str, object]) -> bool:
    detail = output.get("detail")
    return isinstance(detail, dict) and detail.get("status") == NOT_MEASURED


def is_not_applicable(output: Mapping[str, object]) -> bool:
    """A check the target cannot answer (``not_applicable``): listed, neither pass nor fail."""
    detail = output.get("detail")
    return isinstance(detail, dict) and detail.get("status") == NOT_APPLICABLE
