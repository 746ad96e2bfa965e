"""Harness-side faults of the stack's shared dependency, Redis (issue #16): real
Redis-side stalls (``pause``), connection-pool exhaustion (``exhaust``) and the Redis
process killed (``kill``), each undone by ``clear``.

Over 400 lines because the three faults share one RESP client, ledger and rollback.
Every fault is refused unless ``redis`` is in the target's ``blast_radius.components``.
The harness talks to Redis over its protocol (RESP); it never imports ``canarystack``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gameday.evidence.ledger import DEPENDENCY_ROLE, FaultEntry, FaultError
from gameday.faults import FaultLedger, annotate
from gameday.targets import Target, TargetError
from gameday.targets.base import BlastRadiusError
from gameday.targets.local import LocalTarget, _pinned, read_cmdline, send_signal

ROLE = DEPENDENCY_ROLE  # the ledger's component name (gameday.evidence.ledger)
TIMEOUT_S = 2.0
HOLDER_NAME = "gameday-holder"
MAX_PAUSE_MS = 600_000
MAX_TTL_S = 600.0
MAX_HOLD_CONNECTIONS = 64
HOLDER_EXIT_WAIT_S = 5.0


class RespError(FaultError):
    """Redis answered an error, or could not be reached; the message says which."""


class Resp:
    """One connection speaking RESP2 (enough for the commands the harness sends)."""

    def __init__(self, host: str, port: int, timeout_s: float = TIMEOUT_S) -> None:
        self.where = f"redis at {host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise RespError(f"{self.where}: cannot connect ({exc})") from None
        self.sock.settimeout(timeout_s)
        self.buf = b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, *args: str | int) -> Any:
        parts = [str(a).encode() for a in args]
        out = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        try:
            self.sock.sendall(out)
            value = self._read()
        except OSError as exc:
            raise RespError(f"{self.where}: {' '.join(map(str, args))}: {exc}") from None
        if isinstance(value, RespError):
            raise RespError(f"{self.where}: {' '.join(map(str, args))}: {value}")
        return value

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("connection closed by Redis")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("connection closed by Redis")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def _read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise OSError(f"unexpected reply {line[:40]!r}")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    program: str
    url: str
    maxclients: int


def endpoint(target: Target) -> Endpoint:
    """Where the target's Redis is (stack.json ``dependencies``)."""
    if not isinstance(target, LocalTarget):
        raise TargetError(
            f"target {target.name!r} ({target.kind}): Redis faults run on the local stack "
            "only so far; use a local target (targets/local.yaml)."
        )
    deps = [
        d for d in target.description(refresh=True).get("dependencies", []) if d.get("role") == ROLE
    ]
    if not deps:
        raise TargetError(
            f"local target: the stack in {target.state_dir} has no Redis (stack.json lists no "
            "dependency): start a stack of this version (`gameday stack up`)."
        )
    dep = deps[0]
    return Endpoint("127.0.0.1", int(dep["port"]), str(dep["program"]), str(dep["url"]),
                    int(dep.get("maxclients") or 1000))  # fmt: skip


def check_allowed(target: Target) -> None:
    """Refuse unless ``redis`` is in the blast radius. Every fault that passes is written to
    the run's fault ledger (action ``dependency`` / ``dependency-clear``, or ``kill``) and
    announced to the broker."""
    if ROLE not in target.blast_radius.components:
        allowed = ", ".join(target.blast_radius.components) or "nothing"
        raise BlastRadiusError(
            f"component redis is outside the blast radius of target {target.name!r} "
            f"(allowed: {allowed}). Add redis to blast_radius.components in the target file "
            "if the shared dependency may be harmed."
        )


def _entry(action: str, ep: Endpoint, kind: str, **kw: Any) -> FaultEntry:
    return FaultEntry(action=action, time=time.time(), component=ROLE, replica=ep.program,
                      url=ep.url, kind=kind, **kw)  # fmt: skip


