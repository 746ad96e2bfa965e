"""Load and oracle records as DataFrames with the columns the report reads.

Must never raise on a bad records file (it says what is wrong in a ``Missing``) and never
give a frame without every column of its schema (absent ones come back all-null).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gameday.load.records import part_paths, read_records_report
from gameday.report.missing import Missing, short

# The columns of the §7 schemas that the report reads, with the dtype it computes in.
LOAD_COLUMNS: dict[str, str] = {
    "start_time": "float64",
    "ttft_s": "float64",
    "e2e_s": "float64",
    "prompt_tokens": "float64",
    "status": "float64",
    "ok": "bool",
    "error_kind": "category",
    "served_by": "category",
    "bucket": "category",
}
ORACLE_COLUMNS: dict[str, str] = {
    "time": "float64",
    "prompt_tokens": "float64",
    "kl_mean": "float64",
    "kl_first": "float64",
    "top1_agree": "float64",
    "bucket": "category",
    "error": "category",
}
# Without these a records file is useless to the report.
LOAD_KEY_COLUMNS = ("start_time", "served_by")
ORACLE_KEY_COLUMNS = ("time", "kl_mean")


def empty_frame(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in columns.items()})


@dataclass(frozen=True)
class _Piece:
    """One records file being read, and how its problems are said (``Missing``)."""

    experiment: str
    piece: str
    columns: dict[str, str]
    key_columns: tuple[str, ...]
    missing: list[Missing]
    required: bool
    effect: str

    def fail(self, problem: str, piece: str | None = None, effect: str | None = None) -> None:
        """A problem that costs what ``effect`` says (and the verdict when required)."""
        self.missing.append(
            Missing(
                self.experiment, piece or self.piece, problem, effect or self.effect, self.required
            )
        )

    def note(self, problem: str, effect: str) -> None:
        """A problem the verdict does not depend on."""
        self.missing.append(Missing(self.experiment, self.piece, problem, effect, False))

    def empty(self) -> pd.DataFrame:
        return empty_frame(self.columns)


def read_parquet(
    path: Path,
    columns: dict[str, str],
    key_columns: tuple[str, ...],
    experiment: str,
    missing: list[Missing],
    required: bool,
    effect: str,
    quiet_when_absent: bool = False,
) -> pd.DataFrame:
    """The file's rows as a DataFrame with exactly ``columns`` (absent ones all-null).

    When the file is absent but a writer that never merged it left closed parts
    (``records.part-000001.parquet``, ...), the readable parts are read
    (``gameday.load.records.read_records_report``) and the missing notes say how many
    rows came from how many parts, and which parts could not be read (their rows are
    lost: that note fails the verdict when the file is required).
    """
    p = _Piece(experiment, path.name, columns, key_columns, missing, required, effect)
    if not path.exists():
        if part_paths(path):
            return _read_parts(path, p)
        if not quiet_when_absent:
            p.fail("absent")
        return p.empty()
    try:
        pfile = pq.ParquetFile(path)
        present = [c for c in columns if c in pfile.schema_arrow.names]
        dictionary = [c for c in present if columns[c] == "category"]
        table = pq.read_table(path, columns=present, read_dictionary=dictionary)
    except (OSError, pa.ArrowException, ValueError) as exc:
        p.fail(f"unreadable ({short(exc)})")
        return p.empty()
    return _frame(table, present, p)


def _read_parts(path: Path, p: _Piece) -> pd.DataFrame:
    try:
        found = read_records_report(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        p.fail(f"unreadable ({short(exc)})")
        return p.empty()
    pattern = f"{path.stem}.part-*.parquet"
    if found.skipped:
        p.fail(
            f"{len(found.skipped)} part(s) unreadable: " + "; ".join(found.skipped),
            piece=pattern,
            effect="the rows in those parts are lost: the records are incomplete",
        )
    if found.source != "parts":
        p.fail(
            f"absent; only {len(found.skipped)} part(s) ({pattern}) exist and none "
            "could be read (the run was interrupted)"
        )
        return p.empty()
    p.note(
        f"absent (the writer never merged it: the run was interrupted); "
        f"{found.table.num_rows} rows read from {len(found.parts)} closed part(s) "
        f"({pattern})",
        "rows not yet flushed when the writer died (its last batch) are not there",
    )
    present = [c for c in p.columns if c in found.table.column_names]
    return _frame(found.table.select(present), present, p)


def _frame(table: pa.Table, present: list[str], p: _Piece) -> pd.DataFrame:
    lacking = [c for c in p.key_columns if c not in present]
    if lacking:
        p.fail(f"lacks the column(s) {lacking}")
        return p.empty()
    if table.num_rows == 0:
        p.fail("has no rows")
        return p.empty()
    other = [c for c in p.columns if c not in present]
    if other:
        p.note(f"lacks the column(s) {other}", "figures that need them stay empty")
    return _normalise(table.to_pandas(), p.columns)


def _normalise(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    n = len(frame)
    out: dict[str, object] = {}  # column -> its values
    for name, dtype in columns.items():
        col = frame.get(name)
        if dtype == "float64":
            out[name] = np.full(n, np.nan) if col is None else pd.to_numeric(col, errors="coerce")
        elif dtype == "bool":
            # A null "ok" is not a success (fail-closed).
            out[name] = (
                np.zeros(n, dtype=bool)
                if col is None
                else col.astype("boolean").fillna(False).astype(bool)
            )
        elif col is None:
            out[name] = pd.Categorical(np.full(n, None, dtype=object))
        else:
            out[name] = (
                col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
            )
    result = pd.DataFrame(out)
    for name, dtype in columns.items():
        if dtype == "float64":
            result[name] = result[name].astype("float64")
    return result
