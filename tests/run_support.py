"""Helpers for the probes / run / experiments tests: free base ports, a real local stack,
tiny Chaos Toolkit experiments, records and ledgers written into a run folder.

The stack is started and stopped through ``gameday.stack`` (supervisord, stopped by the
PID in its pidfile), on a base port whose every port is free.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import requests
import yaml

from gameday.evidence.ledger import FaultEntry
from gameday.faults import FaultLedger
from gameday.load.records import LOAD_SCHEMA
from gameday.stack import stack_down, stack_up

REPO = Path(__file__).resolve().parents[1]
# Offsets of every port a default stack listens on (canarystack/cluster/spec.py): broker,
# router, gate, rollback, redis, two router instances, two baselines, the canary.
STACK_PORT_OFFSETS = (0, 1, 2, 3, 4, 11, 12, 20, 21, 30)
# Below the kernel's ephemeral range (32768-60999 on Linux), where free_port() and every
# client socket land: a stack there can lose a port to another test between the check
# and its start.
BASE_PORTS = range(20000, 32700, 50)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(tries: int = 200) -> int:
    """A base port B such that every port of a default stack (B + offsets) is free."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.choice(BASE_PORTS)
        if all(_port_free(base + off) for off in STACK_PORT_OFFSETS):
            return base
    raise RuntimeError("no free base port found for a local stack")


def write_target(
    path: Path, state_dir: Path, components: Sequence[str] | None = None, **extra: Any
) -> Path:
    data: dict[str, Any] = {"kind": "local", "name": "test", "state_dir": str(state_dir)}
    if components is not None:
        data["blast_radius"] = {"components": list(components)}
    data.update(extra)
    path.write_text(yaml.safe_dump(data))
    return path


@contextmanager
def local_stack(state_dir: Path, extra: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """A real local stack on a free base port; stopped (by PID) at the end."""
    base = free_base_port()
    status = stack_up(state_dir, ["--base-port", str(base), *extra])
    try:
        yield {**status, "base_port": base}
    finally:
        stack_down(state_dir)


def stack_description(state_dir: Path) -> dict[str, Any]:
    return dict(json.loads((state_dir / "stack.json").read_text()))


def admin_headers(state_dir: Path, credential: str = "operator") -> dict[str, str]:
    """Headers with one of the stack's credentials (operator; faults-<role> for a
    component's /admin/faults)."""
    token = (state_dir / "credentials" / credential).read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def faults_on(state_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every replica's active faults, read from its own /admin/faults."""
    desc = stack_description(state_dir)
    out = {}
    for comp in desc["components"]:
        resp = requests.get(
            f"{comp['url']}/admin/faults",
            headers=admin_headers(state_dir, f"faults-{comp['role']}"),
            timeout=3,
        )
        resp.raise_for_status()
        out[comp["name"]] = list(resp.json()["faults"])
    return out


def release(state_dir: Path) -> dict[str, Any]:
    desc = stack_description(state_dir)
    resp = requests.get(f"{desc['broker_url']}/v1/releases/{desc['release']}", timeout=3)
    resp.raise_for_status()
    return dict(resp.json())


# --------------------------------------------------------------------------- run folders


def record(**fields: Any) -> dict[str, Any]:
    """One load record (§7 schema) with sensible defaults."""
    row: dict[str, Any] = {name: None for name in LOAD_SCHEMA.names}
    row.update(
        run_id="t",
        request_id=f"r{random.random()}",
        ttft_s=0.1,
        e2e_s=0.5,
        prompt_tokens=100,
        planned_prompt_tokens=100,
        status=200,
        ok=True,
        served_by="baseline",
        stream=True,
    )
    row.update(fields)
    return row


def write_records(folder: Path, rows: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=LOAD_SCHEMA), path)
    return path


def write_load_state(folder: Path, state: str = "stopped", started_at: float = 0.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "load.json").write_text(
        json.dumps(
            {
                "state": state,
                "started_at": started_at,
                "records": str(folder / "records.parquet"),
            }
        )
    )


def ledger_entry(folder: Path, **fields: Any) -> FaultEntry:
    entry = FaultEntry(
        **{
            "action": "inject",
            "time": time.time(),
            "component": "model-canary",
            "replica": "model-canary-0",
            "url": "http://127.0.0.1:1",
            "kind": "kernel",
            "fault_id": "f1",
            "ttl_s": 60.0,
            "params": {"mode": "fp8-kv-scale", "min_prompt_tokens": 2048, "magnitude": 1.0},
            **fields,
        }
    )
    FaultLedger(folder / "faults.jsonl").append(entry)
    return entry


def slo_detail(out: Mapping[str, object]) -> dict[str, Any]:
    """An SLO result's ``detail`` (``status``, ``why`` and the probe's own figures) as a
    test reads it: JSON, each figure as the probe put it."""
    detail = out["detail"]
    assert isinstance(detail, dict), out
    return detail


# --------------------------------------------------------------------------- tiny chaos

TINY_ACTIVITIES = '''
"""Tiny activities for verdict tests (run by a real `chaos run`)."""
import os
import time
from pathlib import Path

from chaoslib.exceptions import ActivityFailed, InterruptExecution


def ok(configuration=None, secrets=None):
    return True


def not_ok(configuration=None, secrets=None):
    return False


def boom(configuration=None, secrets=None):
    raise ActivityFailed("expected the fault to be accepted, got HTTP 401")


def slow(seconds: float = 60, configuration=None, secrets=None):
    Path(os.environ["TINY_DIR"], "slow-started").write_text("x")
    time.sleep(seconds)
    return True


def mark(marker: str = "rolled-back", configuration=None, secrets=None):
    Path(os.environ["TINY_DIR"], marker).write_text("x")
    return True


def until_marked(configuration=None, secrets=None):
    return not Path(os.environ["TINY_DIR"], "marked").exists()


def slo(measured: float = 1.0, allowed: float = 2.0, configuration=None, secrets=None):
    return {"check": "tiny_s", "measured": measured, "allowed": allowed, "unit": "s",
            "ok": measured <= allowed, "detail": {}}


def before_method_control(context, configuration=None, secrets=None, **kwargs):
    raise InterruptExecution("the user load could not start")
'''


def tiny_activity(name: str, func: str, kind: str = "action", **arguments: Any) -> dict[str, Any]:
    act: dict[str, Any] = {
        "type": kind,
        "name": name,
        "provider": {"type": "python", "module": "tinyacts", "func": func},
    }
    if arguments:
        act["provider"]["arguments"] = arguments
    return act


def tiny_experiment(
    folder: Path,
    name: str,
    before: str = "ok",
    method: Sequence[dict[str, Any]] = (),
    control: bool = False,
    extension: bool = True,
) -> Path:
    """Write tinyacts.py and an experiment into ``folder``; returns the experiment path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tinyacts.py").write_text(TINY_ACTIVITIES)
    probe = tiny_activity("steady", before, kind="probe")
    probe["tolerance"] = True
    exp: dict[str, Any] = {
        "version": "1.0.0",
        "title": name,
        "description": "tiny",
        "runtime": {"rollbacks": {"strategy": "always"}},
        "steady-state-hypothesis": {"title": "tiny", "probes": [probe]},
        "method": list(method) or [tiny_activity("fine", "ok")],
        "rollbacks": [tiny_activity("undo", "mark")],
    }
    if extension:
        exp["extensions"] = [
            {"name": "gameday", "component": "control", "fault": "none", "expect": "no_trip"}
        ]
    if control:
        exp["controls"] = [{"name": "load", "provider": {"type": "python", "module": "tinyacts"}}]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path
