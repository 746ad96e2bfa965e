"""One Locust run whose master is a pod (``PodLoadRun``), for a load from worker pods
that must not be bounded by the harness's own machine.

The command is ``LoadRun``'s, with the run's files under the pod's folder; the pod is a
``RemoteMaster`` (``gameday.targets.locust_master.MasterPod`` on the Kubernetes API): it
starts Locust, says when the test started (the ready file) and when Locust exited, sends
it SIGTERM by PID, and hands its files back. After the run, the records, the summary,
Locust's log and CSVs are copied into the run folder, so everything downstream (the SLO
probes, the report, the generator's check across workers) reads them as after a local
run; then the pod is deleted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from gameday.load.runner import LoadConfig, LoadResult, LoadRun, LoadRunError, LoadStartError

__all__ = ["PodLoadRun", "RemoteMaster"]

POLL_S = 0.5
# The files a run leaves in its folder (LoadRun's outputs), copied back from the pod.
OUTPUTS = (
    "records.parquet",
    "oracle.parquet",
    "load-summary.json",
    "locust.log",
    "locust_stats.csv",
    "locust_stats_history.csv",
    "locust_failures.csv",
    "locust_exceptions.csv",
)


class RemoteMaster(Protocol):
    """Where a master runs when it is not a process here (``MasterPod``)."""

    name: str
    base: str  # the run's folder there
    python: str
    locustfile: str

    def start(self, command: list[str]) -> None: ...
    def has(self, path: str) -> bool: ...
    def exit_code(self) -> int | None: ...
    def stop(self) -> None: ...
    def read(self, path: str) -> bytes | None: ...
    def log_tail(self, chars: int = 4000) -> str: ...
    def delete(self) -> None: ...


class PodLoadRun(LoadRun):
    """``LoadRun`` with its master in ``remote`` (module docstring)."""

    def __init__(self, config: LoadConfig, remote: RemoteMaster) -> None:
        super().__init__(config)
        self.remote = remote
        self._started = False
        self._code: int | None = None

    def python_arg(self) -> str:
        return self.remote.python

    def locustfile_arg(self) -> str:
        return self.remote.locustfile

    def path_arg(self, path: Path) -> str:
        return f"{self.remote.base}/{path.relative_to(self.output_dir)}"

    @property
    def pid(self) -> int | None:
        return None  # not a process here: ``remote.name`` names the pod

    @property
    def running(self) -> bool:
        return self._started and self._code is None and self.remote.exit_code() is None

    def log_tail(self, chars: int = 3000) -> str:
        local = super().log_tail(chars)
        return local or self.remote.log_tail(chars)

    def start(self, timeout_s: float = 60.0) -> PodLoadRun:
        if self._started:
            raise LoadRunError("this LoadRun was already started; make a new one")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            (self.output_dir / name).unlink(missing_ok=True)
        self._started = True
        try:
            self.remote.start(self.command())
            deadline = time.monotonic() + timeout_s
            while not self.remote.has(self.path_arg(self.ready_path)):
                code = self.remote.exit_code()
                if code is not None:
                    raise LoadStartError(
                        f"Locust in pod {self.remote.name} exited with code {code} before the "
                        f"test started.\nIts output ends with:\n{self.remote.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise LoadStartError(
                        f"Locust in pod {self.remote.name} did not start the test within "
                        f"{timeout_s:g} s; the pod was deleted.\n"
                        f"Its output ends with:\n{self.remote.log_tail()}"
                    )
                time.sleep(POLL_S)
        except Exception:
            self._kill()
            raise
        return self

    def stop(self) -> LoadResult:
        """SIGTERM to Locust in the pod, its files copied back, the pod deleted."""
        if not self._started:
            raise LoadRunError("stop() before start()")
        if self.result is not None:
            return self.result
        try:
            self.remote.stop()
            return self.wait(self.config.stop_timeout_s + 15.0)
        except TimeoutError:
            raise LoadRunError(
                f"Locust in pod {self.remote.name} did not exit within "
                f"{self.config.stop_timeout_s + 15.0:g} s of SIGTERM; the pod was deleted "
                f"and its records are lost.\n{self.remote.log_tail()}"
            ) from None
        finally:
            self._kill()

    def wait(self, timeout_s: float | None = None) -> LoadResult:
        if not self._started:
            raise LoadRunError("wait() before start()")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.remote.exit_code()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Locust in pod {self.remote.name} still running")
            time.sleep(POLL_S)
        self._code = code
        self._copy_back()
        return self._finish(code)

    def _copy_back(self) -> None:
        for name in OUTPUTS:
            data = self.remote.read(f"{self.remote.base}/{name}")
            if data is not None:
                (self.output_dir / name).write_bytes(data)

    def _kill(self) -> None:
        """Delete the pod (its Locust with it)."""
        if self._started:
            self.remote.delete()
