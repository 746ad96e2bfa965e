"""Load records survive a SIGKILL (#12 item 9): all but the last unflushed batch.

The writer (``ParquetSink``, as Locust's collector drives it) runs in a real subprocess
that is SIGKILLed mid-run; what it had flushed must be readable, in order, with no gap.
Then a real Locust (through ``LoadRun``) against a real model server is SIGKILLed: the
runner merges the closed parts into ``records.parquet``, every row a served request.
Before, the sink wrote one ``.partial`` Parquet file whose footer only ``close()`` wrote:
a SIGKILL lost every record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gameday.load.records import (
    LOAD_COLUMNS,
    LOAD_SCHEMA,
    ParquetSink,
    part_paths,
    read_records,
    read_records_report,
    recover,
)
from gameday.load.runner import LoadConfig, LoadRun, LoadRunError
from tests.procs import Spawner, wait_for

ROWS_PER_GROUP = 50

WRITER = f"""
import sys, time
from gameday.load.records import LOAD_COLUMNS, LOAD_SCHEMA, ParquetSink
sink = ParquetSink(sys.argv[1], LOAD_SCHEMA, rows_per_group={ROWS_PER_GROUP},
                   flush_interval_s=0.2)
row = dict.fromkeys(LOAD_COLUMNS)
row.update(run_id="r", ok=True, status=200, stream=True, served_by="baseline")
i = 0
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    before = sink.rows_written
    sink.add({{**row, "request_id": str(i), "start_time": float(i)}})
    i += 1
    if sink.rows_written != before:
        print("written", sink.rows_written, flush=True)
    time.sleep(0.001)
"""


def row(i: int) -> dict[str, object]:
    r = dict.fromkeys(LOAD_COLUMNS)
    r.update(run_id="r", request_id=str(i), ok=True, status=200, stream=True, served_by="")
    return r


def test_a_sigkilled_writer_loses_only_its_last_unflushed_batch(tmp_path: Path) -> None:
    path = tmp_path / "records.parquet"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        reported = 0
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while reported < 4 * ROWS_PER_GROUP and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            reported = int(line.split()[1])
        assert reported >= 4 * ROWS_PER_GROUP, "the writer did not flush"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert not path.exists()  # never closed
    found = read_records_report(path)
    assert found.source == "parts" and found.skipped == []
    ids = [int(x) for x in found.table.column("request_id").to_pylist()]
    # every row it reported flushed (and possibly a flush after the last report), in order
    assert len(ids) >= reported and ids == list(range(len(ids)))
    # recover() gives readers that only know records.parquet the same rows, in one file
    recovered = recover(path, LOAD_SCHEMA)
    assert recovered is not None and path.exists() and part_paths(path) == []
    table = pq.read_table(path)
    assert table.schema.equals(LOAD_SCHEMA) and table.num_rows == len(ids)


def test_an_unreadable_last_part_is_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "records.parquet"
    sink = ParquetSink(path, LOAD_SCHEMA, rows_per_group=10, flush_interval_s=3600)
    for i in range(30):
        sink.add(row(i))
    parts = part_paths(path)
    assert len(parts) == 3
    parts[-1].write_bytes(parts[-1].read_bytes()[:40])  # a torn last part
    found = read_records_report(path)
    assert found.table.num_rows == 20 and len(found.skipped) == 1
    assert found.skipped[0].startswith("records.part-000003.parquet: ")
    assert read_records(path).num_rows == 20


def test_close_merges_parts_into_one_file_and_a_new_sink_drops_stale_parts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "records.parquet"
    stale = ParquetSink(path, LOAD_SCHEMA, rows_per_group=5, flush_interval_s=3600)
    for i in range(5):
        stale.add(row(100 + i))
    assert len(part_paths(path)) == 1  # an earlier, killed run's part
    sink = ParquetSink(path, LOAD_SCHEMA, rows_per_group=4, flush_interval_s=3600)
    for i in range(10):
        sink.add(row(i))
    sink.close()
    table = pq.read_table(path)
    assert table.column("request_id").to_pylist() == [str(i) for i in range(10)]
    assert part_paths(path) == [] and sink.rows_written == 10


def test_rows_are_flushed_by_time_too(tmp_path: Path) -> None:
    path = tmp_path / "records.parquet"
    sink = ParquetSink(path, LOAD_SCHEMA, rows_per_group=10_000, flush_interval_s=0.0)
    sink.add(row(0))  # far below rows_per_group, but the interval has passed
    assert sink.rows_written == 1 and len(part_paths(path)) == 1
    with pytest.raises(FileNotFoundError, match="no records at"):
        read_records_report(tmp_path / "other.parquet")


def test_a_sigkilled_locust_leaves_readable_records_of_real_requests(
    spawn: Spawner, tmp_path: Path
) -> None:
    model = spawn("canarystack.model", "--version", "v1")
    out = tmp_path / "run"
    config = LoadConfig(host=model.url, output_dir=out, users=2, duration_s=120, max_tokens=4)
    run = LoadRun(config).start()
    records = run.records_path
    try:
        wait_for(lambda: len(part_paths(records)) >= 2, timeout=60, what="two closed parts")
        seen_before = read_records_report(records).table.num_rows
        assert run.pid is not None and not records.exists()  # not closed yet
        os.kill(run.pid, signal.SIGKILL)  # as the OOM killer or a lost node would
        with pytest.raises(LoadRunError, match=r"exited with code -9 \((\d+) rows of records"):
            run.wait(timeout_s=10)
    finally:
        if run.running and run.pid is not None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout_s=10)
    # the runner merged the closed parts into records.parquet for every reader
    assert part_paths(records) == []
    table = pq.read_table(records)
    ids = table.column("request_id").to_pylist()
    assert table.num_rows >= seen_before > 0 and len(set(ids)) == len(ids)

    # every recovered record is a request the model server really answered
    def served() -> set[str]:
        return {
            str(e["request_id"]) for e in model.log_events() if e.get("event") == "request_done"
        }

    wait_for(lambda: set(ids) <= served(), timeout=10, what="the server's log of every record")
