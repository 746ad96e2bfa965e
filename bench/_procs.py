"""What the benchmarks share: start a component process, learn its port from its ready
file and wait until it is healthy, stop a process by its PID, a process's CPU seconds,
and the percentile every benchmark reports (``_results.percentile``).

The benchmarks run as scripts (``.venv/bin/python bench/<name>.py``); Python puts
``bench/`` first on ``sys.path`` then, so they import this module as ``_procs``. It must
never import the system under test (the benchmarks measure it from outside, as a client
does) and never signal a process it did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import requests
from _results import percentile

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}", "x-actor": "bench"}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float | None:
    """THE benchmark percentile (``_results.percentile``: numpy's 'linear'); None if empty."""
    return percentile(values, q)


def command(module: str, args: Sequence[str], *, ready: Path, port: int = 0) -> list[str]:
    """``python -m MODULE --port PORT --ready-file READY ARGS``."""
    return [sys.executable, "-m", module, "--port", str(port), "--ready-file", str(ready), *args]


def launch(
    module: str,
    args: Sequence[str],
    *,
    ready: Path,
    log: Path,
    port: int = 0,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``python -m MODULE --port PORT --ready-file READY ARGS`` in the repository,
    with the benchmark's admin token, its output to ``log``. Wait with ``wait_port``."""
    ready.unlink(missing_ok=True)  # a restart must not read the last run's port
    cmd = command(module, args, ready=ready, port=port)
    env = {**os.environ, "CANARYSTACK_ADMIN_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def start(
    tmp: Path, name: str, module: str, args: Sequence[str]
) -> tuple[subprocess.Popen[bytes], str]:
    """``launch`` a component on a free port (its ready file and log in ``tmp``, named
    after ``name``) and wait for it to be listening: the process and its URL."""
    ready, log = tmp / f"{name}.ready", tmp / f"{name}.log"
    proc = launch(module, args, ready=ready, log=log)
    return proc, f"http://127.0.0.1:{wait_port(proc, ready, log, name)}"


def manifest_digest(manifest: str) -> str:
    """The digest a benchmark registers a version with: sha256 of its manifest string."""
    return "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()


def create_release(broker_url: str, canary_weight: float = 5) -> dict[str, Any]:
    """Register versions v1 and v2 with the broker (each its own name as manifest) and
    create release ``default``, v1 stable and v2 canary at ``canary_weight`` %: the
    release's JSON."""
    for v in ("v1", "v2"):
        body = {"version": v, "manifest": v, "digest": manifest_digest(v)}
        requests.post(broker_url + "/v1/versions", json=body, headers=ADMIN, timeout=5)
    created = requests.post(
        broker_url + "/v1/releases",
        json={
            "name": "default",
            "stable": "v1",
            "canary": "v2",
            "weights": {"canary": canary_weight},
        },
        headers=ADMIN,
        timeout=5,
    )
    created.raise_for_status()
    return dict(created.json())


def port_if_ready(
    proc: subprocess.Popen[bytes], ready: Path, log: Path, what: str, deadline: float
) -> int | None:
    """The port from the ready file once it is there, None while the process starts; exits
    with the log's tail when the process died or ``deadline`` (monotonic) passed."""
    if ready.exists():
        return int(json.loads(ready.read_text())["port"])
    if proc.poll() is not None or time.monotonic() > deadline:
        stop(proc)
        raise SystemExit(f"{what} did not start:\n{log.read_text()[-2000:]}")
    return None


def wait_port(
    proc: subprocess.Popen[bytes], ready: Path, log: Path, what: str, timeout_s: float = 30.0
) -> int:
    """Block until the process has written its ready file; its port."""
    deadline = time.monotonic() + timeout_s
    while (port := port_if_ready(proc, ready, log, what, deadline)) is None:
        time.sleep(0.05)
    return port


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM by PID, SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def stop_and_watch(
    pid: int, fail_safe: Callable[[], bool], stop_s: float, after_s: float, poll_s: float = 0.02
) -> dict[str, Any]:
    """SIGSTOP ``pid`` for ``stop_s`` (SIGCONT always), polling ``fail_safe()`` meanwhile
    and ``after_s`` after: seconds from SIGSTOP to the first fail-safe
    (``failsafe_after_stop_s``), from SIGCONT to its end (``back_after_cont_s``), and how
    many times it was entered (``failsafe_entries``; 1: no flapping)."""
    entries, failsafe_at, back_at, was = 0, None, None, False
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        while time.monotonic() - stopped < stop_s:
            now = fail_safe()
            if now and not was:
                entries += 1
                failsafe_at = failsafe_at or time.monotonic()
            was = now
            time.sleep(poll_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    while time.monotonic() - resumed < after_s:
        now = fail_safe()
        if now and not was:
            entries += 1
        if was and not now and back_at is None:
            back_at = time.monotonic()
        was = now
        time.sleep(poll_s)
    return {
        "failsafe_after_stop_s": None if failsafe_at is None else round(failsafe_at - stopped, 2),
        "back_after_cont_s": None if back_at is None else round(back_at - resumed, 2),
        "failsafe_entries": entries,
    }


def stop_trial_args(description: str, *, trials: int, after_s: float) -> argparse.Namespace:
    """The flags of a benchmark that runs ``stop_and_watch`` per trial: ``--trials``,
    ``--stop-s`` (20 s), ``--after-s`` and ``--out`` (the results file)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--trials", type=int, default=trials)
    p.add_argument("--stop-s", type=float, default=20.0)
    p.add_argument("--after-s", type=float, default=after_s)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args()


def stop_figures(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trials of ``stop_and_watch`` and what they add up to: the longest delay to the
    fail-safe, the stops that never reached it, the ones that flapped."""
    delays = [t["failsafe_after_stop_s"] for t in trials if t["failsafe_after_stop_s"] is not None]
    return {
        "trials": trials,
        "failsafe_after_stop_max_s": max(delays) if delays else None,
        "never_failsafe": sum(t["failsafe_after_stop_s"] is None for t in trials),
        "flapped": sum(t["failsafe_entries"] > 1 for t in trials),
    }


async def wait_healthy(url: str, what: str, timeout_s: float = 20.0) -> None:
    """Poll ``URL/health`` until it answers 200; exit naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise SystemExit(f"{what} never became healthy")