def _announce(target: Target, entry: FaultEntry) -> None:
    annotate(
        target,
        {"annotation": "fault_injected", "component": ROLE, "kind": entry.kind,
         "fault_ids": [entry.fault_id], "replicas": [entry.replica], "params": entry.params,
         "ttl_s": entry.ttl_s},
        reason=f"gameday injected {entry.kind} into redis",
    )  # fmt: skip


def pause(target: Target, ms: float, ledger: FaultLedger | None = None) -> FaultEntry:
    """Stall every Redis client for ``ms`` milliseconds: ``CLIENT PAUSE <ms> ALL``.

    Redis itself ends the pause when ``ms`` is up (its TTL). ``clear`` sends ``CLIENT
    UNPAUSE`` but Redis 7.0 holds that command too while paused ALL, so the rollback
    waits (bounded) for the pause to end.
    """
    check_allowed(target)
    if not 0 < ms <= MAX_PAUSE_MS:
        raise FaultError(f"redis pause: ms is {ms!r}: give 1 to {MAX_PAUSE_MS} milliseconds.")
    ep = endpoint(target)
    with Resp(ep.host, ep.port) as r:
        r.command("CLIENT", "PAUSE", int(ms), "ALL")
    entry = _entry("dependency", ep, "pause", fault_id=f"redis-pause-{uuid.uuid4().hex[:8]}",
                   ttl_s=ms / 1000.0, params={"ms": ms})  # fmt: skip
    if ledger is not None:
        ledger.append(entry)
    _announce(target, entry)
    return entry


