"""Hand-made run folders for the report tests, where every number is known in advance.

``hand_made_experiment`` writes one experiment whose timeline is (seconds since the
fault at ``FAULT``): latency injected on the router at -0.5, kernel fault on
model-canary at 0, an oracle pair below the drift threshold at +0.5 and the first above
it at +1.2, the gate's trip at +2.5 (its evidence says first_sample_time +0.9), canary
weight 0 at +2.6, routers_applied at +3.4, the last canary-served request at +3.0,
rolled_back at +3.9. An older trip from a previous experiment (before the journal's
start) must be ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gameday.report.synthetic import iso, routers_applied
from gameday.report.synthetic_events import BrokerEvent, broker_event, changed, fault_injected
from gameday.report.synthetic_files import journal, slo_output, write_oracle, write_records

FAULT = 1_700_000_100.0
START = FAULT - 30.0
END = FAULT + 30.0

EXPECTED_SINCE_FAULT = {
    "fault_injected": 0.0,
    "first_drifted_sample": 1.2,
    "gate_tripped": 2.5,
    "weights_applied": 3.4,
    "last_canary_request": 3.0,
    "rollback_complete": 3.9,
}


def hand_made_events(plain: bool = False) -> list[BrokerEvent]:
    """Broker events; ``plain`` writes changes as ``{"phase": "tripped"}`` instead."""

    def change(key: str, old: Any, new: Any) -> dict[str, Any]:
        return {key: new} if plain else changed(key, old, new)

    evidence = {
        "test": "drift",
        "bucket": "2k-4k",
        "statistic": 0.08,
        "threshold": 0.03,
        "samples": 9,
        "first_sample_time": FAULT + 0.9,
        "last_sample_time": FAULT + 2.4,
        "tripped_at": FAULT + 2.5,
        "detail": {},
    }
    tripped = {**change("phase", "progressing", "tripped"), **change("trip", None, evidence)}
    zeroed = {**change("phase", "tripped", "rolling_back"), **change("weights.canary", 5, 0)}
    return [
        broker_event(
            1, START - 500, 3, "gate", "older run", change("phase", "progressing", "tripped")
        ),
        broker_event(
            2, START - 499, 4, "rollback", "older run", change("phase", "tripped", "rolled_back")
        ),
        broker_event(3, FAULT, 5, "gameday", "fault", fault_injected("model-canary", "kernel")),
        broker_event(4, FAULT + 2.5, 6, "gate", "drift", tripped),
        broker_event(5, FAULT + 2.6, 7, "rollback", "zero", zeroed),
        broker_event(6, FAULT + 3.4, 7, "rollback", "applied", routers_applied(7, 0.8, 1)),
        broker_event(
            7, FAULT + 3.9, 8, "rollback", "done", change("phase", "rolling_back", "rolled_back")
        ),
    ]


def hand_made_faults() -> list[dict[str, Any]]:
    def entry(action: str, t: float, component: str, kind: str) -> dict[str, Any]:
        return {
            "action": action,
            "time": t,
            "component": component,
            "replica": f"{component}-0",
            "url": "http://127.0.0.1:1",
            "kind": kind,
            "fault_id": f"{kind}-{t}",
            "ttl_s": 60.0,
            "params": {},
            "detail": {},
        }

    return [
        entry("inject", FAULT - 0.5, "router", "latency"),
        entry("inject", FAULT, "model-canary", "kernel"),
        entry("clear", FAULT + 20, "router", "latency"),
    ]


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def hand_made_experiment(
    root: Path,
    name: str = "router-faulty-kernel",
    *,
    component: str = "router",
    fault: str = "faulty-kernel",
    expect: str = "trip",
    slo: dict[str, float] | None = None,
    events: list[BrokerEvent] | None = None,
    status: str = "completed",
    verdict: str = "pass",
    outputs: list[dict[str, Any]] | None = None,
) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    slo = (
        slo
        if slo is not None
        else {
            "detection_s": 3.0,
            "weights_applied_s": 5.0,
            "rollback_s": 5.0,
            "rollback_complete_s": 10.0,
        }
    )
    write_json(
        folder / "journal.json",
        journal(
            f"{name}: the title",
            component,
            fault,
            expect,
            START,
            END,
            slo,
            outputs if outputs is not None else [slo_output("error_rate", 0.01, 0.02, "ratio")],
            status=status,
            description=f"What {name} does, in words.",
        ),
    )
    write_json(
        folder / "result.json",
        {
            "experiment": name,
            "verdict": verdict,
            "reasons": [],
            "chaos_exit_code": 0,
            "started_at": START,
            "ended_at": END,
        },
    )
    write_json(
        folder / "timeline.json",
        {
            "release": "default",
            "events": events if events is not None else hand_made_events(),
            "routers": [],
            "collected_at": END,
        },
    )
    (folder / "faults.jsonl").write_text("".join(json.dumps(e) + "\n" for e in hand_made_faults()))
    # Canary-served requests: one before the fault, at +1.0 and the last at +3.0.
    write_records(
        folder / "records.parquet",
        {
            "start_time": [
                FAULT - 5,
                FAULT - 1,
                FAULT + 1.0,
                FAULT + 3.0,
                FAULT + 4.0,
                FAULT + 6.0,
            ],
            "served_by": ["canary", "baseline", "canary", "canary", "baseline", "baseline"],
            "prompt_tokens": [3000, 100, 3000, 2500, 100, 600],
            "ttft_s": [0.4, 0.05, 0.5, 0.45, 0.06, 0.1],
        },
    )
    write_oracle(
        folder / "oracle.parquet",
        {
            "time": [FAULT - 3, FAULT + 0.5, FAULT + 1.2, FAULT + 1.5, FAULT + 2.0],
            "kl_mean": [0.2, 0.01, 0.09, 0.3, 0.5],
            "prompt_tokens": [3000, 3000, 3000, 3000, 3000],
            "error": [None, None, None, "timeout", None],
        },
    )
    return folder


def start_iso() -> str:
    return iso(START)
