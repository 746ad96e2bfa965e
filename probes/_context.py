"""What every activity needs from its configuration: the target, the run folder, the ledger,
and the steps many activities share (a fault injected, a finding written, a capped wait).

Errors a person can cause come back as ``ActivityFailed`` with the harness's message.
This module opens the session an activity talks to the target over (``gameday.api``);
it never talks to a target itself, only through ``gameday.api`` and ``gameday.faults``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

import requests
from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday.api import ApiError, StackApi
from gameday.atomic import write_json
from gameday.evidence.ledger import FaultError
from gameday.faults import FaultLedger, inject
from gameday.run.folder import RunFolder
from gameday.targets import Target, TargetError, load_target

CONFIG_TARGET = "gameday_target"
CONFIG_RUN_DIR = "gameday_run_dir"
ENV_TARGET = "GAMEDAY_TARGET"
ENV_RUN_DIR = "GAMEDAY_RUN_DIR"
DEFAULT_TARGET_FILE = Path("targets/local.yaml")
DEFAULT_RUN_DIR = Path("reports/adhoc")
# Chaos Toolkit does not time out Python activities: none of them waits longer than this.
MAX_WAIT_S = 600.0

# Chaos Toolkit's configuration and secrets: JSON objects from the experiment file. chaoslib
# hands each only to a function that declares it: every activity takes ``configuration``
# (last), none takes ``secrets`` (credentials come from the target file); the controls keep
# Chaos Toolkit's control signature, and those that resolve arguments read both.
Configuration = JsonObject
Secrets = JsonObject


class InjectedFault(TypedDict):
    """What ``inject_fault`` did, as the injecting action returns it to ``chaos run``."""

    component: str  # "model" when it went to both model roles
    kind: str
    params: Mapping[str, object]
    ttl_s: float | None
    injected_at: float
    replicas: list[str]
    fault_ids: list[str | None]


def target_path(configuration: Configuration | None) -> str | None:
    """The target file this activity acts on (None: the built-in local default, the
    local stack in ``.stack``).

    The configuration entry ``gameday_target``, else ``$GAMEDAY_TARGET``, else
    ``targets/local.yaml`` when it exists (so ``chaos run`` alone works).
    """
    chosen = (configuration or {}).get(CONFIG_TARGET) or os.environ.get(ENV_TARGET)
    if chosen:
        return str(chosen)
    if DEFAULT_TARGET_FILE.is_file():
        return str(DEFAULT_TARGET_FILE)
    return None


@contextmanager
def reported(*errors: type[Exception]) -> Iterator[None]:
    """Turn ``errors`` (whole messages: they say what failed) into ``ActivityFailed``."""
    try:
        yield
    except errors as exc:
        raise ActivityFailed(str(exc)) from None


def get_target(configuration: Configuration | None) -> Target:
    with reported(TargetError):
        return load_target(target_path(configuration))


def run_dir(configuration: Configuration | None) -> Path:
    """The experiment's folder: the configuration entry ``gameday_run_dir``, else
    ``$GAMEDAY_RUN_DIR``, else ``reports/adhoc``. The fault ledger (``faults.jsonl``), the
    load records and ``load.json`` live there.
    """
    chosen = (configuration or {}).get(CONFIG_RUN_DIR) or os.environ.get(ENV_RUN_DIR)
    return Path(chosen) if chosen else DEFAULT_RUN_DIR


def write_run_json(
    configuration: Configuration | None, name: str, doc: Mapping[str, object]
) -> Path:
    """``doc`` as the run folder's JSON file ``name`` (what an activity found, for the
    report), replaced whole: a reader never sees half of it."""
    return write_json(run_dir(configuration) / name, doc)


def append_run_json_lines(
    configuration: Configuration | None, name: str, rows: Iterable[Mapping[str, object]]
) -> Path:
    """``rows`` added to the run folder's JSON-lines file ``name``, one object a line."""
    folder = run_dir(configuration)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / name).open("a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    return folder / name


def run_folder(configuration: Configuration | None) -> RunFolder:
    """The experiment's folder (``run_dir``) as the core reads it."""
    return RunFolder(run_dir(configuration))


def ledger(configuration: Configuration | None) -> FaultLedger:
    return run_folder(configuration).ledger()


def rewrite_journal_extensions(state: Any, rewrite: Callable[[list[Any]], list[Any]]) -> None:
    """An ``after_experiment_control``'s edit of the journal: the ``extensions`` of the
    experiment in ``state`` become ``rewrite`` of them; nothing where ``state`` holds no
    experiment (an interrupted run)."""
    if isinstance(state, dict) and isinstance(state.get("experiment"), dict):
        experiment = state["experiment"]
        experiment["extensions"] = rewrite(list(experiment.get("extensions") or []))


@contextmanager
def harness_errors(what: str) -> Iterator[None]:
    """Turn the harness's own errors into ``ActivityFailed`` naming what was attempted."""
    try:
        yield
    except ActivityFailed:
        raise
    except (TargetError, FaultError, ApiError) as exc:
        raise ActivityFailed(f"{what}: {exc}") from None


@contextmanager
def on_target(configuration: Configuration | None, what: str) -> Iterator[Target]:
    """The run's target, for an activity doing ``what``; inside, the harness's errors
    become ``ActivityFailed`` naming ``what`` was attempted."""
    with harness_errors(what):
        yield get_target(configuration)


@contextmanager
def stack_api(configuration: Configuration | None, what: str) -> Iterator[StackApi]:
    """The target's APIs over a session of this activity's own (closed after it); the
    harness's errors become ``ActivityFailed`` naming ``what`` was attempted."""
    with on_target(configuration, what) as target, requests.Session() as session:
        yield StackApi(session, target)


def foreign_gate(configuration: Configuration | None) -> str | None:
    """Why canarystack-only checks do not apply (the target's gate is foreign, read
    through an observer: ``kind: external``), else None."""
    with reported(TargetError):
        target = get_target(configuration)
    if target.kind != "external":  # canarystack's own stack, local or on Kubernetes
        return None
    return f"not applicable: target {target.name!r} is a stack the project did not build"


def deadline_after(seconds: float) -> float:
    """The ``time.monotonic()`` deadline ``seconds`` from now: below 0 is now, and no
    wait is longer than ``MAX_WAIT_S``."""
    return time.monotonic() + min(max(float(seconds), 0.0), MAX_WAIT_S)


def release_phase_now(api: StackApi) -> str:
    """The release's phase, or ``unreadable (why)`` while the broker does not answer (one
    being restarted: a waiting probe keeps waiting)."""
    try:
        return str(api.release().get("phase"))
    except ApiError as exc:
        return f"unreadable ({exc})"


def inject_fault(
    configuration: Configuration | None,
    what: str,
    component: str,
    kind: str,
    ttl_s: float,
    params: Mapping[str, object],
) -> InjectedFault:
    """Inject on every replica of ``component`` (ledger and broker annotation included)
    and say what was done: the replicas, fault ids and the injection time.

    Every fault has a TTL that the component itself enforces (a dead-man switch: a harness
    that dies leaves nothing behind for longer than the TTL), goes to every replica of the
    component, is checked against the target's blast-radius allowlist before any request,
    and is written to the fault ledger of the run (``faults.jsonl`` in the run folder) and
    to the release's history on the broker. ``clear_faults`` deletes what the ledger holds.
    """
    with on_target(configuration, what) as target:
        entries = inject(target, component, kind, ttl_s, params, ledger(configuration))
    first = entries[0]
    return InjectedFault(
        component=first.component if len({e.component for e in entries}) == 1 else "model",
        kind=first.kind,
        params=first.params,
        ttl_s=first.ttl_s,
        injected_at=min(e.time for e in entries),
        replicas=[e.replica for e in entries],
        fault_ids=[e.fault_id for e in entries],
    )


def _number(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ActivityFailed(f"argument {name} must be a number, got {value!r}") from None


def positive(name: str, value: float, upper: float | None = None) -> float:
    """A positive number argument, or ActivityFailed naming it."""
    number = _number(name, value)
    if not number > 0 or (upper is not None and number > upper):
        bound = f" and at most {upper:g}" if upper is not None else ""
        raise ActivityFailed(f"argument {name} must be above 0{bound}, got {value!r}")
    return number


def non_negative(name: str, value: Any) -> float:
    """A finite number argument of 0 or more, or ActivityFailed naming it."""
    number = _number(name, value)
    if not math.isfinite(number) or number < 0:
        raise ActivityFailed(f"argument {name} must be 0 or more, got {value!r}")
    return number
