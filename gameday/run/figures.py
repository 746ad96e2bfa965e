"""What one experiment's folder says beside its verdict: why it is inconclusive, its figures.

This module only reads the folder; it must never write into it or reach the stack.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from canary_contract.json import JsonValue
from gameday.evidence.noise_floor import NOISE_WAIT_NAME, noise_wait_reasons
from gameday.run.collect import read_json
from gameday.run.result import EvidenceFigures, GateFigures
from gameday.run.sufficiency import (
    GATE_EVIDENCE_NAME,
    GATE_START_NAME,
    gate_reasons,
    kernel_min_prompt_tokens,
    load_reasons,
    since_start,
)
from gameday.run.verdict import Evidence, gameday_extension


def _noise_wait_reasons(folder: Path) -> list[str]:
    """No noise floor before the fault (the drift test judged against none), or a wait
    record that cannot be read (fail-closed); nothing when the experiment did not wait."""
    path = folder / NOISE_WAIT_NAME
    if not path.exists():
        return []
    doc = read_json(path)
    if doc is None:
        return [
            f"{NOISE_WAIT_NAME} could not be read: whether the gate had a noise floor is unknown"
        ]
    return noise_wait_reasons(doc)


def inconclusive_reasons(folder: Path, ev: Evidence) -> list[str]:
    """Why the gate could not have seen, or the load is not valid (empty: the evidence
    suffices). Reads gate-evidence.json, load.json and the fault ledger of ``folder``."""
    ext = gameday_extension((ev.journal or {}).get("experiment")) or {}
    expect = ext.get("expect")
    tripped = bool(ev.trips_in_window)
    try:
        gate_doc: Mapping[str, object] | None = read_json(folder / GATE_EVIDENCE_NAME)
        if gate_doc is not None:
            gate_doc = since_start(gate_doc, read_json(folder / GATE_START_NAME))
        reasons = gate_reasons(gate_doc, expect, tripped, kernel_min_prompt_tokens(folder))
        reasons += _noise_wait_reasons(folder)
    except ValueError as exc:
        reasons = [f"the gate's evidence could not be judged: {exc}"]
    return [*reasons, *load_reasons(read_json(folder / "load.json"))]


def evidence_figures(folder: Path) -> EvidenceFigures:
    """What the report shows beside the verdict: the gate's counters and the load's check."""
    gate: Mapping[str, object] = read_json(folder / GATE_EVIDENCE_NAME) or {}
    if gate:
        gate = since_start(gate, read_json(folder / GATE_START_NAME))
    load: Mapping[str, object] = read_json(folder / "load.json") or {}
    summary = load.get("summary")
    summary = summary if isinstance(summary, dict) else {}
    generator = summary.get("generator")
    gate_figures: GateFigures | None = None
    if gate:
        gate_figures = {
            "ok": gate.get("ok"),
            "comparisons": gate.get("comparisons"),
            "canary_outcomes": gate.get("canary_outcomes"),
            "thresholds": gate.get("thresholds"),
            "source": gate.get("source"),
            "error": gate.get("error"),
            "counted_from": gate.get("counted_from"),
        }
    return {
        "gate": gate_figures,
        "load": generator if isinstance(generator, dict) else None,
        # Load from worker pods (or processes): every worker's records, by worker.
        "load_workers": summary.get("records_by_worker") or None,
    }


class EvidenceBrief(TypedDict):
    """The evidence's headline numbers in ``result.json``, as the gate and Locust wrote
    them (None where not read)."""

    gate_comparisons: object
    gate_canary_outcomes: object
    load_rps: object
    load_cpu: object


def evidence_brief(evidence: EvidenceFigures) -> EvidenceBrief:
    """The evidence's headline numbers for the terminal (gameday.run.cli FIGURES)."""
    gate = evidence["gate"]
    load = evidence["load"] or {}
    return {
        "gate_comparisons": gate["comparisons"] if gate else None,
        "gate_canary_outcomes": gate["canary_outcomes"] if gate else None,
        "load_rps": load.get("achieved_rps"),
        "load_cpu": load.get("cpu_fraction"),
    }


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def experiment_window(journal: Mapping[str, object], folder: Path) -> tuple[float, float]:
    """The experiment's time window, from its journal (else the folder's creation)."""
    start = _epoch(journal.get("start"))
    end = _epoch(journal.get("end"))
    if start is None:
        start = (folder / "experiment.yaml").stat().st_mtime
    return float(start), float(end if end is not None else time.time())


def figures(journal: Mapping[str, object] | None, rows: int | None) -> dict[str, object]:
    """Key figures for the terminal: every SLO result after the method, and trip time."""
    out: dict[str, object] = {"requests": rows}
    if not journal:
        return out
    # journal.json's parts as decoded, read as they always were (a part of another type
    # than chaos writes raises here)
    steady_states: JsonValue = journal.get("steady_states")
    after = (steady_states or {}).get("after") or {}
    for run in after.get("probes") or []:
        o = run.get("output") if isinstance(run, dict) else None
        if isinstance(o, dict) and {"check", "measured"} <= set(o):
            out[str(o["check"])] = o.get("measured")
            detail = o.get("detail") or {}
            if o["check"] == "error_rate":
                out["failed_requests"] = detail.get("failed")
            if o["check"] == "rollback_s":
                out["canary_requests_after_fault"] = detail.get("canary_requests_after_fault")
    runs: JsonValue = journal.get("run")
    for run in runs or []:
        act = (run or {}).get("activity") or {}
        if (act.get("provider") or {}).get("func") == "wait_for_trip" and isinstance(
            run.get("output"), int | float
        ):
            out["time_to_trip_s"] = run["output"]
    return out
