"""supervisord as the local stand-in for a ReplicaSet: the config, the daemon over its
unix socket (XML-RPC), stopped by the PID in its pidfile.

This module must never kill anything by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import SupervisorTransport

from canarystack.cluster.spec import Program

STOP_WAIT_S = 5


def render_conf(state_dir: Path, progs: list[Program]) -> str:
    """``supervisord.conf``, with restart settings chosen for quick pod-kill recovery
    (../shared/MEASURED.md): ``autorestart=true``, ``startsecs=0`` (a process that dies
    right after starting is restarted at once instead of going to BACKOFF and, after
    ``startretries``, FATAL) and a large ``startretries``. supervisord's main loop polls
    once a second, so SIGKILL to serving again takes ~1-2.5 s; a second replica covers
    that gap."""
    lines = daemon_conf(state_dir, "canarystack.cluster — regenerated on every `stack up`")
    for p in progs:
        lines += program_conf(state_dir, p.name, p.command_line(), p.env)
    return "\n".join(lines)


def daemon_conf(state_dir: Path, written_by: str) -> list[str]:
    """The lines of supervisord's own sections for ``state_dir`` (its socket, 0700, its
    log, pidfile and the programs' logs there), after a comment naming ``written_by``."""
    sd = state_dir
    return [
        f"; written by {written_by}",
        "[unix_http_server]",
        f"file={sd / 'supervisor.sock'}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={sd / 'logs' / 'supervisord.log'}",
        "logfile_maxbytes=10MB",
        "logfile_backups=1",
        f"pidfile={sd / 'supervisord.pid'}",
        f"childlogdir={sd / 'logs'}",
        f"directory={sd}",
        "loglevel=info",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{sd / 'supervisor.sock'}",
        "",
    ]


def program_conf(
    state_dir: Path,
    name: str,
    command: str,
    env: Mapping[str, str],
    *,
    stop_wait_s: int = STOP_WAIT_S,
    log_max: str = "50MB",
) -> list[str]:
    """The lines of program ``name``'s section: ``command`` (a shell-quoted line) restarted
    always, at once (``render_conf``), stopped as a group by SIGTERM then SIGKILL after
    ``stop_wait_s``, its output to ``logs/NAME.log`` (at most ``log_max``), ``env`` on top
    of ``PYTHONUNBUFFERED=1``."""
    full_env = {"PYTHONUNBUFFERED": "1", **env}
    return [
        f"[program:{name}]",
        # supervisord expands %(...)s in commands: escape literal percent signs.
        f"command={command.replace('%', '%%')}",
        "autostart=true",
        "autorestart=true",
        "startsecs=0",
        "startretries=1000",
        "stopsignal=TERM",
        f"stopwaitsecs={stop_wait_s}",
        "stopasgroup=true",
        "killasgroup=true",
        "redirect_stderr=true",
        f"stdout_logfile={state_dir / 'logs' / (name + '.log')}",
        f"stdout_logfile_maxbytes={log_max}",
        "stdout_logfile_backups=1",
        "environment=" + ",".join(f'{k}="{v}"' for k, v in full_env.items()),
        "",
    ]


def rpc(state_dir: Path) -> Any:
    """An XML-RPC proxy to the supervisord of ``state_dir`` (``proxy.supervisor.*``)."""
    sock = state_dir / "supervisor.sock"
    transport = SupervisorTransport(None, None, f"unix://{sock}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def daemon_pid(state_dir: Path) -> int | None:
    """The PID of this state folder's supervisord if it is alive, else None."""
    pidfile = state_dir / "supervisord.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def is_running(state_dir: Path) -> bool:
    if daemon_pid(state_dir) is None:
        return False
    try:
        state = rpc(state_dir).supervisor.getState()
    except (OSError, xmlrpc.client.Error):
        return False
    return bool(state.get("statename") == "RUNNING")


def start_daemon(state_dir: Path, timeout_s: float = 15.0) -> int:
    """Start supervisord (it daemonizes) and wait until its socket answers."""
    conf = state_dir / "supervisord.conf"
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"supervisord failed to start (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_running(state_dir):
            pid = daemon_pid(state_dir)
            assert pid is not None
            return pid
        time.sleep(0.05)
    raise RuntimeError(
        f"supervisord did not come up within {timeout_s:g}s; see {state_dir / 'logs'}"
    )


def stop_daemon(state_dir: Path, timeout_s: float = 30.0) -> bool:
    """SIGTERM the supervisord by its PID (it stops its programs first) and wait.

    Returns False when no supervisord was running for this state folder.
    """
    pid = daemon_pid(state_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon_pid(state_dir) is None:
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


_SPAWNED = re.compile(r"spawned: '([^']+)' with pid (\d+)")


def restart_counts(state_dir: Path) -> dict[str, int]:
    """Restarts per program since the daemon started, from supervisord's own log."""
    log = state_dir / "logs" / "supervisord.log"
    counts: dict[str, int] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return counts
    # Only the current daemon's lines: after the last "supervisord started" line.
    start = text.rfind("supervisord started with pid")
    for match in _SPAWNED.finditer(text, max(start, 0)):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return {name: max(0, n - 1) for name, n in counts.items()}
