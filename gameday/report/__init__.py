"""Reports: a run folder in, a verdict a person can read in a minute out.

``build_report(run_dir)`` reads what ``gameday run`` left in ``reports/<run-id>/``
(docs/ARCHITECTURE.md §7 and §7.1: journals, load and oracle records, fault ledgers, the
broker's timeline, result.json) and writes, at the run folder's top: ``summary.json``,
``junit.xml``, ``report.html``, ``timeline.json``, the figures (PNG) and the numbers
behind every figure (CSV). ``gameday report RUN_DIR`` is the same from the shell.

Pieces of the package: ``loader`` (read a run folder, list what is missing),
``timeline`` (events -> durations vs SLOs), ``heatmaps`` (binned cell data + figures),
``matrix`` (component x fault), ``verdict`` (checks, reasons, summary.json), ``junit``,
``html``, ``build`` (the whole pipeline), ``cli`` and ``synthetic`` (contract-shaped run
folders for tests and the benchmark).

This package only reads its inputs and writes report files into the run folder: it
never talks to a target, never changes an experiment's own files, and never crashes on
partial data (what is missing is part of the report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gameday.report.verdict import Summary

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
        from gameday.report.verdict import Summary

        return Summary
    raise AttributeError(name)
