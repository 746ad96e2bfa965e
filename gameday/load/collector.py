"""Getting every record of a Locust run into one Parquet file, also with workers."""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

import gevent
from locust.runners import MasterRunner, WorkerRunner

from gameday.atomic import write_text
from gameday.load.records import (
    FLUSH_INTERVAL_S,
    LOAD_COLUMNS,
    LOAD_SCHEMA,
    ORACLE_COLUMNS,
    ORACLE_SCHEMA,
    ParquetSink,
    rows_to_columns,
)
from gameday.load.rows import LoadRow, OracleRow

log = logging.getLogger("gameday.load")

SHIP_INTERVAL_S = 1.0
SHIP_MAX_ROWS = 500
FLUSH_MARGIN_S = 15.0

# This process's CPU over a tick counts once the tick is at least this long (shorter ones
# are noise: one greenlet switch can look like 100 %).
CPU_TICK_MIN_S = 0.4

MSG_RECORDS = "gameday_records"
MSG_FINAL = "gameday_final"
MSG_FLUSH = "gameday_flush"


class LoadCounters(TypedDict):
    """One process's counters (``gameday.load.context.LoadContext.counters``), summed over
    the workers into ``load-summary.json``."""

    requests_sent: int
    records: int
    oracle_pairs: int
    oracle_canary_off: int
    oracle_canary_broken: int
    trace_requests: int
    trace_late_starts: int
    max_trace_lag_s: float
    trace_abandoned: int


class GeneratorUsage(TypedDict):
    """One process's own figures (summed, or maxed for ``max_*``, over the workers)."""

    cpu_s: float
    max_cpu_percent: float
    cpu_warnings: int
    peak_users: int


class GeneratorFigures(TypedDict, total=False):
    """The whole test's figures beside the totals: its wall time and rate (once it
    started), on a master its own CPU and the CPU warnings of all."""

    test_wall_s: float
    achieved_rps: float
    master_cpu_s: float
    max_cpu_percent: float
    cpu_warnings: int


