"""The load harness's state in one Locust process, and its event wiring."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from locust.stats import CSV_STATS_INTERVAL_SEC

from gameday.load.collector import Collector, LoadCounters
from gameday.load.options import LoadOptions, OptionsError, add_arguments, new_run_id
from gameday.load.pacing import Slot, TraceSchedule
from gameday.load.prompt_files import JsonlMix
from gameday.load.prompts import (
    MixSpecError,
    PromptFileError,
    PromptRequest,
    SyntheticMix,
    TraceMix,
    parse_mix,
)

log = logging.getLogger("gameday.load")

TRACE_START_DELAY_S = 0.5  # users spawn before the first trace request is due
LATE_WARNING_INTERVAL_S = 5.0
ORACLE_INDEX_OFFSET = 1 << 40
MSG_TRACE_DONE = "gameday_trace_done"  # oracle prompts never repeat a load user's prompt

_contexts: weakref.WeakKeyDictionary[Any, LoadContext] = weakref.WeakKeyDictionary()


def context_for(environment: Any) -> LoadContext:
    ctx = _contexts.get(environment)
    if ctx is None:
        raise RuntimeError(
            "gameday.load is not installed in this Locust process: the locustfile must call "
            "gameday.load.install(locust.events, oracle_user=..., shape=...), like "
            "locustfiles/llm.py does"
        )
    return ctx


class LoadContext:
    """``LoadContext`` (one per Locust environment, found with ``context_for``) is what the
    users read: options, the mix, the next closed-loop request, the next trace slot, and the
    counters (requests sent, records, late starts).
    """

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.options: LoadOptions | None = None
        self.mix: SyntheticMix | JsonlMix | TraceMix | None = None
        self._mix_key: tuple[str, Any] | None = None
        self.schedule: TraceSchedule | None = None
        self.stopping = gevent.event.Event()
        self.worker_index = 0
        self.worker_count = 1
        self._closed_loop_next = 0
        self._oracle_next = 0
        self.requests_sent = 0
        self.records = 0
        self.oracle_pairs = 0
        self.oracle_canary_off = 0  # pins the router refused: the canary is off
        self.oracle_canary_broken = 0  # pairs whose canary answer counted as maximal drift
        self.stop_requested = False  # SIGTERM: the shape ends the test at its next tick
        self.trace_done_nodes: set[str] = set()
        self._trace_done_sent = False
        self._last_late_warning = 0.0
        self.collector = Collector(environment, self.counters)

    # --- options and mix -------------------------------------------------------------
    def load(self) -> LoadOptions:
        """Read and validate the options and (re)load the mix if its inputs changed."""
        opts = LoadOptions.from_namespace(self.environment.parsed_options, self.environment.host)
        key = (opts.prompt_mix, opts.mix)
        if self.mix is None or key != self._mix_key:
            self.mix = parse_mix(opts.prompt_mix, opts.mix)
            self._mix_key = key
        self.options = opts
        self.collector.configure(
            opts.records_out, opts.oracle_out if opts.oracle else "", opts.summary_out
        )
        return opts

    def counters(self) -> LoadCounters:
        s = self.schedule
        return {
            "requests_sent": self.requests_sent,
            "records": self.records,
            "oracle_pairs": self.oracle_pairs,
            "oracle_canary_off": self.oracle_canary_off,
            "oracle_canary_broken": self.oracle_canary_broken,
            "trace_requests": len(s) if s else 0,
            "trace_late_starts": s.late if s else 0,
            "max_trace_lag_s": round(s.max_lag_s, 4) if s else 0.0,
            "trace_abandoned": s.abandoned if s else 0,
        }

    # --- what users ask for -------------------------------------------------------
    @property
    def open_loop(self) -> bool:
        return bool(self.mix is not None and self.mix.open_loop)

    def next_closed_loop(self) -> PromptRequest:
        assert self.mix is not None
        i = self._closed_loop_next * self.worker_count + self.worker_index
        self._closed_loop_next += 1
        if isinstance(self.mix, TraceMix):
            i %= len(self.mix)
        return self.mix.request(i)

    def next_oracle(self) -> PromptRequest:
        assert self.mix is not None
        i = self._oracle_next * self.worker_count + self.worker_index
        self._oracle_next += 1
        if isinstance(self.mix, SyntheticMix):
            i += ORACLE_INDEX_OFFSET
        else:
            i %= len(self.mix)
        return self.mix.request(i)

    def next_slot(self) -> tuple[Slot, PromptRequest] | None:
        assert self.schedule is not None and self.mix is not None
        slot = self.schedule.take()
        if slot is None:
            return None
        return slot, self.mix.request(slot.index)

    def wait_until(self, due: float) -> bool:
        """Sleep until ``due`` (monotonic); False when the test began stopping first."""
        delay = due - time.monotonic()
        if delay > 0:
            self.stopping.wait(delay)
        return not self.stopping.is_set()

    def note_abandoned(self, slot: Slot) -> None:
        assert self.schedule is not None
        self.schedule.abandon(slot)
        self._check_trace_done()

    def note_started(self, slot: Slot) -> None:
        assert self.schedule is not None
        lag = self.schedule.mark_started(slot)
        self._check_trace_done()
        if lag > self.schedule.late_tolerance_s:
            now = time.monotonic()
            if now - self._last_late_warning >= LATE_WARNING_INTERVAL_S:
                self._last_late_warning = now
                log.warning(
                    "gameday.load: trace replay is behind: %d of %d requests started more than "
                    "%.2f s late (worst %.2f s). Add users (-u) or slow the trace down "
                    "(a larger --trace-time-scale).",
                    self.schedule.late,
                    self.schedule.started,
                    self.schedule.late_tolerance_s,
                    self.schedule.max_lag_s,
                )

    def _check_trace_done(self) -> None:
        """Tell the master (once) that this worker has started all its trace requests."""
        if self.schedule is None or self._trace_done_sent or not self.schedule.finished:
            return
        self._trace_done_sent = True
        if self.collector.role == "worker":
            self.environment.runner.send_message(MSG_TRACE_DONE, None)

    def _on_trace_done(self, environment: Any, msg: Any) -> None:
        self.trace_done_nodes.add(str(msg.node_id))

    def trace_finished(self) -> bool:
        """All trace requests started, in this process or (master) in every worker."""
        if self.collector.role == "master":
            workers = self.environment.runner.worker_count
            return bool(workers > 0 and len(self.trace_done_nodes) >= workers)
        return self.schedule is not None and self.schedule.finished

    # --- lifecycle -----------------------------------------------------------------
    def on_init(self) -> None:
        if self.collector.role == "master":
            self.environment.runner.register_message(MSG_TRACE_DONE, self._on_trace_done)
        ns = self.environment.parsed_options
        if ns is None or self.collector.role == "worker":
            return  # a worker learns its options from the master at test start
        if not ns.run_id:
            ns.run_id = new_run_id()  # forwarded to workers with the other options
        try:
            opts = self.load()
        except (OptionsError, PromptFileError, MixSpecError, ValueError) as exc:
            sys.stderr.write(f"gameday.load: error: {exc}\n")
            sys.stderr.flush()
            sys.exit(2)
        if opts.shape == "trace" and self.environment.shape_class is None:
            log.warning("gameday.load: --shape trace has no effect without the GamedayShape class")

    def on_test_start(self) -> None:
        self.stopping.clear()
        try:
            opts = self.load()
        except (OptionsError, PromptFileError, MixSpecError, ValueError) as exc:
            log.error("gameday.load: error: %s", exc)
            raise
        runner = self.environment.runner
        if self.collector.role != "worker":
            # one trace clock for all processes: Locust forwards the master's options with
            # the spawn message, which it sends right after this event
            self.environment.parsed_options.gameday_trace_t0 = time.time() + TRACE_START_DELAY_S
        if self.collector.role == "worker":
            self.worker_count = max(
                1, int(getattr(self.environment.parsed_options, "expect_workers", 1) or 1)
            )
            self.worker_index = max(0, int(getattr(runner, "worker_index", 0)))
            if self.worker_index >= self.worker_count:
                log.warning(
                    "gameday.load: worker index %d but only %d workers expected; this worker "
                    "replays the trace share of index %d",
                    self.worker_index,
                    self.worker_count,
                    self.worker_index % self.worker_count,
                )
                self.worker_index %= self.worker_count
        if isinstance(self.mix, TraceMix) and self.collector.role != "master":
            self.schedule = TraceSchedule(
                self.mix.offsets_s,
                opts.trace_time_scale,
                self.worker_index,
                self.worker_count,
                opts.trace_late_tolerance_s,
            )
            self.schedule.start(time.monotonic() + (self._trace_t0_epoch() - time.time()))
            self._trace_done_sent = False
            self._check_trace_done()  # a worker whose share is empty is done at once
        self.trace_done_nodes = set()
        self.collector.on_test_start()
        if opts.ready_file and self.collector.role != "worker":
            path = Path(opts.ready_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps({"pid": os.getpid(), "run_id": opts.run_id, "time": time.time()})
            )

    def _trace_t0_epoch(self) -> float:
        t0 = getattr(self.environment.parsed_options, "gameday_trace_t0", None)
        return float(t0) if t0 else time.time() + TRACE_START_DELAY_S

    def on_sigterm(self) -> None:
        log.info("gameday.load: got SIGTERM; stopping (streams in flight get the stop timeout)")
        self.stop_requested = True

    def on_test_stopping(self) -> None:
        self.stopping.set()

    def on_test_stop(self) -> None:
        self.collector.on_test_stop()
        if self.collector.role != "worker":
            s = self.collector.summary
            written = s.get("records_written")  # the collector's dict, per kind of row
            log.info(
                "gameday.load: %s requests sent, %s records written%s",
                s.get("requests_sent", 0),
                written.get("load", 0) if isinstance(written, dict) else 0,
                f", {s['trace_late_starts']} trace requests started late"
                if s.get("trace_late_starts")
                else "",
            )

    def on_quit(self) -> None:
        self.collector.close()
        prefix = getattr(self.environment.parsed_options, "csv_prefix", None)
        if self.collector.role != "worker" and prefix:
            _await_csv_rewrite(Path(f"{prefix}_stats.csv"))


def _await_csv_rewrite(path: Path) -> None:
    """Let Locust's CSV writer write once more after the test stopped.

    Locust rewrites its CSV files every CSV_STATS_INTERVAL_SEC and closes them at exit
    without a last write, so requests that ended during the stop timeout would be missing
    from ``--csv``. Waiting for the next rewrite (not a fixed sleep: returning right after
    it leaves a whole interval before the writer wakes again, so it never writes into a
    closed file) makes the CSV agree with the records.
    """
    try:
        before = path.stat().st_mtime_ns
    except OSError:
        return
    deadline = time.monotonic() + CSV_STATS_INTERVAL_SEC + 0.5
    while time.monotonic() < deadline:
        gevent.sleep(0.02)
        try:
            if path.stat().st_mtime_ns != before:
                return
        except OSError:
            return


def _enable_oracle(environment: Any, role: str, oracle_user: type) -> None:
    """Oracle users run only with --oracle: drop the class otherwise, else fix its count.

    Only the master (or single process) drops it: it alone decides which users run, and a
    worker must still know the class if its master dispatches it.
    """
    ns = environment.parsed_options
    classes = environment.user_classes
    wanted = bool(ns is not None and getattr(ns, "oracle", False))
    if wanted:
        for cls in classes:
            if issubclass(cls, oracle_user):
                cls.fixed_count = int(getattr(ns, "oracle_users", 1))
    elif role != "worker":
        classes[:] = [c for c in classes if not issubclass(c, oracle_user)]


def _handle_sigterm(ctx: LoadContext, shape: type) -> None:
    """Stop cleanly on SIGTERM while a headless shape test runs.

    Locust installs its own SIGTERM handler only after a headless shape test has ended
    (``main`` blocks on the shape until then), so until that point SIGTERM would kill the
    process without stopping users or writing records. This handler asks the shape to end
    the test at its next tick (within a second); Locust then stops users with the stop
    timeout, fires test_stop and quits as after ``-t``. Locust's own handler replaces this
    one once it is installed.
    """
    if ctx.collector.role == "worker" or not isinstance(ctx.environment.shape_class, shape):
        return
    gevent.signal_handler(signal.SIGTERM, ctx.on_sigterm)


def install(events: Any, *, oracle_user: type, shape: type) -> None:
    """Wire the load harness into Locust's events (call once, from the locustfile).

    ``oracle_user`` is the oracle's user class (dropped unless ``--oracle``), ``shape``
    the load shape class whose runs stop cleanly on SIGTERM.

    ``install(events, oracle_user=..., shape=...)`` (called by ``locustfiles/llm.py``, never
    at import, with the user and shape classes: this module does not import them, they import
    it) hooks:

    - ``init_command_line_parser``: the gameday options (``gameday.load.options``);
    - ``init``: validate the options and load the prompt mix on the master / single process,
      so a bad option or file stops Locust before any request with a message naming the
      input (exit code 2); make up a run id; decide which oracle users run;
    - ``test_start``: (re)read the options — a worker only gets them from its master now —
      set up the trace schedule and this process's share of it, write the ready file;
    - ``test_stopping``: wake users that wait for a trace slot so that nothing new starts;
    - ``test_stop``: ship or write the records, wait for workers (``gameday.load.collector``);
    - ``quit``: close the Parquet files.
    """

    def _parser(parser: Any, **_kw: Any) -> None:
        add_arguments(parser)

    def _init(environment: Any, **_kw: Any) -> None:
        ctx = _contexts[environment] = LoadContext(environment)
        _enable_oracle(environment, ctx.collector.role, oracle_user)
        ctx.on_init()
        _handle_sigterm(ctx, shape)

        def _quit(**_kw: Any) -> None:
            ctx.on_quit()

        events.quit.add_listener(_quit)

    def _start(environment: Any, **_kw: Any) -> None:
        context_for(environment).on_test_start()

    def _stopping(environment: Any, **_kw: Any) -> None:
        context_for(environment).on_test_stopping()

    def _stop(environment: Any, **_kw: Any) -> None:
        context_for(environment).on_test_stop()

    # Locust's EventHook.add_listener, called (not as a decorator: Locust's is untyped).
    events.init_command_line_parser.add_listener(_parser)
    events.init.add_listener(_init)
    events.test_start.add_listener(_start)
    events.test_stopping.add_listener(_stopping)
    events.test_stop.add_listener(_stop)
