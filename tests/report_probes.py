"""Chaos Toolkit activities for the report's journal test (run by a real ``chaos run``).

They return SLO probe outputs in the shape of docs/ARCHITECTURE.md §7.1, or raise as a
failing action does, so the report's parser reads a journal chaoslib itself wrote.
"""

from __future__ import annotations

from typing import Any

from chaoslib.exceptions import ActivityFailed

from gameday.report.synthetic_files import slo_output


def slo(check: str, measured: float, allowed: float, unit: str = "s") -> dict[str, Any]:
    return {**slo_output(check, measured, allowed, unit), "detail": {"from": "tests.report_probes"}}


def slo_ok(value: dict[str, Any] | None = None) -> bool:
    """Tolerance probe: the SLO output is ok."""
    return bool(value and value.get("ok"))


def inject_and_fail(component: str = "router") -> None:
    raise ActivityFailed(f"expected {component}-0 to accept the fault, got HTTP 401")
