"""What the SLO and gate probes measure against: the run folder's fault ledger and load
records, read by the core (``gameday.run.folder.RunFolder``) for the folder the
configuration names (``probes._context.run_folder``). This module only reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from gameday.evidence.faults import ReferenceFault
from gameday.run.folder import NOT_YET, read_records
from gameday.run.load_state import LoadState
from probes._context import Configuration, run_folder
from probes._result import Slo

__all__ = [
    "NOT_YET",
    "before_anything",
    "experiment_began",
    "first_fault",
    "load_state",
    "read_records",
    "records",
    "reference",
    "run_json_lines",
]


def load_state(configuration: Configuration | None) -> LoadState | None:
    """``load.json`` of the run folder (None: no load has run in this experiment)."""
    return run_folder(configuration).load_state()


def run_json_lines(configuration: Configuration | None, name: str) -> list[Mapping[str, object]]:
    """The JSON objects of the run folder's JSON-lines file ``name`` (``[]``: none yet)."""
    return run_folder(configuration).json_lines(name)


def reference(configuration: Configuration | None) -> ReferenceFault | None:
    return run_folder(configuration).reference()


def first_fault(
    configuration: Configuration | None, action: str, kind: str | None = None
) -> Mapping[str, object] | None:
    return run_folder(configuration).first_fault(action, kind)


def experiment_began(configuration: Configuration | None) -> float | None:
    """When this experiment began, less the clock slack (None: nothing happened yet)."""
    return run_folder(configuration).experiment_began()


def before_anything(configuration: Configuration | None) -> bool:
    """The hypothesis before the method: no load has run and no fault is in the ledger."""
    return run_folder(configuration).before_anything()


def records(
    configuration: Configuration | None, check: str, allowed: float, unit: str
) -> pd.DataFrame | Slo:
    """The run's load records, or the SLO result that says why there are none."""
    return run_folder(configuration).records(check, allowed, unit)
