"""Faults in Envoy's HTTP fault filter, through its admin runtime, with a TTL Envoy lacks.

Envoy's runtime has no expiry: a harness that dies after ``POST /runtime_modify`` leaves
the fault on for good (../shared/MEASURED.md). So every injection starts a watchdog, a
detached process of its own (``python -m gameday.targets.envoy_faults watchdog ...``, in
its own session so it outlives the harness) that resets the keys at the TTL; clearing
resets them at once and stops the watchdog by its PID after checking its command line.

Kinds (the route's fault filter must be configured with a delay and an abort at 0 %, so
the runtime keys can turn them on):

- ``latency`` (``ms``): every request waits ``ms`` before it is forwarded
  (``fault.http.delay.fixed_delay_percent`` 100, ``fault.http.delay.fixed_duration_ms``);
- ``errors`` (``rate`` 0..1, ``status`` default 503): that share of requests is answered
  ``status`` by Envoy (``fault.http.abort.abort_percent``, ``fault.http.abort.http_status``).

A newer fault of a kind replaces the older one (its watchdog is stopped). This module
only talks to the Envoy admin URL the target file gives, and signals only watchdogs it
started (checked by their command line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import requests

from gameday.targets.base import TargetError
from gameday.targets.local import _pinned, read_cmdline, send_signal

KEYS = {
    "latency": {
        "fault.http.delay.fixed_delay_percent": "0",
        "fault.http.delay.fixed_duration_ms": "0",
    },
    "errors": {"fault.http.abort.abort_percent": "0", "fault.http.abort.http_status": "503"},
}
ADMIN_TIMEOUT_S = 3.0
MAX_TTL_S = 3600.0


class FaultState(TypedDict):
    """A fault's state file (``<fault id>.json`` in ``state_dir``): its watchdog's PID,
    the runtime keys it set and those that reset it, and when it expires."""

    fault_id: str
    kind: str
    admin_url: str
    pid: int
    expires_at: float
    values: dict[str, str]
    reset: dict[str, str]


class HeldFault(FaultState):
    """A ``FaultState`` as read back, with the file it was read from."""

    path: str


def state_dir() -> Path:
    """Where each watchdog's state file lives (its PID, keys, expiry)."""
    return Path(os.environ.get("GAMEDAY_ENVOY_FAULTS_DIR") or tempfile.gettempdir()) / (
        "gameday-envoy-faults"
    )


def _modify(admin_url: str, values: dict[str, str], session: requests.Session | None) -> None:
    http = session or requests
    resp = http.post(f"{admin_url}/runtime_modify", params=values, timeout=ADMIN_TIMEOUT_S)
    if resp.status_code != 200:
        raise TargetError(
            f"Envoy's admin at {admin_url} refused runtime_modify {values}: HTTP "
            f"{resp.status_code} {resp.text[:200]}"
        )


def fault_values(kind: str, params: Mapping[str, object]) -> dict[str, str]:
    """The runtime keys that turn fault ``kind`` on; TargetError naming a bad param."""
    if kind == "latency":
        ms = params.get("ms", params.get("ttft_ms"))
        if not isinstance(ms, int | float) or isinstance(ms, bool) or not 0 < ms <= 60_000:
            raise TargetError(f"envoy latency fault: ms is {ms!r}: give 0 < ms <= 60000")
        return {
            "fault.http.delay.fixed_delay_percent": "100",
            "fault.http.delay.fixed_duration_ms": str(int(ms)),
        }
    if kind == "errors":
        rate = params.get("rate", 1.0)
        status = params.get("status", 503)
        if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate <= 1:
            raise TargetError(f"envoy errors fault: rate is {rate!r}: give 0 < rate <= 1")
        if not isinstance(status, int) or not 500 <= status <= 599:
            raise TargetError(f"envoy errors fault: status is {status!r}: give a 5xx status")
        return {
            "fault.http.abort.abort_percent": str(round(rate * 100)),
            "fault.http.abort.http_status": str(status),
        }
    raise TargetError(f"envoy has no fault kind {kind!r}: use one of {', '.join(KEYS)}")