def exhaust(
    target: Target, ttl_s: float, connections: int = 4, ledger: FaultLedger | None = None
) -> FaultEntry:
    """Fill Redis: ``connections`` held connections and ``maxclients`` lowered to them,
    every other client disconnected, for ``ttl_s`` seconds (the holder's deadline).

    A holder child process (``python -m gameday.redis_faults hold``) holds them, so the
    model pools' reconnects are refused ("max number of clients reached"). At its
    deadline, or on SIGTERM, it restores ``maxclients`` and exits; ``clear`` stops it (by
    PID, checked) and restores the setting itself when the holder could not.
    """
    check_allowed(target)
    if not 0 < ttl_s <= MAX_TTL_S:
        raise FaultError(f"redis pool exhaustion: ttl_s is {ttl_s!r}: give 1 to {MAX_TTL_S:g} s.")
    if not 1 <= connections <= MAX_HOLD_CONNECTIONS:
        raise FaultError(
            f"redis pool exhaustion: connections is {connections!r}: give 1 to "
            f"{MAX_HOLD_CONNECTIONS}."
        )
    ep = endpoint(target)
    ready = Path(f"/tmp/gameday-holder-{uuid.uuid4().hex}.ready")
    cmd = [sys.executable, "-m", "gameday.redis_faults", "hold", "--port", str(ep.port),
           "--connections", str(connections), "--restore-maxclients", str(ep.maxclients),
           "--deadline-s", f"{ttl_s:g}", "--ready-file", str(ready)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 10.0
    while not ready.exists():
        if proc.poll() is not None:
            err = (proc.stderr.read().decode(errors="replace") if proc.stderr else "")[-500:]
            raise FaultError(f"redis pool exhaustion: the holder exited ({proc.returncode}): {err}")
        if time.monotonic() > deadline:
            _stop_holder(proc.pid)
            raise FaultError("redis pool exhaustion: the holder was not ready within 10 s.")
        time.sleep(0.02)
    ready.unlink(missing_ok=True)
    entry = _entry("dependency", ep, "pool-exhaustion", fault_id=f"redis-hold-{proc.pid}",
                   ttl_s=ttl_s, params={"connections": connections},
                   detail={"holder_pid": proc.pid, "holder_command": cmd[2:4],
                           "restore_maxclients": ep.maxclients})  # fmt: skip
    if ledger is not None:
        ledger.append(entry)
    _announce(target, entry)
    return entry


def kill(target: Target, ledger: FaultLedger | None = None) -> FaultEntry:
    """SIGKILL the stack's redis-server (by PID, checked against supervisord's
    configuration and ``/proc``); supervisord restarts it."""
    check_allowed(target)
    ep = endpoint(target)
    assert isinstance(target, LocalTarget)
    info = target.program_config(ep.program)
    command = str(info.get("command") or "")
    argv = shlex.split(command)
    where = f"local target: refusing to kill {ep.program!r} as redis"
    if not argv or Path(argv[0]).name != "redis-server" or "--port" not in argv:
        raise TargetError(f"{where}: supervisord runs it as `{command[:300]}`, not redis-server.")
    if argv[argv.index("--port") + 1] != str(ep.port):
        raise TargetError(f"{where}: its command listens on another port than {ep.port}.")
    pid = target.pid_of(ep.program)
    with _pinned(pid) as fd:
        actual = read_cmdline(pid) or []
        exe = Path(f"/proc/{pid}/exe")
        try:
            same_binary = os.path.samefile(exe, argv[0])
        except OSError:
            same_binary = False
        # redis-server rewrites its title to "redis-server 127.0.0.1:PORT".
        if not same_binary or not any(part.endswith(f":{ep.port}") for part in actual):
            raise TargetError(
                f"{where}: PID {pid} runs `{' '.join(actual)[:200]}`, not the program's "
                f"redis-server on port {ep.port}."
            )
        killed_at = time.time()
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    entry = _entry("kill", ep, "pod-kill",
                   detail={"pid": pid, "signal": "SIGKILL", "time": killed_at,
                           "verified": "supervisord config + /proc exe and title"})  # fmt: skip
    if ledger is not None:
        ledger.append(entry)
    annotate(target, {"annotation": "pod_killed", "component": ROLE, "replica": ep.program,
                      "pid": pid}, reason="gameday killed redis")  # fmt: skip
    return entry


def _is_holder(pid: int) -> bool:
    argv = read_cmdline(pid) or []
    return "gameday.redis_faults" in argv and "hold" in argv


def _stop_holder(pid: int) -> bool:
    """SIGTERM the holder (it restores maxclients and exits), SIGKILL after a while, and
    return once it has exited. Only a process that is a holder is signalled."""
    try:
        with _pinned(pid) as fd:
            if not _is_holder(pid):
                return False
            send_signal(pid, fd, signal.SIGTERM)
            if not _exited(pid, fd, HOLDER_EXIT_WAIT_S):
                send_signal(pid, fd, signal.SIGKILL)
                _exited(pid, fd, HOLDER_EXIT_WAIT_S)
    except (TargetError, ProcessLookupError):
        return False
    return True


def _exited(pid: int, fd: int | None, wait_s: float) -> bool:
    """Whether ``pid`` exits within ``wait_s`` (reaped when it is this process's child).

    Exited, not "no longer a holder": a process that is exiting has already lost its
    command line while its connection and its PID may still be there."""
    deadline = time.monotonic() + wait_s
    while not _has_exited(pid, fd):
        if time.monotonic() >= deadline:
            return False
        if fd is None:
            time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return True


def _has_exited(pid: int, fd: int | None) -> bool:
    """A pidfd becomes readable when its process has exited (waits up to 50 ms for it);
    without one, /proc says gone or zombie."""
    if fd is not None:
        return bool(select.select([fd], [], [], 0.05)[0])
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def restore(ep: Endpoint, wait_s: float = 10.0) -> None:
    """``maxclients`` back to the stack's value and no pause, retrying while Redis is full
    or restarting (bounded)."""
    deadline = time.monotonic() + wait_s
    last = ""
    while True:
        try:
            with Resp(ep.host, ep.port) as r:
                r.command("CLIENT", "UNPAUSE")  # first: a paused Redis holds CONFIG SET
                r.command("CONFIG", "SET", "maxclients", ep.maxclients)
                return
        except RespError as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise FaultError(f"could not restore redis within {wait_s:g} s: {last}")
        time.sleep(0.1)


def clear(target: Target, ledger: FaultLedger) -> list[FaultEntry]:
    """End every dependency fault of the ledger (pause, holder) and restore Redis's
    settings. Idempotent; a rollback."""
    entries = ledger.entries()
    done = {e.fault_id for e in entries if e.action == "dependency-clear"}
    open_ = [e for e in entries if e.action == "dependency" and e.fault_id not in done]
    if not open_:
        return []
    ep = endpoint(target)
    cleared = []
    for e in open_:
        pid = e.detail.get("holder_pid")
        stopped = _stop_holder(int(pid)) if isinstance(pid, int) else False
        cleared.append(_entry("dependency-clear", ep, e.kind, fault_id=e.fault_id,
                              detail={"holder_stopped": stopped}))  # fmt: skip
    now = time.time()
    pauses = [e.time + float(e.ttl_s or 0) - now for e in open_ if e.kind == "pause"]
    restore(ep, wait_s=max([10.0, *(r + 5.0 for r in pauses)]))
    for c in cleared:
        ledger.append(c)
    change = {"annotation": "fault_cleared", "fault_ids": [c.fault_id for c in cleared],
              "replicas": [ep.program]}  # fmt: skip
    annotate(target, change, reason="gameday cleared its redis faults")
    return cleared


def problems(target: Target) -> list[str]:
    """What keeps Redis from being in the state every experiment starts from: it answers,
    ``maxclients`` is the stack's value, no pause, no holder connected."""
    ep = endpoint(target)
    try:
        with Resp(ep.host, ep.port) as r:
            if r.command("PING") != "PONG":
                return ["redis does not answer PING"]
            got = r.command("CONFIG", "GET", "maxclients")
            clients = str(r.command("CLIENT", "LIST"))
    except RespError as exc:
        return [str(exc)]
    found = []
    if int(got[1]) != ep.maxclients:
        found.append(f"redis maxclients is {got[1]}, not the stack's {ep.maxclients}")
    if f"name={HOLDER_NAME}" in clients:
        found.append("a pool-exhaustion holder is still connected to redis")
    return found


# -- the holder child ---------------------------------------------------------------------
def hold(port: int, connections: int, restore_maxclients: int, deadline_s: float,
         ready_file: Path | None) -> int:  # fmt: skip
    """Hold ``connections`` connections and Redis full until the deadline or SIGTERM; then
    restore ``maxclients`` and exit."""
    stop = {"now": False}

    def on_term(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    conns = [Resp("127.0.0.1", port) for _ in range(connections)]
    first = conns[0]
    try:
        mine = set()
        for c in conns:
            c.command("CLIENT", "SETNAME", HOLDER_NAME)
            mine.add(int(c.command("CLIENT", "ID")))
        first.command("CONFIG", "SET", "maxclients", connections)
        for line in str(first.command("CLIENT", "LIST")).splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            cid = int(fields.get("id", "0"))
            if cid and cid not in mine and fields.get("flags", "N") == "N":
                with contextlib.suppress(RespError):
                    first.command("CLIENT", "KILL", "ID", cid)
        if ready_file is not None:
            ready_file.write_text(str(os.getpid()))
        end = time.monotonic() + deadline_s
        while not stop["now"] and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        with contextlib.suppress(RespError):
            first.command("CONFIG", "SET", "maxclients", restore_maxclients)
        for c in conns:
            c.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gameday.redis_faults")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold", help="hold Redis full until a deadline (a pool-exhaustion fault)")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--connections", type=int, default=4)
    h.add_argument("--restore-maxclients", type=int, required=True)
    h.add_argument("--deadline-s", type=float, required=True)
    h.add_argument("--ready-file", type=Path, default=None)
    args = p.parse_args(argv)
    if not 0 < args.deadline_s <= MAX_TTL_S:
        p.error(f"--deadline-s {args.deadline_s}: give 1 to {MAX_TTL_S:g} seconds")
    if not 1 <= args.connections <= MAX_HOLD_CONNECTIONS:
        p.error(f"--connections {args.connections}: give 1 to {MAX_HOLD_CONNECTIONS}")
    return hold(args.port, args.connections, args.restore_maxclients, args.deadline_s,
                args.ready_file)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
