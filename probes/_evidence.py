"""What the SLO and gate probes measure against: the run's fault ledger and load records.

``load.json`` (written by the ``probes.load`` control in the run folder) says whether the
load has run: absent before the method, ``running`` during it, ``stopped`` with the
records' path after it. The reference fault of an experiment is the one the gate must
catch — the ``kernel`` fault on the canary — else the experiment's first injection or
pod kill (the same rule as the report's timeline).

This module only reads files of the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from gameday.faults import FaultEntry, FaultLedger
from probes._context import LOAD_STATE_NAME, Configuration, ledger, run_dir

RECORD_COLUMNS = (
    "start_time",
    "ttft_s",
    "e2e_s",
    "ok",
    "error_kind",
    "served_by",
    "prompt_tokens",
    "planned_prompt_tokens",
    "status",
)


def load_state(configuration: Configuration | None) -> dict[str, Any] | None:
    path = run_dir(configuration) / LOAD_STATE_NAME
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def reference_fault(book: FaultLedger) -> FaultEntry | None:
    entries = book.entries()
    for e in entries:
        if e.action == "inject" and e.kind == "kernel":
            return e
    for e in entries:
        if e.action in ("inject", "kill"):
            return e
    return None


def first_kill(book: FaultLedger) -> FaultEntry | None:
    return book.first(action="kill")


def run_ledger(configuration: Configuration | None) -> FaultLedger:
    return ledger(configuration)


def read_records(path: str | Path) -> pd.DataFrame:
    """The load records with the columns the probes use (absent ones all-null)."""
    import pyarrow.parquet as pq

    pfile = pq.ParquetFile(path)
    present = [c for c in RECORD_COLUMNS if c in pfile.schema_arrow.names]
    frame = pfile.read(columns=present).to_pandas()  # the file opened once
    for col in RECORD_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    frame["ok"] = frame["ok"].astype("boolean").fillna(False).astype(bool)
    tokens = pd.to_numeric(frame["prompt_tokens"], errors="coerce")
    planned = pd.to_numeric(frame["planned_prompt_tokens"], errors="coerce")
    frame["tokens"] = tokens.fillna(planned)
    frame["served_by"] = frame["served_by"].fillna("").astype(str)
    for col in ("start_time", "ttft_s", "e2e_s"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame
