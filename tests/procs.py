"""Start real component processes for tests and stop them by PID.

``spawn("canarystack.model", "--version", "v1")`` starts ``python -m canarystack.model``
on a free port (``--port 0`` and ``--ready-file``), waits until it listens and answers
``/health``, and returns a ``Proc`` with its URL. Every process is stopped by its PID at
the end of the test (SIGTERM, then SIGKILL) — never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import requests

ADMIN_TOKEN = "test-admin-token"


class _Group(Protocol):
    def stop_all(self) -> None: ...


G = TypeVar("G", bound=_Group)


@contextlib.contextmanager
def stopping(group: G) -> Iterator[G]:
    """``group`` (a Spawner, or any group of processes) for the block; every one of its
    processes stopped after it, however it ends."""
    try:
        yield group
    finally:
        group.stop_all()


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StopWaiting(Exception):
    """Raised by a predicate to end ``wait_for`` at once (e.g. the process died)."""


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> object:
    """Poll until ``predicate()`` is truthy; raise AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except StopWaiting:
            raise
        except Exception as exc:  # keep polling; report the last error
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or predicate}: {last_exc!r}"
    )


def post_fault(
    url: str, fault: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> requests.Response:
    """POST ``fault`` to ``url``/admin/faults with the admin token (and ``headers``)."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}", **(headers or {})}
    return requests.post(url + "/admin/faults", json=dict(fault), headers=auth, timeout=10)


def inject_fault(
    url: str, fault: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``fault`` injected at ``url`` (the component must answer 201); its record."""
    resp = post_fault(url, fault, headers)
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def wait_degraded(proc: Proc, what: str, timeout: float = 10.0) -> dict[str, Any]:
    """Poll ``proc``'s /health until it answers 503; the body of that answer."""

    def degraded() -> dict[str, Any] | None:
        r = requests.get(f"{proc.url}/health", timeout=5)
        return dict(r.json()) if r.status_code == 503 else None

    body = wait_for(degraded, timeout=timeout, what=what)
    assert isinstance(body, dict)
    return body


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def log_events(self) -> list[dict[str, object]]:
        events = []
        for line in self.log().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
        return events

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL by PID (a pod kill)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 5.0) -> None:
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class Spawner:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []
        self._n = 0

    def __call__(
        self,
        module: str,
        *args: str,
        port: int = 0,
        env: dict[str, str] | None = None,
        admin_token: str | None = ADMIN_TOKEN,
        wait_health: bool = True,
        timeout: float = 20.0,
    ) -> Proc:
        self._n += 1
        name = f"{module.rsplit('.', 1)[-1]}-{self._n}"
        ready = self.tmp_path / f"{name}.ready.json"
        log_path = self.tmp_path / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        full_env.pop("CANARYSTACK_ADMIN_TOKEN", None)
        if admin_token is not None:
            full_env["CANARYSTACK_ADMIN_TOKEN"] = admin_token
        if env:
            full_env.update(env)
        cmd = [sys.executable, "-m", module, "--port", str(port), "--ready-file", str(ready), *args]
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed with the process
        popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
        log_file.close()
        proc = Proc(popen=popen, port=port, log_path=log_path)
        self.procs.append(proc)

        def ready_port() -> int | None:
            if popen.poll() is not None:
                raise StopWaiting(f"{module} exited with {popen.returncode}")
            if ready.exists():
                return int(json.loads(ready.read_text())["port"])
            return None

        try:
            proc.port = int(wait_for(ready_port, timeout=timeout, what=f"{module} to listen"))  # type: ignore[call-overload]
        except (AssertionError, StopWaiting) as exc:
            raise AssertionError(f"{module} did not start: {exc}\n{proc.log()[-3000:]}") from None
        if wait_health:
            wait_for(
                lambda: requests.get(proc.url + "/health", timeout=1).status_code == 200,
                timeout=timeout,
                what=f"{module} /health",
            )
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