class EnvoyFaults:
    """The fault backend for a role played by Envoy (``admin_url``: its admin, loopback)."""

    def __init__(self, admin_url: str, role: str) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.role = role

    def _states(self) -> list[HeldFault]:
        out: list[HeldFault] = []
        for path in sorted(state_dir().glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                doc: FaultState = json.loads(path.read_text())  # as inject wrote it
                if doc.get("admin_url") == self.admin_url:
                    out.append({**doc, "path": str(path)})
        return out

    def inject(
        self,
        kind: str,
        ttl_s: float,
        params: Mapping[str, object],
        session: requests.Session | None,
    ) -> str:
        """Turn ``kind`` on for ``ttl_s`` seconds; returns the fault id."""
        values = fault_values(kind, params)
        if not 0 < ttl_s <= MAX_TTL_S:
            raise TargetError(f"envoy fault: ttl_s {ttl_s!r}: give 0 < ttl_s <= {MAX_TTL_S:g}")
        for old in self._states():
            if old.get("kind") == kind:  # a newer fault of a kind replaces the older one
                self._stop_watchdog(old)
        fault_id = f"envoy-{kind}-{uuid.uuid4().hex[:12]}"
        folder = state_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{fault_id}.json"
        expires = time.time() + ttl_s
        reset = KEYS[kind]
        argv = [
            sys.executable,
            "-m",
            "gameday.targets.envoy_faults",
            "watchdog",
            "--admin",
            self.admin_url,
            "--at",
            f"{expires:.3f}",
            "--state",
            str(path),
            "--fault-id",
            fault_id,
            *[f"--reset={k}={v}" for k, v in reset.items()],
        ]
        # The watchdog first, so a fault never stands without one.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        doc: FaultState = {
            "fault_id": fault_id,
            "kind": kind,
            "admin_url": self.admin_url,
            "pid": proc.pid,
            "expires_at": expires,
            "values": values,
            "reset": reset,
        }
        path.write_text(json.dumps(doc))
        try:
            _modify(self.admin_url, values, session)
        except (requests.RequestException, TargetError) as exc:
            self._stop_watchdog({**doc, "path": str(path)})
            raise TargetError(f"injecting {kind} into Envoy at {self.admin_url}: {exc}") from None
        return fault_id

    def _stop_watchdog(self, doc: HeldFault) -> None:
        pid = int(doc.get("pid") or 0)
        argv = read_cmdline(pid) if pid > 0 else None
        if argv is not None and str(doc.get("fault_id")) in argv and "watchdog" in argv:
            with contextlib.suppress(ProcessLookupError, TargetError), _pinned(pid) as fd:
                if read_cmdline(pid) == argv:
                    send_signal(pid, fd, signal.SIGTERM)
        with contextlib.suppress(OSError):
            Path(str(doc["path"])).unlink()

    def clear(self, fault_id: str, session: requests.Session | None) -> bool:
        """Reset the fault's keys now and stop its watchdog; False when it was already gone
        (expired: the watchdog reset it)."""
        for doc in self._states():
            if doc.get("fault_id") == fault_id:
                try:
                    _modify(self.admin_url, dict(doc.get("reset") or {}), session)
                except requests.RequestException as exc:
                    raise TargetError(f"clearing {fault_id} at {self.admin_url}: {exc}") from None
                self._stop_watchdog(doc)
                return True
        return False

    def active(self, session: requests.Session | None = None) -> list[str]:
        now = time.time()
        return [
            f"{self.role} (Envoy {self.admin_url}): {d.get('kind')} (id {d.get('fault_id')}, "
            f"{max(0.0, float(d.get('expires_at') or 0) - now):.1f} s left)"
            for d in self._states()
            if float(d.get("expires_at") or 0) > now
        ]


def _watchdog(args: argparse.Namespace) -> int:
    """Sleep until the TTL, then reset the keys (retrying while Envoy does not answer,
    until ``--give-up-s`` after the TTL); SIGTERM: exit without resetting (the harness
    cleared the fault itself)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    reset = dict(item.split("=", 1) for item in args.reset)
    while (left := args.at - time.time()) > 0:
        time.sleep(min(left, 1.0))
    deadline = time.time() + args.give_up_s
    while True:
        try:
            _modify(args.admin, reset, None)
            break
        except (requests.RequestException, TargetError):
            if time.time() > deadline:
                return 1
            time.sleep(1.0)
    with contextlib.suppress(OSError):
        Path(args.state).unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gameday.targets.envoy_faults")
    sub = parser.add_subparsers(dest="command", required=True)
    wd = sub.add_parser("watchdog", help="reset Envoy runtime keys at a fault's TTL")
    wd.add_argument("--admin", required=True)
    wd.add_argument("--at", type=float, required=True)
    wd.add_argument("--state", required=True)
    wd.add_argument("--fault-id", required=True)
    wd.add_argument("--reset", action="append", default=[])
    wd.add_argument("--give-up-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    return _watchdog(args)


if __name__ == "__main__":
    raise SystemExit(main())
