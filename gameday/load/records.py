"""Raw per-request records: their schema and a Parquet writer that loses nothing it got.

This module is plain pyarrow: it must not import Locust or gevent (the harness reads
records from ordinary asyncio processes).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from canary_contract.load import LOAD_COLUMNS as CONTRACT_LOAD_COLUMNS
from canary_contract.load import ORACLE_COLUMNS as CONTRACT_ORACLE_COLUMNS
from canary_contract.load import ColumnType

log = logging.getLogger("gameday.load")

FLUSH_INTERVAL_S = 1.0

_ARROW_TYPES = {
    "string": pa.string(),
    "float64": pa.float64(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
}


def arrow_schema(columns: Iterable[tuple[str, ColumnType]]) -> pa.Schema:
    """The Parquet schema of a column spec of the contract (``canary_contract.load``).

    Schemas are the contract's (``canary_contract.load``, docs/ARCHITECTURE.md §7, column
    order included):

    - load records, one row per request sent: ``LOAD_SCHEMA``;
    - oracle records, one row per pinned pair: ``ORACLE_SCHEMA``.
    """
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in columns])


LOAD_SCHEMA = arrow_schema(CONTRACT_LOAD_COLUMNS)
ORACLE_SCHEMA = arrow_schema(CONTRACT_ORACLE_COLUMNS)

LOAD_COLUMNS = tuple(LOAD_SCHEMA.names)
ORACLE_COLUMNS = tuple(ORACLE_SCHEMA.names)


def rows_to_columns(
    rows: Iterable[Mapping[str, Any]], columns: Iterable[str]
) -> dict[str, list[Any]]:
    """Rows as a column dict (the compact form workers ship to the master)."""
    cols: dict[str, list[Any]] = {c: [] for c in columns}
    for row in rows:
        for c, values in cols.items():
            values.append(row.get(c))
    return cols


def _stem(path: Path) -> str:
    return path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name


def part_path(path: Path, n: int) -> Path:
    """The ``n``-th closed part of ``path``: ``records.part-000001.parquet``."""
    return path.with_name(f"{_stem(path)}.part-{n:06d}.parquet")


def part_paths(path: str | Path) -> list[Path]:
    """The closed parts of ``path`` on disk, in write order."""
    path = Path(path)
    pattern = re.compile(re.escape(_stem(path)) + r"\.part-(\d{6,})\.parquet")
    found = []
    try:
        for entry in path.parent.iterdir():
            m = pattern.fullmatch(entry.name)
            if m:
                found.append((int(m.group(1)), entry))
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def remove_parts(path: str | Path) -> None:
    """Remove the parts (and temporary files) a writer of ``path`` left: stale ones."""
    path = Path(path)
    for p in part_paths(path):
        p.unlink(missing_ok=True)
    try:
        for entry in path.parent.iterdir():
            if entry.name.startswith(f".{_stem(path)}.") and entry.name.endswith(".tmp"):
                entry.unlink(missing_ok=True)
    except OSError:
        pass


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_closed(table: pa.Table, dest: Path, rows_per_group: int | None = None) -> None:
    """Write ``table`` to ``dest`` atomically and durably (temp name, fsync, rename)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    pq.write_table(table, tmp, row_group_size=rows_per_group)
    with tmp.open("rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)


class ParquetSink:
    """Append rows; parts are flushed closed; ``close()`` makes the file appear at ``path``.

    ``ParquetSink`` buffers rows in memory and, every ``rows_per_group`` rows or every
    ``flush_interval_s`` (whichever comes first), writes them as one *closed* Parquet part
    next to ``PATH`` (``records.part-000001.parquet``, ...): written to a temporary name,
    fsynced, renamed, and the folder fsynced. A SIGKILL (of Locust, of a worker's master)
    therefore loses only the rows not yet flushed — at most ``flush_interval_s`` of them —
    never the file. ``close()`` merges the parts into ``PATH`` (again through a temporary name,
    fsynced and renamed) and removes them, so every reader keeps reading one file; an empty run
    still gets a valid file with the schema.
    """

    def __init__(
        self,
        path: str | Path,
        schema: pa.Schema,
        rows_per_group: int = 10_000,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = Path(path)
        self.schema = schema
        self.rows_per_group = rows_per_group
        self.flush_interval_s = flush_interval_s
        self.rows_written = 0
        self.parts: list[Path] = []
        self._buffer: dict[str, list[Any]] = {c: [] for c in schema.names}
        self._buffered = 0
        self._started = False
        self._last_flush = time.monotonic()
        self.closed = False

    def _start(self) -> None:
        if not self._started:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            remove_parts(self.path)  # an earlier run's leftovers are not this run's rows
            self._started = True

    def add(self, row: Mapping[str, Any]) -> None:
        for c, values in self._buffer.items():
            values.append(row.get(c))
        self._buffered += 1
        self._maybe_flush()

    def add_columns(self, cols: Mapping[str, list[Any]]) -> None:
        """Append a column dict (as shipped by a worker); unknown columns are dropped."""
        n = len(next(iter(cols.values()), []))
        for c, values in self._buffer.items():
            got = cols.get(c)
            values.extend(got if got is not None else [None] * n)
        self._buffered += n
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self._buffered >= self.rows_per_group or self.flush_due():
            self.flush()

    def flush_due(self) -> bool:
        """Rows are buffered and the last flush is ``flush_interval_s`` old."""
        return bool(self._buffered and time.monotonic() - self._last_flush >= self.flush_interval_s)

    def flush(self) -> None:
        """Write the buffered rows as one closed, fsynced part."""
        if self.closed:
            raise RuntimeError(f"records file {self.path} is already closed")
        self._last_flush = time.monotonic()
        if not self._buffered:
            return
        self._start()
        table = pa.table(self._buffer, schema=self.schema)
        part = part_path(self.path, len(self.parts) + 1)
        _write_closed(table, part)
        self.parts.append(part)
        self.rows_written += self._buffered
        self._buffer = {c: [] for c in self.schema.names}
        self._buffered = 0

    def close(self) -> Path:
        if self.closed:
            return self.path
        self.flush()
        self._start()
        tables = [pq.read_table(p) for p in self.parts]
        merged = pa.concat_tables(tables) if tables else self.schema.empty_table()
        _write_closed(merged.cast(self.schema), self.path, self.rows_per_group)
        for p in self.parts:
            p.unlink(missing_ok=True)
        self.closed = True
        return self.path


@dataclass
class RecordsRead:
    """What ``read_records_report`` found: the rows and the parts it had to skip."""

    table: pa.Table
    source: str  # "file" | "parts" | "none"
    parts: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "PART: why"


def read_records_report(path: str | Path, schema: pa.Schema | None = None) -> RecordsRead:
    """``path``'s rows, or the merged readable parts a writer that never closed left."""
    path = Path(path)
    if path.exists():
        return RecordsRead(pq.read_table(path), "file")
    parts = part_paths(path)
    if not parts:
        raise FileNotFoundError(f"no records at {path} (and no parts of it)")
    tables, used, skipped = [], [], []
    for p in parts:
        try:
            t = pq.read_table(p)
            if schema is not None:
                t = t.cast(schema)
        except (OSError, pa.ArrowException, ValueError) as exc:
            skipped.append(f"{p.name}: {exc.__class__.__name__}: {str(exc)[:200]}")
            continue
        tables.append(t)
        used.append(p)
    for why in skipped:
        log.warning("gameday.load: records part skipped (unreadable): %s", why)
    if not tables:
        empty = schema.empty_table() if schema is not None else pa.table({})
        return RecordsRead(empty, "none", used, skipped)
    return RecordsRead(pa.concat_tables(tables, promote_options="default"), "parts", used, skipped)


def read_records(path: str | Path) -> pa.Table:
    """``path``'s rows (or its readable parts; unreadable ones are logged and skipped).

    ``read_records(PATH)`` reads ``PATH``, or, when the writer never closed it, merges the
    parts that can be read (an unreadable one is skipped and reported: ``read_records_report``);
    ``recover(PATH)`` turns such parts into ``PATH`` for readers that know only ``PATH``.
    """
    return read_records_report(path).table


def recover(path: str | Path, schema: pa.Schema | None = None) -> RecordsRead | None:
    """Merge the parts a killed writer left into ``path``; None when there is nothing to do.

    The merged parts are removed; unreadable ones stay where they are (and are reported).
    """
    path = Path(path)
    if path.exists() or not part_paths(path):
        return None
    found = read_records_report(path, schema)
    if found.source == "parts":
        table = found.table.cast(schema) if schema is not None else found.table
        _write_closed(table, path)
        for p in found.parts:
            p.unlink(missing_ok=True)
    return found