class Collector:
    """Every record of the run into one Parquet file, whatever the process's role.

    Roles, decided by the Locust runner of the process:

    - ``local`` (one process): rows go straight into the ``ParquetSink``.
    - ``worker`` (``--processes N`` children, or ``--worker``): rows are buffered and shipped
      to the master as custom messages (``gameday_records``, a column dict) every
      ``SHIP_INTERVAL_S`` or ``SHIP_MAX_ROWS`` rows. When its test stops — after its users
      finished or were cut by the stop timeout, so every request has its row — a worker ships
      the rest and then ``gameday_final`` with its counters.
    - ``master``: writes what workers ship. Locust's headless master stops *without* waiting
      for its workers' users (``quit`` sends workers "quit" and exits half a second later), so
      when the master's test stops it asks every worker that has not reported final to stop
      and flush (``gameday_flush``), and waits for their ``gameday_final`` — at most the stop
      timeout plus ``FLUSH_MARGIN_S``. ZeroMQ keeps one worker's messages in order, so a
      worker's final arrives after all its rows.

    Files are closed on Locust's ``quit`` event (the very end, after the runner stopped), so
    a row that arrives during the stop timeout is still written. Until then the sinks write
    closed, fsynced parts at least every ``FLUSH_INTERVAL_S`` (a timer here flushes rows that
    arrive in a quiet spell), so a process killed with SIGKILL loses only its last second of
    rows (and a worker the rows it had not shipped); ``gameday.load.records.recover`` merges
    the parts it left.

    The summary also says how well the generator itself kept up (issue #14, item 6), so a
    starved generator is never taken for a slow or a quiet stack: per process the CPU it used
    over the test (``cpu_s``, and ``max_cpu_percent``, the highest of Locust's own CPU samples
    and of this process's CPU over each tick), whether Locust warned "CPU usage above 90%"
    (``cpu_warnings``), the most users it ran (``peak_users``), and for the whole test its wall
    time (``test_wall_s``) and the achieved request rate (``achieved_rps``).
    ``gameday.load.generator.load_problems`` judges them.
    """

    def __init__(self, environment: Any, counters: Callable[[], LoadCounters]) -> None:
        self.environment = environment
        self.runner = environment.runner
        self.counters = counters  # this process's counters, shipped with the final message
        if isinstance(self.runner, WorkerRunner):
            self.role = "worker"
        elif isinstance(self.runner, MasterRunner):
            self.role = "master"
        else:
            self.role = "local"
        self.records_out = ""
        self.oracle_out = ""
        self.summary_out = ""
        self.sinks: dict[str, ParquetSink] = {}
        self._pending: dict[str, list[LoadRow | OracleRow]] = {"load": [], "oracle": []}
        self._shipper: gevent.Greenlet | None = None
        self._flusher: gevent.Greenlet | None = None
        self.finals: dict[str, Mapping[str, object]] = {}  # each worker's last counters
        self.records_by_worker: dict[str, int] = {}  # master: load rows each worker shipped
        self.summary: dict[str, object] = {}
        self._test_start_wall: float | None = None
        self._test_stop_wall: float | None = None
        self._cpu_start_s = 0.0
        self._tick: tuple[float, float] | None = None  # (monotonic, cpu) of the last sample
        self._max_cpu_percent = 0.0
        self._peak_users = 0
        self._register()

    # --- set-up -------------------------------------------------------------------
    def _register(self) -> None:
        if self.role == "master":
            self.runner.register_message(MSG_RECORDS, self._on_records)
            self.runner.register_message(MSG_FINAL, self._on_final)
        elif self.role == "worker":
            self.runner.register_message(MSG_FLUSH, self._on_flush, concurrent=True)

    def configure(self, records_out: str, oracle_out: str, summary_out: str) -> None:
        self.records_out, self.oracle_out, self.summary_out = records_out, oracle_out, summary_out

    def _sink(self, kind: str) -> ParquetSink | None:
        sink = self.sinks.get(kind)
        if sink is None:
            path = self.records_out if kind == "load" else self.oracle_out
            if not path:
                return None
            schema = LOAD_SCHEMA if kind == "load" else ORACLE_SCHEMA
            sink = self.sinks[kind] = ParquetSink(path, schema)
        return sink

    # --- rows ---------------------------------------------------------------------
    def add(self, kind: str, row: LoadRow | OracleRow) -> None:
        if self.role == "worker":
            self._pending[kind].append(row)
            if len(self._pending[kind]) >= SHIP_MAX_ROWS:
                self.ship()
            return
        sink = self._sink(kind)
        if sink is not None:
            sink.add(row)

    def ship(self) -> None:
        """Worker: send the buffered rows to the master."""
        for kind, rows in self._pending.items():
            if not rows:
                continue
            self._pending[kind] = []
            columns = LOAD_COLUMNS if kind == "load" else ORACLE_COLUMNS
            self.runner.send_message(
                MSG_RECORDS, {"kind": kind, "cols": rows_to_columns(rows, columns)}
            )

    def _ship_loop(self) -> None:
        while True:
            gevent.sleep(SHIP_INTERVAL_S)
            self.sample_usage()
            self.ship()

    def _flush_loop(self) -> None:
        """Local/master: rows never wait in memory longer than ``FLUSH_INTERVAL_S``."""
        while True:
            gevent.sleep(FLUSH_INTERVAL_S / 2)
            self.sample_usage()
            for sink in list(self.sinks.values()):
                if not sink.closed and sink.flush_due():
                    sink.flush()

    # --- how the generator itself is doing ------------------------------------------
    @staticmethod
    def _cpu_now() -> float:
        """CPU seconds (user + system) of this process, all its threads."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return float(usage.ru_utime + usage.ru_stime)

    def sample_usage(self) -> None:
        """One tick: the process's CPU since the last tick, Locust's own CPU sample, users."""
        now, cpu = time.monotonic(), self._cpu_now()
        if self._tick is not None and now - self._tick[0] >= CPU_TICK_MIN_S:
            percent = 100.0 * (cpu - self._tick[1]) / (now - self._tick[0])
            self._max_cpu_percent = max(self._max_cpu_percent, percent)
            self._tick = (now, cpu)
        elif self._tick is None:
            self._tick = (now, cpu)
        locust_percent = getattr(self.runner, "current_cpu_usage", 0.0)
        if isinstance(locust_percent, int | float):
            self._max_cpu_percent = max(self._max_cpu_percent, float(locust_percent))
        users = getattr(self.runner, "user_count", 0)
        if isinstance(users, int):
            self._peak_users = max(self._peak_users, users)

    def usage(self) -> GeneratorUsage:
        """This process's generator figures (summed or maxed over workers by ``totals``)."""
        warned = bool(getattr(self.runner, "cpu_warning_emitted", False))
        return {
            "cpu_s": round(self._cpu_now() - self._cpu_start_s, 3),
            "max_cpu_percent": round(self._max_cpu_percent, 1),
            "cpu_warnings": int(warned),
            "peak_users": self._peak_users,
        }

    # --- test lifecycle -------------------------------------------------------------
    def on_test_start(self) -> None:
        self.finals = {}
        self.records_by_worker = {}
        self._test_start_wall, self._test_stop_wall = time.time(), None
        self._cpu_start_s = self._cpu_now()
        self._tick, self._max_cpu_percent, self._peak_users = None, 0.0, 0
        self.sample_usage()
        if self.role == "worker" and (self._shipper is None or self._shipper.dead):
            self._shipper = gevent.spawn(self._ship_loop)
        if self.role != "worker" and (self._flusher is None or self._flusher.dead):
            self._flusher = gevent.spawn(self._flush_loop)

    def on_test_stop(self) -> None:
        self._test_stop_wall = time.time()
        self.sample_usage()
        if self.role == "worker":
            self._send_final()
            return
        if self.role == "master":
            self._wait_for_workers()
        for sink in self.sinks.values():
            sink.flush()
        self._write_summary()

    def _send_final(self) -> None:
        if self._shipper is not None:
            self._shipper.kill(block=False)
            self._shipper = None
        self.ship()
        self.runner.send_message(MSG_FINAL, {"pid": os.getpid(), **self.counters(), **self.usage()})

    def _on_flush(self, environment: Any, msg: Any) -> None:
        # stop() fires test_stop (and so _send_final) unless the test had stopped already
        was_stopped = self.runner.state == "stopped"
        self.runner.stop()
        if was_stopped:
            self._send_final()

    def _on_records(self, environment: Any, msg: Any) -> None:
        data = msg.data
        sink = self._sink(data["kind"])
        if sink is not None:
            sink.add_columns(data["cols"])
        if data["kind"] == "load":  # every worker's records, counted by who shipped them
            cols = data["cols"]
            n = len(next(iter(cols.values()), [])) if isinstance(cols, dict) and cols else 0
            self.records_by_worker[msg.node_id] = self.records_by_worker.get(msg.node_id, 0) + n

    def _on_final(self, environment: Any, msg: Any) -> None:
        self.finals[msg.node_id] = dict(msg.data)

    def _wait_for_workers(self) -> None:
        workers = {c.id for c in self.runner.clients.all}
        pending = workers - set(self.finals)
        for client_id in pending:
            self.runner.send_message(MSG_FLUSH, None, client_id=client_id)
        deadline = time.monotonic() + (self.environment.stop_timeout or 0) + FLUSH_MARGIN_S
        while pending - set(self.finals) and time.monotonic() < deadline:
            gevent.sleep(0.05)
        missing = pending - set(self.finals)
        if missing:
            log.error(
                "gameday.load: %d worker(s) did not send their last records within the stop "
                "timeout + %.0f s; their records are incomplete: %s",
                len(missing),
                FLUSH_MARGIN_S,
                ", ".join(sorted(missing)),
            )

    def totals(self) -> dict[str, float]:
        parts: list[Mapping[str, object]] = (
            list(self.finals.values())
            if self.role == "master"
            else [{**self.counters(), **self.usage()}]
        )
        total: dict[str, float] = {}
        for part in parts:
            for k, v in part.items():
                if k == "pid":
                    continue
                if k.startswith("max_"):
                    # a number in every part (LoadCounters, GeneratorUsage); anything else
                    # raises here, as it always has
                    total[k] = max(total.get(k, 0.0), cast(float, v))
                elif isinstance(v, int | float):
                    total[k] = total.get(k, 0) + v
        return total

    def generator(self, totals: dict[str, float]) -> GeneratorFigures:
        """The test's wall time and achieved rate; on a master, its own CPU beside the
        workers' and whether it saw a worker warn about CPU."""
        out: GeneratorFigures = {}
        if self._test_start_wall is not None:
            end = self._test_stop_wall or time.time()
            wall = max(0.0, end - self._test_start_wall)
            out["test_wall_s"] = round(wall, 3)
            sent = totals.get("requests_sent")
            if isinstance(sent, int | float) and wall > 0:
                out["achieved_rps"] = round(sent / wall, 3)
        if self.role == "master":
            mine = self.usage()
            out["master_cpu_s"] = mine["cpu_s"]
            out["max_cpu_percent"] = max(
                float(totals.get("max_cpu_percent", 0.0)), mine["max_cpu_percent"]
            )
            warned = bool(getattr(self.runner, "worker_cpu_warning_emitted", False))
            out["cpu_warnings"] = int(totals.get("cpu_warnings", 0)) + mine["cpu_warnings"] + warned
        return out

    def _write_summary(self) -> None:
        totals = self.totals()
        self.summary = {
            **totals,
            **self.generator(totals),
            "workers_reported": len(self.finals) if self.role == "master" else 1,
            "records_by_worker": dict(self.records_by_worker) if self.role == "master" else {},
            "records_written": {k: s.rows_written for k, s in self.sinks.items()},
            "records_out": self.records_out or None,
            "oracle_out": self.oracle_out or None,
        }
        if self.summary_out:
            write_text(Path(self.summary_out), json.dumps(self.summary, indent=2, sort_keys=True))

    def close(self) -> None:
        if self.role == "worker":
            return
        if self._flusher is not None:
            self._flusher.kill(block=False)
            self._flusher = None
        for sink in self.sinks.values():
            sink.close()
        # a run that produced no rows still leaves files with the schema
        for kind, path in (("load", self.records_out), ("oracle", self.oracle_out)):
            if path and kind not in self.sinks:
                ParquetSink(path, LOAD_SCHEMA if kind == "load" else ORACLE_SCHEMA).close()
