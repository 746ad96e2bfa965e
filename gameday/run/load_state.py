"""Where the user load of one experiment stands: ``load.json`` in its folder, and the
Locust runs alive between the method's start and end (``probes.load`` drives them).

``load.json`` goes ``starting`` → ``running`` (Locust's PID, ``started_at``, the records'
paths) → ``stopped`` (exit code, failed requests, Locust's summary), or ``failed`` with
the error. The SLO probes and ``gameday run`` read it. Written atomically (a reader never
sees half a file). This module must never leave a Locust it started running: ``stop``
is idempotent and ``stop_all`` stops every one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from gameday.atomic import write_json
from gameday.errors import GamedayError
from gameday.load.pod_run import PodLoadRun, RemoteMaster
from gameday.load.runner import LoadConfig, LoadRun

LOAD_STATE_NAME = "load.json"

# The LoadRun of each run folder, alive between the method's before and after hooks.
_RUNS: dict[Path, LoadRun] = {}


class LoadState(TypedDict, total=False):
    """``load.json``: each key from the step that writes it on (``start``: the load's
    settings and command; running: ``pid``, ``started_at``, the records' paths;
    ``stop``: how it ended; ``failed``: ``error``)."""

    state: str  # starting | running | stopped | failed
    host: str
    users: int
    spawn_rate: float
    max_tokens: int | None
    prompt_mix: str
    oracle: bool
    stop_timeout_s: float
    seed: int
    command: list[str]
    pid: int | None
    master_pod: str
    started_at: float
    records: str
    oracle_records: str | None
    error: str
    stopped_at: float
    exit_code: int
    failed_requests: bool
    summary: Mapping[str, object]  # Locust's own summary (``gameday.load.collector``)


def read_state(folder: Path) -> LoadState:
    """``load.json`` of ``folder`` ({} when there is none, or it is unreadable)."""
    try:
        value = json.loads((folder / LOAD_STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return cast(LoadState, value) if isinstance(value, dict) else {}


def write_state(folder: Path, state: LoadState) -> None:
    write_json(folder / LOAD_STATE_NAME, state)


def start(folder: Path, config: LoadConfig, remote: RemoteMaster | None = None) -> None:
    """Start Locust for ``folder``'s experiment (its master in ``remote``, a pod, when
    given); raises what stopped it from starting (``load.json`` then says ``failed`` with
    the error)."""
    state: LoadState = {"state": "starting"}
    try:
        run = LoadRun(config) if remote is None else PodLoadRun(config, remote)
        state = {
            "state": "starting",
            "host": config.host,
            "users": config.users,
            "spawn_rate": config.spawn_rate,
            "max_tokens": config.max_tokens,
            "prompt_mix": config.prompt_mix,
            "oracle": config.oracle,
            "stop_timeout_s": config.stop_timeout_s,
            **({"seed": config.seed} if config.seed is not None else {}),
            "command": run.command(),
        }
        write_state(folder, state)
        # Registered before it starts: a Ctrl-C during the start still stops it after.
        _RUNS[folder] = run
        run.start()
    except (GamedayError, ValueError, TypeError, OSError) as exc:
        _RUNS.pop(folder, None)
        write_state(folder, {**read_state(folder), "state": "failed", "error": str(exc)})
        raise
    write_state(
        folder,
        {
            **state,
            "state": "running",
            "pid": run.pid,
            **({"master_pod": remote.name} if remote is not None else {}),
            "started_at": time.time(),
            "records": str(run.records_path.resolve()),
            "oracle_records": str(run.oracle_path.resolve()) if run.oracle_path else None,
        },
    )


def mark_failed(folder: Path, error: str) -> None:
    """The load could not even be configured: ``load.json`` says so."""
    write_state(folder, {**read_state(folder), "state": "failed", "error": error})


def stop(folder: Path) -> None:
    """Stop ``folder``'s Locust (SIGTERM by PID) and record how it ended; nothing when it
    is not running."""
    run = _RUNS.pop(folder, None)
    if run is None:
        return
    state = read_state(folder)
    try:
        result = run.stop()
    except GamedayError as exc:  # LoadRunError, or a TargetError of a master pod
        write_state(
            folder, {**state, "state": "failed", "stopped_at": time.time(), "error": str(exc)}
        )
        return
    write_state(
        folder,
        {
            **state,
            "state": "stopped",
            "stopped_at": time.time(),
            "exit_code": result.exit_code,
            "failed_requests": result.failed_requests,
            "summary": result.summary,
        },
    )


def stop_all() -> None:
    """Every Locust still running (the last resort at the end of an experiment)."""
    for folder in list(_RUNS):
        stop(folder)
