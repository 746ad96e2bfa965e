"""Synthetic run-folder files with the full §7 schemas: load and oracle records, journals.

Must never write outside the folder it is given, nor talk to anything; the same
arguments give the same files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gameday.load.buckets import DEFAULT_EDGES, bucket_labels
from gameday.load.records import LOAD_SCHEMA, ORACLE_SCHEMA

EDGES = np.array(DEFAULT_EDGES)
LABELS = np.array(bucket_labels(DEFAULT_EDGES), dtype=object)
BUCKET_WEIGHTS = np.array([0.40, 0.25, 0.15, 0.12, 0.08])
KERNEL_MIN_TOKENS = 2048


def bucket_of(tokens: np.ndarray) -> np.ndarray:
    return LABELS[np.searchsorted(EDGES, tokens, side="right")]


def _table(schema: pa.Schema, columns: Mapping[str, Any], defaults: Mapping[str, Any]) -> pa.Table:
    n = len(next(iter(columns.values())))
    arrays = []
    for f in schema:
        if f.name in columns:
            values = columns[f.name]
        else:
            d = defaults[f.name]
            values = d(n) if callable(d) else [d] * n
        arrays.append(pa.array(values, type=f.type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=schema)


def _error_kinds(ok: np.ndarray) -> np.ndarray:
    kinds = np.full(len(ok), None, dtype=object)
    kinds[~ok] = "http_status"
    return kinds


def write_records(
    path: Path, columns: Mapping[str, Sequence[Any] | np.ndarray], run_id: str = "run"
) -> None:
    """Load records with the full §7 schema; give at least start_time and served_by."""
    tokens = np.asarray(columns.get("prompt_tokens", [100] * len(columns["start_time"])))
    ok = np.asarray(columns.get("ok", [True] * len(tokens)), dtype=bool)
    defaults: dict[str, object] = {  # column -> a value, or n -> values
        "run_id": run_id,
        "request_id": lambda n: [f"req-{i}" for i in range(n)],
        "user_id": lambda n: [f"user-{i % 16}" for i in range(n)],
        "ttft_s": 0.1,
        "e2e_s": 1.0,
        "itl_mean_s": 0.01,
        "itl_p99_s": 0.02,
        "itl_max_s": 0.03,
        "prompt_tokens": lambda n: tokens,
        "completion_tokens": 64,
        "planned_prompt_tokens": lambda n: tokens,
        "status": lambda n: np.where(ok, 200, 500),
        "ok": lambda n: ok,
        "error_kind": lambda n: _error_kinds(ok),
        "model_version": None,
        "config_revision": "1",
        "router_id": "router-0",
        "bucket": lambda n: bucket_of(tokens),
        "endpoint": "/v1/completions",
        "stream": True,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_table(LOAD_SCHEMA, columns, defaults), path)


def write_oracle(
    path: Path, columns: Mapping[str, Sequence[Any] | np.ndarray], run_id: str = "run"
) -> None:
    """Oracle records with the full §7 schema; give at least time and kl_mean."""
    tokens = np.asarray(columns.get("prompt_tokens", [3000] * len(columns["time"])))
    defaults: dict[str, object] = {  # column -> a value, or n -> values
        "run_id": run_id,
        "request_id": lambda n: [f"pair-{i}" for i in range(n)],
        "bucket": lambda n: bucket_of(tokens),
        "prompt_tokens": lambda n: tokens,
        "positions": 16,
        "kl_first": lambda n: columns["kl_mean"],
        "top1_agree": 1.0,
        "baseline_version": "v1",
        "canary_version": "v2",
        "error": None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_table(ORACLE_SCHEMA, columns, defaults), path)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()


class SloOutput(TypedDict):
    """An SLO probe's output in a synthetic journal (docs/ARCHITECTURE.md §7.1)."""

    check: str
    measured: float
    allowed: float
    unit: str
    ok: bool
    detail: dict[str, object]


def slo_output(check: str, measured: float, allowed: float, unit: str = "s") -> SloOutput:
    return {
        "check": check,
        "measured": measured,
        "allowed": allowed,
        "unit": unit,
        "ok": measured <= allowed,
        "detail": {},
    }


def journal(
    title: str,
    component: str,
    fault: str,
    expect: str,
    start: float,
    end: float,
    slo: Mapping[str, float],
    outputs: Sequence[Mapping[str, object]] = (),
    status: str = "completed",
    deviated: bool = False,
    description: str = "",
) -> dict[str, object]:
    """A journal shaped like chaoslib's (``run.py: initialize_run_journal`` and after)."""

    def run_entry(name: str, output: object, kind: str = "probe") -> dict[str, object]:
        return {
            "activity": {
                "type": kind,
                "name": name,
                "provider": {"type": "python", "module": "probes.slo", "func": name},
            },
            "output": output,
            "start": iso(start),
            "status": "succeeded",
            "end": iso(end),
            "duration": end - start,
        }

    experiment = {
        "version": "1.0.0",
        "title": title,
        "description": description,
        "extensions": [
            {
                "name": "gameday",
                "component": component,
                "fault": fault,
                "expect": expect,
                "slo": dict(slo),
            }
        ],
        "steady-state-hypothesis": {"title": "stack healthy", "probes": []},
        "method": [],
        "rollbacks": [],
    }
    healthy = dict(run_entry("stack-healthy", True), tolerance_met=True)
    return {
        "chaoslib-version": "1.44.0",
        "platform": "synthetic",
        "node": "synthetic",
        "experiment": experiment,
        "start": iso(start),
        "status": status,
        "deviated": deviated,
        "steady_states": {
            "before": {"steady_state_met": True, "probes": [healthy]},
            "after": {"steady_state_met": not deviated, "probes": [healthy]},
            "during": [],
        },
        "run": [run_entry(f"check-{o['check']}", o) for o in outputs],
        "rollbacks": [],
        "end": iso(end),
        "duration": end - start,
    }
