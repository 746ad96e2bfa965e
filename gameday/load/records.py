"""Raw per-request records: their schema and a Parquet writer that loses nothing it got.

Schemas follow docs/ARCHITECTURE.md §7 exactly (column order included):

- load records, one row per request sent: ``LOAD_SCHEMA``;
- oracle records, one row per pinned pair: ``ORACLE_SCHEMA``.

``ParquetSink`` buffers rows in memory and writes a row group every ``rows_per_group``
rows, into ``PATH.partial``; ``close()`` writes the footer and renames the file to
``PATH``, so a reader never opens a half-written file (a run that died leaves only the
``.partial``). An empty run still gets a valid file with the schema.

This module is plain pyarrow: it must not import Locust or gevent (the harness reads
records from ordinary asyncio processes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

LOAD_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("request_id", pa.string()),
        ("user_id", pa.string()),
        ("start_time", pa.float64()),  # epoch seconds, just before the request was sent
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("itl_mean_s", pa.float64()),
        ("itl_p99_s", pa.float64()),
        ("itl_max_s", pa.float64()),
        ("prompt_tokens", pa.int64()),  # the server's count, from the usage chunk
        ("completion_tokens", pa.int64()),
        ("planned_prompt_tokens", pa.int64()),  # the length the mix asked for
        ("status", pa.int64()),  # HTTP status; 0 when no response arrived
        ("ok", pa.bool_()),
        ("error_kind", pa.string()),  # null or connect|http_status|broken_stream|...
        ("served_by", pa.string()),  # baseline | canary | "" (unknown)
        ("model_version", pa.string()),
        ("config_revision", pa.string()),
        ("router_id", pa.string()),
        ("bucket", pa.string()),
        ("endpoint", pa.string()),
        ("stream", pa.bool_()),
    ]
)

ORACLE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("time", pa.float64()),
        ("request_id", pa.string()),
        ("bucket", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("positions", pa.int64()),
        ("kl_mean", pa.float64()),
        ("kl_first", pa.float64()),
        ("top1_agree", pa.float64()),
        ("baseline_version", pa.string()),
        ("canary_version", pa.string()),
        ("error", pa.string()),
    ]
)

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


class ParquetSink:
    """Append rows; ``close()`` makes the file appear at ``path`` (atomically)."""

    def __init__(self, path: str | Path, schema: pa.Schema, rows_per_group: int = 10_000) -> None:
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + ".partial")
        self.schema = schema
        self.rows_per_group = rows_per_group
        self.rows_written = 0
        self._buffer: dict[str, list[Any]] = {c: [] for c in schema.names}
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self.closed = False

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.partial_path, self.schema)
        return self._writer

    def add(self, row: Mapping[str, Any]) -> None:
        for c, values in self._buffer.items():
            values.append(row.get(c))
        self._buffered += 1
        if self._buffered >= self.rows_per_group:
            self.flush()

    def add_columns(self, cols: Mapping[str, list[Any]]) -> None:
        """Append a column dict (as shipped by a worker); unknown columns are dropped."""
        n = len(next(iter(cols.values()), []))
        for c, values in self._buffer.items():
            got = cols.get(c)
            values.extend(got if got is not None else [None] * n)
        self._buffered += n
        if self._buffered >= self.rows_per_group:
            self.flush()

    def flush(self) -> None:
        if self.closed:
            raise RuntimeError(f"records file {self.path} is already closed")
        if not self._buffered:
            return
        table = pa.table(self._buffer, schema=self.schema)
        self._open().write_table(table)
        self.rows_written += self._buffered
        self._buffer = {c: [] for c in self.schema.names}
        self._buffered = 0

    def close(self) -> Path:
        if self.closed:
            return self.path
        self.flush()
        self._open().close()
        os.replace(self.partial_path, self.path)
        self.closed = True
        return self.path


def read_records(path: str | Path) -> pa.Table:
    return pq.read_table(path)
