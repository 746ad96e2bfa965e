"""One experiment's run folder, as its activities read it while it runs: the load's state
(``load.json``, ``gameday.run.load_state``: absent before the method, ``running`` during
it, ``stopped`` with the records' path after it), the load records, the fault ledger
(``faults.jsonl``) and the JSON-lines files the activities write.

The reference fault is ``gameday.evidence.faults``'s (the same rule as the report's
timeline). Records that are missing or unreadable once a fault was injected never pass:
the check fails and says why (fail-closed). This module only reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from gameday.errors import GamedayError
from gameday.evidence.checks import RECORD_COLUMNS, record_frame
from gameday.evidence.faults import ReferenceFault, reference_fault
from gameday.evidence.jsonl import json_objects
from gameday.evidence.milestones import CLOCK_SLACK_S
from gameday.evidence.slo import Slo, failed_result, not_measured
from gameday.evidence.traffic import RecordsEvidence, records_traffic
from gameday.faults import FaultLedger
from gameday.run.load_state import LoadState, read_state

__all__ = ["LEDGER_NAME", "NOT_YET", "RecordsError", "RunFolder", "read_records"]

LEDGER_NAME = "faults.jsonl"
NOT_YET = (
    "nothing to measure yet: no load has run and no fault was injected in this experiment "
    "(the hypothesis before the method); measured after the method"
)


class RecordsError(GamedayError, RuntimeError):
    """No load records to read: the message is whole and says how to get them."""


def read_records(path: str | Path, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """The load records with the columns the checks use (absent ones all-null), plus the
    ``extra`` columns asked for (ValueError naming one the file does not have)."""
    import pyarrow.parquet as pq

    pfile = pq.ParquetFile(path)
    names = pfile.schema_arrow.names
    missing = [c for c in extra if c not in names]
    if missing:
        raise ValueError(f"the records have no column {', '.join(missing)}")
    present = [c for c in RECORD_COLUMNS if c in names]
    return record_frame(pfile.read(columns=[*present, *extra]).to_pandas())  # opened once


@dataclass(frozen=True)
class RunFolder:
    """The folder ``path`` of one experiment."""

    path: Path

    def load_state(self) -> LoadState | None:
        """``load.json`` (None: no load has run in this experiment)."""
        return read_state(self.path) or None

    def json_lines(self, name: str) -> list[Mapping[str, object]]:
        """The JSON objects of the JSON-lines file ``name`` (``[]`` when there is none
        yet); ``gameday.evidence.jsonl`` says which lines count."""
        try:
            raw = (self.path / name).read_bytes()
        except OSError:
            return []
        return json_objects(raw)

    def ledger(self) -> FaultLedger:
        return FaultLedger(self.path / LEDGER_NAME)

    def fault_rows(self) -> list[dict[str, object]]:
        """The fault ledger, one dict per line, oldest first."""
        return [asdict(e) for e in self.ledger().entries()]

    def reference(self) -> ReferenceFault | None:
        return reference_fault(self.fault_rows())

    def first_fault(self, action: str, kind: str | None = None) -> Mapping[str, object] | None:
        rows = self.fault_rows()
        return next((r for r in rows if r["action"] == action and kind in (None, r["kind"])), None)

    def experiment_began(self) -> float | None:
        """When this experiment began, less the clock slack: the earlier of its load's
        start and its reference fault (None: nothing has happened in it yet)."""
        started = (self.load_state() or {}).get("started_at")
        ref = self.reference()
        starts = [
            float(t)
            for t in (started, ref.time if ref else None)
            if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
        ]
        return min(starts) - CLOCK_SLACK_S if starts else None

    def before_anything(self) -> bool:
        """The hypothesis before the method: no load has run and no fault is in the ledger."""
        return self.load_state() is None and self.reference() is None

    def records(self, check: str, allowed: float, unit: str) -> pd.DataFrame | Slo:
        """The load records, or the SLO result that says why there are none (not measured
        before anything happened; failed once a fault was injected: fail-closed)."""
        state = self.load_state()
        if state is None:
            if self.reference() is None:
                return not_measured(check, allowed, unit, NOT_YET)
            why = (
                "no load ran in this experiment although it injected a fault: add the "
                "probes.load control to the experiment"
            )
            return failed_result(check, allowed, unit, why)
        if state.get("state") != "stopped":
            why = (
                f"the load is {state.get('state')!r}, not stopped: its records are not "
                f"complete ({state.get('error') or 'no error recorded'})"
            )
            return failed_result(check, allowed, unit, why)
        path = state.get("records")
        try:
            frame = read_records(str(path))
        except Exception as exc:  # any unreadable file is a failed check, never a crash
            why = f"cannot read the load records {path}: {exc}"
            return failed_result(check, allowed, unit, why, records=path)
        if frame.empty:
            why = "the load records have no rows"
            return failed_result(check, allowed, unit, why, records=path)
        return frame

    def records_traffic(self, since: float, canary_version: str | None) -> RecordsEvidence:
        """The requests of the stopped load that started after ``since``
        (``gameday.evidence.traffic.records_traffic``), with ``source`` and ``records``;
        RecordsError when there are no records to read."""
        state = self.load_state()
        if state is None or state.get("state") != "stopped":
            where = "has not run" if state is None else f"is {state.get('state')!r}, not stopped"
            raise RecordsError(
                f"no load records to pair with the controller's status: the load {where}. "
                "Add the probes.load control, run this probe after the method, or pass "
                "canary_promql."
            )
        path = str(state.get("records"))
        try:
            frame = read_records(path, ("model_version",) if canary_version else ())
        except Exception as exc:  # an unreadable file is no evidence, never a crash
            raise RecordsError(f"cannot read the load records {path}: {exc}") from None
        versions = frame[["model_version", "start_time"]] if canary_version else None
        traffic = records_traffic(frame, since, canary_version, versions)
        return {"source": "records", "records": path, **traffic}
