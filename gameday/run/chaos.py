"""Run one experiment with ``chaos run`` in a subprocess, and stop it properly.

This module never signals anything but the chaos process it started.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

CHAOS = [sys.executable, "-m", "chaostoolkit"]
# Runs a command with SIGINT back at its default. A shell that starts a job in the
# background without job control (``cmd &`` in a script, many CI runners, ``nohup``) makes
# it ignore SIGINT, an ignored signal stays ignored across exec, and Python then installs
# no KeyboardInterrupt handler: chaos would never see ``interrupt()``, would be SIGKILLed
# after the grace, and its rollbacks would not run.
DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r"^\[(?P<time>[^\]]*?) (?P<level>[A-Z]+)\] (?P<message>.*)$")
DEFAULT_GRACE_S = 60.0

LineCallback = Callable[[str, str], None]  # (level, message)


@dataclass
class ChaosResult:
    exit_code: int | None  # None: killed by gameday run
    duration_s: float
    interrupted: bool
    timed_out: bool


def chaos_command(experiment: Path, folder: Path) -> list[str]:
    """The ``chaos run`` command line for ``experiment`` with its files in ``folder``.

    ``chaos --no-version-check --log-file DIR/chaos.log run --journal-path DIR/journal.json
    --rollback-strategy always EXPERIMENT`` runs in its own session (so a Ctrl-C on the
    terminal reaches ``gameday run`` only, which decides), with the run's environment
    (``GAMEDAY_TARGET``, ``GAMEDAY_RUN_DIR``). Its console lines go to
    ``DIR/chaos-console.log`` and, as they arrive, to a callback (the progress display).
    """
    return [
        *CHAOS,
        "--no-version-check",
        "--log-file",
        str(folder / "chaos.log"),
        "run",
        "--journal-path",
        str(folder / "journal.json"),
        "--rollback-strategy",
        "always",
        str(experiment),
    ]


class ChaosRun:
    """One ``chaos run`` process: start, follow, interrupt, wait.

    Stopping (``interrupt()``): SIGINT to chaos's PID — Chaos Toolkit turns it into an
    interrupted experiment, plays the rollbacks (strategy ``always``) and the controls' end
    hooks (Locust stops) — then SIGKILL by PID if it has not exited within the grace period.
    """

    def __init__(
        self,
        experiment: Path,
        folder: Path,
        env: Mapping[str, str],
        on_line: LineCallback | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.experiment = experiment
        self.folder = folder
        self.env = dict(env)
        self.on_line = on_line
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._started = 0.0
        self.interrupted = False
        self.timed_out = False

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> ChaosRun:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._started = time.monotonic()
        cmd = chaos_command(self.experiment, self.folder)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # inherited by chaos
            cmd = [*DEFAULT_SIGINT, *cmd]
        self._popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name="chaos-output", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        with (self.folder / "chaos-console.log").open("wb") as log:
            for raw in iter(self._popen.stdout.readline, b""):
                log.write(raw)
                log.flush()
                text = ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip()
                match = LINE.match(text)
                if self.on_line is not None and text:
                    if match:
                        self.on_line(match["level"], match["message"])
                    else:
                        self.on_line("OUTPUT", text)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the chaos process (by PID), if it is still running."""
        if self._popen is not None and self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, signum)

    def interrupt(self) -> None:
        """Ask Chaos Toolkit to stop: interrupted status, rollbacks, controls' end."""
        self.interrupted = True
        self.signal(signal.SIGINT)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def finish(self, grace_s: float = DEFAULT_GRACE_S) -> ChaosResult:
        """Wait for the process (SIGKILL after ``grace_s``) and return how it ended."""
        assert self._popen is not None
        killed = False
        try:
            self._popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self._popen.wait(timeout=30)
            killed = True
        if self._reader is not None:
            self._reader.join(timeout=5)
        code = self._popen.returncode
        return ChaosResult(
            exit_code=None if killed or (code is not None and code < 0) else code,
            duration_s=round(self.elapsed_s(), 3),
            interrupted=self.interrupted,
            timed_out=self.timed_out,
        )
