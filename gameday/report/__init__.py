"""Reports: a run folder in, a verdict a person can read in a minute out.

``build_report(run_dir)`` (``gameday.report.build``) writes summary.json, junit.xml,
report.html and the figures into a run folder of ``gameday run``; ``gameday report
RUN_DIR`` is the same from the shell. The package must never talk to a target, change an
experiment's own files, or crash on partial data (what is missing is in the report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gameday.report.summary import Summary

__all__ = ["ReportInputError", "Summary", "build_report"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import gameday.report` (and `gameday --help`) does not import pandas and
    # matplotlib.
    if name == "build_report":
        from gameday.report.build import build_report

        return build_report
    if name == "ReportInputError":
        from gameday.report.loader import ReportInputError

        return ReportInputError
    if name == "Summary":
        from gameday.report.summary import Summary

        return Summary
    raise AttributeError(name)
