"""Run Locust (``locustfiles/llm.py``) as a subprocess from ordinary Python: ``LoadRun``.

Over 400 lines because ``LoadRun`` is one lifecycle (command, start, stop by PID, records).
This module must not import Locust or gevent (gevent and asyncio must not share a process).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from gameday.errors import GamedayError
from gameday.load.generator import (
    LoadCheck,
    LoadTolerances,
    LoadUnchecked,
    env_number,
    load_problems,
)
from gameday.load.records import LOAD_SCHEMA, ORACLE_SCHEMA, recover, remove_parts

DEFAULT_LOCUSTFILE = Path(__file__).resolve().parents[2] / "locustfiles" / "llm.py"
START_TIMEOUT_S = 60.0
# How long a master waits for its worker pods to connect (they start in seconds).
EXTERNAL_WORKERS_WAIT_S = 120.0
STOP_MARGIN_S = 15.0
LOG_TAIL_CHARS = 3000
ENV_EXTRA_ARGS = "GAMEDAY_LOAD_EXTRA_ARGS"
# The load's seed (prompt lengths and texts, their order, user ids, sampling seeds): set by
# ``gameday run`` per run of a campaign (``--repeat``); unset, the load's own default (0).
ENV_LOAD_SEED = "GAMEDAY_LOAD_SEED"
MAX_LOAD_SEED = 2**31 - 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_load_seed(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """``$GAMEDAY_LOAD_SEED`` as an int (None when unset); ValueError naming it if bad."""
    want = (
        f"give a whole number from 0 to {MAX_LOAD_SEED} (the load's seed), or unset it for "
        "the default 0"
    )
    return env_number(environ, ENV_LOAD_SEED, int, 0, MAX_LOAD_SEED, None, want)


def env_extra_args() -> list[str]:
    """The options in ``$GAMEDAY_LOAD_EXTRA_ARGS`` (shell words); ValueError if unparsable.

    Read when the command is built: further gameday.load or Locust options for every run
    this process starts, before ``LoadConfig.extra_args`` (which win) — e.g. a short
    prompt mix for a slow engine (``make chaos-router ENGINE=llamacpp`` sets it).
    """
    text = os.environ.get(ENV_EXTRA_ARGS, "")
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(
            f"{ENV_EXTRA_ARGS}={text!r}: not a list of shell words ({exc}); quote it like "
            f"{ENV_EXTRA_ARGS}='--synthetic-median-tokens 64 --synthetic-max-tokens 256'"
        ) from None


class LoadRunError(GamedayError, RuntimeError):
    """Locust failed; the message ends with the tail of its output."""


class LoadStartError(LoadRunError):
    """Locust exited (or hung) before the test started."""


@dataclass(frozen=True)
class LoadConfig:
    host: str
    output_dir: Path
    users: int = 4
    spawn_rate: float = 4.0
    prompt_mix: str = "synthetic"
    duration_s: float | None = None  # None: run until stop()
    stop_timeout_s: float = 30.0
    processes: int | None = None  # Locust --processes (a master and N workers)
    # Workers that run elsewhere (Locust worker pods): this run is their master, bound to
    # 127.0.0.1:master_port, and starts once that many have connected.
    external_workers: int | None = None
    master_port: int | None = None
    master_bind_host: str = "127.0.0.1"  # where the master listens for its workers
    max_tokens: int | None = None
    api_path: str | None = None
    run_id: str | None = None
    oracle: bool = False
    csv: bool = True
    html: bool = False
    extra_args: Sequence[str] = ()  # any further Locust or gameday.load options
    seed: int | None = None  # the load's seed (None: the load's default, 0); wins over args
    locustfile: Path = DEFAULT_LOCUSTFILE
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.users < 1:
            raise ValueError(f"LoadConfig.users must be >= 1, got {self.users}")
        if self.spawn_rate <= 0:
            raise ValueError(f"LoadConfig.spawn_rate must be > 0, got {self.spawn_rate}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"LoadConfig.duration_s must be > 0 or None, got {self.duration_s}")
        if self.stop_timeout_s < 0:
            raise ValueError(f"LoadConfig.stop_timeout_s must be >= 0, got {self.stop_timeout_s}")
        if self.processes is not None and self.processes < 1:
            raise ValueError(f"LoadConfig.processes must be >= 1, got {self.processes}")
        if self.external_workers is not None:
            if self.processes:
                raise ValueError("LoadConfig: give processes or external_workers, not both")
            if not 1 <= self.external_workers <= 64 or not self.master_port:
                raise ValueError(
                    "LoadConfig.external_workers must be from 1 to 64, with a master_port "
                    f"(got {self.external_workers}, {self.master_port})"
                )
        if self.seed is not None and not 0 <= self.seed <= MAX_LOAD_SEED:
            raise ValueError(f"LoadConfig.seed must be from 0 to {MAX_LOAD_SEED}, got {self.seed}")
        if not Path(self.locustfile).is_file():
            raise ValueError(f"LoadConfig.locustfile {self.locustfile} does not exist")


@dataclass(frozen=True)
class LoadResult:
    exit_code: int
    records_path: Path
    oracle_path: Path | None
    # load-summary.json (``gameday.load.collector``) with ``generator``, its check
    summary: dict[str, object]
    log_tail: str

    @property
    def failed_requests(self) -> bool:
        """Locust exits 1 when any request failed; that is a result, not a crash."""
        return self.exit_code == 1


class LoadRun:
    """One Locust run, started in its own session and stopped by its PID::

        config = LoadConfig(host="http://127.0.0.1:18101", users=8, duration_s=60,
                            output_dir=Path("reports/run-1/router-latency"))
        with LoadRun(config) as run:        # start(): returns once the test has started
            ...                             # inject faults, watch the gate
        result = run.result                 # stop() on exit: SIGTERM, streams finish
        result.records_path                 # Parquet, one row per request

    SIGTERM makes Locust stop its users — streams in flight get ``stop_timeout_s`` to
    end — write the records and exit; if it has not exited ``STOP_MARGIN_S`` after that,
    it and its worker processes (``processes``) get SIGKILL, by PID.

    ``start()`` waits until Locust has started the test (the locustfile writes a ready
    file on test start). If Locust exits first — a bad option, a bad prompt file, a port
    in use — ``LoadStartError`` carries the end of Locust's output, which names the
    problem. The generator is checked by ``gameday.load.generator``.

    Outputs in ``output_dir``: ``records.parquet``, ``oracle.parquet`` (with
    ``oracle=True``), ``load-summary.json`` (requests sent, records written, late trace
    starts, the generator's CPU, wall time and achieved rate), ``locust.log`` (Locust's
    stdout and stderr), ``locust_stats.csv`` & co. (``csv=True``) and ``locust.html``
    (``html=True``).
    """

    def __init__(self, config: LoadConfig) -> None:
        config.validate()
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.records_path = self.output_dir / "records.parquet"
        self.oracle_path: Path | None = (
            self.output_dir / "oracle.parquet" if config.oracle else None
        )
        self.summary_path = self.output_dir / "load-summary.json"
        self.log_path = self.output_dir / "locust.log"
        self.ready_path = self.output_dir / ".locust-ready.json"
        self._popen: subprocess.Popen[bytes] | None = None
        self.result: LoadResult | None = None
        self.master_port: int | None = None

    # --- command -------------------------------------------------------------------
    def command(self) -> list[str]:
        c = self.config
        cmd = [
            self.python_arg(),
            "-m",
            "locust",
            "-f",
            self.locustfile_arg(),
            "--headless",
            "--host",
            c.host,
            "-u",
            str(c.users),
            "-r",
            str(c.spawn_rate),
            "-s",
            f"{c.stop_timeout_s:g}",
            "--prompt-mix",
            c.prompt_mix,
            "--records-out",
            self.path_arg(self.records_path),
            "--summary-out",
            self.path_arg(self.summary_path),
            "--ready-file",
            self.path_arg(self.ready_path),
        ]
        if c.duration_s is not None:
            cmd += ["-t", f"{math.ceil(c.duration_s)}s"]
        if c.processes:
            # Locust's master binds 5557 by default: two runs on one machine would collide
            # (or, worse, one run's workers would join the other's master)
            port = self.master_port = self.master_port or free_port()
            cmd += ["--processes", str(c.processes)]
            cmd += ["--master-bind-port", str(port), "--master-port", str(port)]
        if c.external_workers:
            # Worker pods connect to 127.0.0.1:master_port (host network, loopback only).
            cmd += ["--master", "--expect-workers", str(c.external_workers)]
            cmd += ["--expect-workers-max-wait", f"{EXTERNAL_WORKERS_WAIT_S:g}"]
            bind = c.master_bind_host
            cmd += ["--master-bind-host", bind, "--master-bind-port", str(c.master_port)]
        if c.max_tokens is not None:
            cmd += ["--max-tokens", str(c.max_tokens)]
        if c.api_path:
            cmd += ["--api-path", c.api_path]
        if c.run_id:
            cmd += ["--run-id", c.run_id]
        if c.oracle:
            assert self.oracle_path is not None  # set whenever config.oracle is
            cmd += ["--oracle", "--oracle-out", self.path_arg(self.oracle_path)]
        if c.csv:
            cmd += ["--csv", self.path_arg(self.output_dir / "locust")]
        if c.html:
            cmd += ["--html", self.path_arg(self.output_dir / "locust.html")]
        cmd += env_extra_args()
        cmd += list(c.extra_args)
        if c.seed is not None:  # last: a campaign's per-run seed is never overridden
            cmd += ["--seed", str(c.seed)]
        return cmd

    def python_arg(self) -> str:
        return self.config.python

    def locustfile_arg(self) -> str:
        return str(self.config.locustfile)

    def path_arg(self, path: Path) -> str:
        """How Locust names ``path`` of the output folder (here: the path itself)."""
        return str(path)

    # --- lifecycle -----------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LoadRun:
        if self._popen is not None:
            raise LoadRunError("this LoadRun was already started; make a new one")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for stale in (self.ready_path, self.records_path, self.summary_path):
            stale.unlink(missing_ok=True)
        for records, _ in self._record_files():
            remove_parts(records)  # a killed earlier run's parts are not this run's rows
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.config.env}
        with self.log_path.open("wb") as log:
            self._popen = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # the harness's Ctrl-C must not reach it half-way
            )
        deadline = time.monotonic() + timeout_s
        while not self.ready_path.exists():
            code = self._popen.poll()
            if code is not None:
                raise LoadStartError(
                    f"Locust exited with code {code} before the test started "
                    f"(command: {' '.join(self.command())}).\n"
                    f"Its output ends with:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self._kill()
                raise LoadStartError(
                    f"Locust did not start the test within {timeout_s:g} s; it was killed.\n"
                    f"Its output ends with:\n{self.log_tail()}"
                )
            time.sleep(0.05)
        return self

    def stop(self) -> LoadResult:
        """SIGTERM (by PID): users stop, streams get the stop timeout, records are written."""
        if self._popen is None:
            raise LoadRunError("stop() before start()")
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, signal.SIGTERM)
        try:
            return self.wait(self.config.stop_timeout_s + STOP_MARGIN_S)
        except TimeoutError:
            self._kill()
            recovered = self.recover_records()
            raise LoadRunError(
                f"Locust did not exit within {self.config.stop_timeout_s + STOP_MARGIN_S:g} s "
                f"of SIGTERM and was killed; records may be incomplete"
                + (f" ({recovered})" if recovered else "")
                + f".\n{self.log_tail()}"
            ) from None

    def wait(self, timeout_s: float | None = None) -> LoadResult:
        """Wait for Locust to exit (raises TimeoutError if it is still running then)."""
        if self._popen is None:
            raise LoadRunError("wait() before start()")
        try:
            code = self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"Locust (pid {self._popen.pid}) still running after {timeout_s} s"
            ) from None
        return self._finish(code)

    def _record_files(self) -> list[tuple[Path, Any]]:
        files: list[tuple[Path, Any]] = [(self.records_path, LOAD_SCHEMA)]
        if self.oracle_path is not None:
            files.append((self.oracle_path, ORACLE_SCHEMA))
        return files

    def recover_records(self) -> str:
        """After a Locust that did not close its files (killed): merge the closed parts
        it left into ``records.parquet``/``oracle.parquet``; says what was recovered."""
        notes = []
        for path, schema in self._record_files():
            try:
                found = recover(path, schema)
            except OSError as exc:
                notes.append(f"{path.name}: its parts could not be merged: {exc}")
                continue
            if found is None:
                continue
            rows, parts = found.table.num_rows, len(found.parts)
            note = f"{rows} rows of {path.name} recovered from {parts} part(s)"
            if found.skipped:
                note += f"; unreadable part(s) skipped: {'; '.join(found.skipped)}"
            notes.append(note)
        return "; ".join(notes)

    def _finish(self, code: int) -> LoadResult:
        if self.result is not None:
            return self.result
        tail = self.log_tail()
        recovered = self.recover_records()  # nothing to do after a clean exit
        if code not in (0, 1) or not self.records_path.exists():
            raise LoadRunError(
                f"Locust exited with code {code}"
                + ("" if self.records_path.exists() else f" without writing {self.records_path}")
                + (f" ({recovered}: the last second of rows is lost)" if recovered else "")
                + f".\nIts output ends with:\n{tail}"
            )
        try:
            summary = json.loads(self.summary_path.read_text())
        except (OSError, json.JSONDecodeError):
            summary = {}
        if not isinstance(summary, dict):
            summary = {}
        summary["generator"] = self.check_generator(summary)
        self.result = LoadResult(code, self.records_path, self.oracle_path, summary, tail)
        return self.result

    def check_generator(self, summary: Mapping[str, object]) -> LoadCheck | LoadUnchecked:
        """``load_problems`` for this run, with the tolerances of the environment (a bad
        tolerance is itself a problem: the run cannot say whether the load was valid)."""
        try:
            tolerances = LoadTolerances.from_env({**os.environ, **self.config.env})
        except ValueError as exc:
            return {"valid": False, "problems": [str(exc)]}
        return load_problems(
            summary,
            self.config.users,
            tolerances,
            self.log_tail(chars=1 << 20),
            processes=self.config.processes or self.config.external_workers or 1,
        )

    def _kill(self) -> None:
        """SIGKILL Locust and its worker processes, each by PID."""
        if self._popen is None or self._popen.poll() is not None:
            return
        try:
            import psutil

            children = [p.pid for p in psutil.Process(self._popen.pid).children(recursive=True)]
        except Exception:  # psutil missing or the process just ended
            children = []
        for pid in [self._popen.pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._popen.wait(timeout=10)

    def __enter__(self) -> LoadRun:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._popen is None:
            return
        if exc_type is None:
            self.stop()
        else:  # do not hide the original error behind a stop error
            with contextlib.suppress(LoadRunError):
                self.stop()
