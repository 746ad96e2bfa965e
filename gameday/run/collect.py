"""Gather and tidy what one experiment leaves in its folder (docs/ARCHITECTURE.md §7.1).

- ``timeline.json``: the release's broker events (every page) and live routers, fetched
  at the end;
- ``records.parquet`` row count (the verdict needs users to have been there);
- trips inside the experiment's window, from the broker's history;
- safety nets after ``chaos run`` ends, whatever happened: a Locust still running (its PID
  is in ``load.json``) is stopped by that PID, and every fault still outstanding in the
  ledger is cleared (those that cannot be cleared expire by their TTL).

This module never kills anything but the Locust PID the run itself recorded, and only
after checking that the PID is still a Locust process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests

from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.atomic import write_json
from gameday.evidence import events as evidence_events
from gameday.evidence.ledger import FaultError
from gameday.faults import FaultLedger, clear_injected
from gameday.load.records import LOAD_SCHEMA, ORACLE_SCHEMA, recover
from gameday.sessions import given_or_own
from gameday.targets import Target, TargetError

WINDOW_SLACK_S = 2.0
LOCUST_STOP_S = 20.0


def read_json(path: Path) -> JsonObject | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def collect_timeline(
    target: Target, folder: Path, session: requests.Session | None = None
) -> tuple[Sequence[Mapping[str, object]] | None, str]:
    """Write ``timeline.json``; returns the events (None when the broker did not answer).
    Over ``session`` when given, else one of its own."""
    try:
        with given_or_own(session) as http:
            api = StackApi(http, target)
            events = api.events()  # every page
            routers = api.routers()
    except (ApiError, TargetError) as exc:
        return None, f"the broker's history could not be read: {exc}"
    write_json(
        folder / "timeline.json",
        {
            "release": target.release,
            "events": events,
            "routers": routers,
            "collected_at": time.time(),
        },
    )
    return events, ""


def trips_between(events: Sequence[Mapping[str, object]], start: float, end: float) -> int:
    """Events inside [start - slack, end + slack] that set the phase to ``tripped``."""
    return evidence_events.trips_between(events, start - WINDOW_SLACK_S, end + WINDOW_SLACK_S)


def records_rows(folder: Path) -> int | None:
    path = folder / "records.parquet"
    if not path.exists():
        return None
    try:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:  # an unreadable file counts as none
        return None


def _is_locust(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"locust") for part in cmdline) or b"locust" in cmdline


def stop_orphan_locust(folder: Path) -> str | None:
    """Stop a Locust the load control left running (by the PID in load.json)."""
    state = read_json(folder / "load.json") or {}
    pid = state.get("pid")
    if state.get("state") != "running" or not isinstance(pid, int) or not _is_locust(pid):
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + LOCUST_STOP_S
    while time.monotonic() < deadline and _is_locust(pid):
        time.sleep(0.2)
    if _is_locust(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # a Locust that had to be killed never merged its records: its closed parts are kept
    for name, schema in (("records.parquet", LOAD_SCHEMA), ("oracle.parquet", ORACLE_SCHEMA)):
        with contextlib.suppress(OSError):
            recover(folder / name, schema)
    state.update({"state": "killed", "stopped_at": time.time(), "error": "stopped by gameday run"})
    write_json(folder / "load.json", state)
    return f"Locust (pid {pid}) was still running after chaos ended and was stopped"


def clear_leftover_faults(target: Target | None, folder: Path) -> list[str]:
    """Clear what the ledger still holds; returns the faults that may still be active."""
    ledger = FaultLedger(folder / "faults.jsonl")
    if not ledger.outstanding():
        return []
    if target is not None:
        with contextlib.suppress(FaultError, TargetError):
            clear_injected(target, ledger)
    return [
        f"{e.kind} on {e.replica} (id {e.fault_id}, TTL {e.ttl_s} s)" for e in ledger.outstanding()
    ]
