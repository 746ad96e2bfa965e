"""What the SLO and gate probes measure against: the run's fault ledger and load records.

``load.json`` (written by the ``probes.load`` control in the run folder) says whether the
load has run: absent before the method, ``running`` during it, ``stopped`` with the
records' path after it. The reference fault is ``gameday.evidence.faults``'s (the same
rule as the report's timeline). This module only reads files of the run folder.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from canary_contract.json import JsonObject
from gameday.evidence.checks import RECORD_COLUMNS, record_frame
from gameday.evidence.faults import ReferenceFault, reference_fault
from gameday.evidence.jsonl import json_objects
from gameday.evidence.milestones import CLOCK_SLACK_S
from gameday.evidence.slo import Slo, failed_result, not_measured
from gameday.run.load_state import read_state
from probes._context import Configuration, ledger, run_dir

NOT_YET = (
    "nothing to measure yet: no load has run and no fault was injected in this experiment "
    "(the hypothesis before the method); measured after the method"
)


def load_state(configuration: Configuration | None) -> JsonObject | None:
    """``load.json`` of the run folder (None: no load has run in this experiment)."""
    return read_state(run_dir(configuration)) or None


def run_json_lines(configuration: Configuration | None, name: str) -> list[JsonObject]:
    """The JSON objects of the run folder's JSON-lines file ``name`` (``[]`` when there is
    none yet); ``gameday.evidence.jsonl`` says which lines count."""
    try:
        raw = (run_dir(configuration) / name).read_bytes()
    except OSError:
        return []
    return json_objects(raw)


def fault_rows(configuration: Configuration | None) -> list[JsonObject]:
    """The run's fault ledger, one dict per line, oldest first."""
    return [asdict(e) for e in ledger(configuration).entries()]


def reference(configuration: Configuration | None) -> ReferenceFault | None:
    return reference_fault(fault_rows(configuration))


def first_fault(
    configuration: Configuration | None, action: str, kind: str | None = None
) -> JsonObject | None:
    rows = fault_rows(configuration)
    return next((r for r in rows if r["action"] == action and kind in (None, r["kind"])), None)


def experiment_began(configuration: Configuration | None) -> float | None:
    """When this experiment began, less the clock slack: the earlier of its load's start
    and its reference fault (None: nothing has happened in it yet)."""
    started = (load_state(configuration) or {}).get("started_at")
    ref = reference(configuration)
    starts = [
        float(t)
        for t in (started, ref.time if ref else None)
        if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
    ]
    return min(starts) - CLOCK_SLACK_S if starts else None


def before_anything(configuration: Configuration | None) -> bool:
    """The hypothesis before the method: no load has run and no fault is in the ledger."""
    return load_state(configuration) is None and reference(configuration) is None


def read_records(path: str | Path) -> pd.DataFrame:
    """The load records with the columns the probes use (absent ones all-null)."""
    import pyarrow.parquet as pq

    pfile = pq.ParquetFile(path)
    present = [c for c in RECORD_COLUMNS if c in pfile.schema_arrow.names]
    return record_frame(pfile.read(columns=present).to_pandas())  # the file opened once


def records(
    configuration: Configuration | None, check: str, allowed: float, unit: str
) -> pd.DataFrame | Slo:
    """The run's load records, or the SLO result that says why there are none (not
    measured before anything happened; failed once a fault was injected: fail-closed)."""
    state = load_state(configuration)
    if state is None:
        if reference(configuration) is None:
            return not_measured(check, allowed, unit, NOT_YET)
        why = (
            "no load ran in this experiment although it injected a fault: add the "
            "probes.load control to the experiment"
        )
        return failed_result(check, allowed, unit, why)
    if state.get("state") != "stopped":
        why = (
            f"the load is {state.get('state')!r}, not stopped: its records are not complete "
            f"({state.get('error') or 'no error recorded'})"
        )
        return failed_result(check, allowed, unit, why)
    path = state.get("records")
    try:
        frame = read_records(str(path))
    except Exception as exc:  # any unreadable file is a failed check, never a crash
        why = f"cannot read the load records {path}: {exc}"
        return failed_result(check, allowed, unit, why, records=path)
    if frame.empty:
        return failed_result(check, allowed, unit, "the load records have no rows", records=path)
    return frame
