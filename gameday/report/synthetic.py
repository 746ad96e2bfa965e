"""Synthetic run folders that follow the contracts (docs/ARCHITECTURE.md §7, §7.1).

For the report's tests and ``bench/report_speed.py``; the records' writers live in
``synthetic_files``, the broker's events and the fault ledger in ``synthetic_events``.
Generated from a seed (the same arguments give the same files); it must never write
outside the folder it is given nor talk to anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gameday.load.buckets import DEFAULT_EDGES
from gameday.load.records import LOAD_SCHEMA as LOAD_SCHEMA
from gameday.report.synthetic_events import (
    BrokerEvent,
    LedgerLine,
    broker_event,
    changed,
    fault_injected,
    fault_ledger,
    trip_events,
)
from gameday.report.synthetic_events import routers_applied as routers_applied
from gameday.report.synthetic_files import (
    BUCKET_WEIGHTS,
    KERNEL_MIN_TOKENS,
    LABELS,
    SloOutput,
    journal,
    slo_output,
    write_oracle,
    write_records,
)
from gameday.report.synthetic_files import iso as iso


@dataclass
class Scenario:
    name: str
    component: str
    fault: str  # latency | pod-kill | faulty-kernel | none
    expect: str  # trip | no_trip
    trips: bool
    detection_s: float = 2.0
    title: str = ""


def game_day() -> list[Scenario]:
    out = [
        Scenario("control", "control", "none", "no_trip", False, title="Control: healthy canary")
    ]
    for component in ("router", "broker", "rollback"):
        out.append(
            Scenario(
                f"{component}-latency",
                component,
                "latency",
                "no_trip",
                False,
                title=f"{component} slowed, healthy canary: no trip",
            )
        )
        out.append(
            Scenario(
                f"{component}-pod-kill",
                component,
                "pod-kill",
                "trip",
                True,
                2.5,
                title=f"{component} pod killed while the canary turns faulty",
            )
        )
        out.append(
            Scenario(
                f"{component}-faulty-kernel",
                component,
                "faulty-kernel",
                "trip",
                True,
                1.8,
                title=f"faulty kernel while the {component} is slowed",
            )
        )
    return out


SLO = {"detection_s": 5.0, "weights_applied_s": 5.0, "rollback_s": 5.0, "rollback_complete_s": 30.0}


def write_experiment(
    folder: Path,
    sc: Scenario,
    start: float,
    n_requests: int,
    oracle_share: float,
    rng: np.random.Generator,
    run_id: str,
    duration_s: float = 90.0,
    fault_after_s: float = 30.0,
) -> None:
    """One experiment's folder: load and oracle records, fault ledger, broker timeline,
    journal and result.json."""
    folder.mkdir(parents=True, exist_ok=True)
    end = start + duration_s
    fault_t = start + fault_after_s if sc.fault != "none" else None
    kernel = sc.fault in ("faulty-kernel", "pod-kill")
    # A control run that trips (a false trip) trips as long after its start as the others.
    trip_t = (fault_t or start + fault_after_s) + sc.detection_s if sc.trips else None
    applied_t = trip_t + 0.6 if trip_t else None

    # Load records.
    n = n_requests
    ok = _write_load_records(folder, sc.fault, start, end, fault_t, applied_t, n, rng, run_id)

    # Oracle pairs.
    m = max(int(n * oracle_share), 1)
    ot = np.sort(rng.uniform(start, end, m))
    otok = rng.integers(64, 8192, m)
    kl = rng.gamma(4.0, 0.0025, m)
    if kernel and fault_t is not None:
        kl = kl + np.where((ot >= fault_t) & (otok >= KERNEL_MIN_TOKENS), 0.15 * otok / 4096, 0.0)
    write_oracle(
        folder / "oracle.parquet", {"time": ot, "prompt_tokens": otok, "kl_mean": kl}, run_id
    )

    # Fault ledger.
    ledger: list[LedgerLine] = []
    if fault_t is not None:
        ledger = fault_ledger(sc.fault, sc.component, fault_t, end, kernel)
    (folder / "faults.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))

    # Broker timeline.
    events: list[BrokerEvent] = [
        broker_event(
            1, start - 600, 1, "setup", "an earlier run", changed("phase", None, "progressing")
        ),
        broker_event(
            2, start - 590, 2, "gate", "an earlier run", changed("phase", "progressing", "tripped")
        ),
    ]
    if fault_t is not None:
        component, kind = ("model-canary", "kernel") if kernel else (sc.component, "latency")
        events.append(
            broker_event(3, fault_t, 5, "gameday", "fault", fault_injected(component, kind))
        )
    if trip_t is not None and applied_t is not None:
        events += trip_events(trip_t, applied_t, sc.detection_s)
    (folder / "timeline.json").write_text(
        json.dumps({"release": "default", "events": events, "routers": [], "collected_at": end})
    )

    outputs = []
    if sc.expect == "trip" and trip_t is not None and fault_t is not None:
        outputs.append(slo_output("detection_s", trip_t - fault_t, SLO["detection_s"]))
    outputs.append(slo_output("error_rate", float((~ok).mean()), 0.02, "ratio"))
    _write_journal(folder, sc, start, end, outputs)


def _write_load_records(
    folder: Path,
    fault: str,
    start: float,
    end: float,
    fault_t: float | None,
    applied_t: float | None,
    n: int,
    rng: np.random.Generator,
    run_id: str,
) -> np.ndarray:
    """``records.parquet``: ``n`` requests from ``start`` to ``end``, 5 % to the canary
    until the routers applied the rollback (``applied_t``), slowed for 30 s after a latency
    fault; returns which requests were ok."""
    t = np.sort(rng.uniform(start, end, n))
    b = rng.choice(len(LABELS), size=n, p=BUCKET_WEIGHTS)
    lo = np.array([1, *DEFAULT_EDGES])[b]
    hi = np.array([*DEFAULT_EDGES, 2 * DEFAULT_EDGES[-1]])[b]
    tokens = (lo + rng.random(n) * (hi - lo)).astype(np.int64)
    canary = rng.random(n) < 0.05
    if applied_t is not None:
        canary &= t < applied_t
    ok = rng.random(n) > 0.005
    served = np.where(canary, "canary", "baseline").astype(object)
    served[~ok & (rng.random(n) < 0.3)] = ""
    ttft = 0.03 + tokens * 1.5e-4 + rng.lognormal(-4, 0.5, n)
    if fault == "latency" and fault_t is not None:
        ttft = ttft + np.where((t >= fault_t) & (t < fault_t + 30), 0.2, 0.0)
    write_records(
        folder / "records.parquet",
        {
            "start_time": t,
            "served_by": served,
            "prompt_tokens": tokens,
            "ok": ok,
            "ttft_s": np.where(ok, ttft, np.nan),
            "e2e_s": ttft + 0.64,
            "model_version": np.where(canary, "v2", "v1"),
        },
        run_id=run_id,
    )
    return ok


def _write_journal(
    folder: Path, sc: Scenario, start: float, end: float, outputs: list[SloOutput]
) -> None:
    """The Chaos-Toolkit-shaped ``journal.json`` (with the SLO ``outputs``) and
    ``result.json`` of scenario ``sc``, run from ``start`` to ``end``."""
    (folder / "journal.json").write_text(
        json.dumps(
            journal(
                sc.title or sc.name,
                sc.component,
                sc.fault,
                sc.expect,
                start,
                end,
                SLO,
                outputs,
                description=f"Synthetic {sc.name}: {sc.title}.",
            )
        )
    )
    (folder / "result.json").write_text(
        json.dumps(
            {
                "experiment": sc.name,
                "verdict": "pass",
                "reasons": [],
                "chaos_exit_code": 0,
                "started_at": start,
                "ended_at": end,
            }
        )
    )


def write_run(
    root: Path,
    scenarios: Sequence[Scenario] | None = None,
    requests_per_experiment: int = 2000,
    oracle_share: float = 0.05,
    seed: int = 7,
    run_id: str = "synthetic",
    start: float = 1_700_000_000.0,
) -> Path:
    """A whole run folder under ``root`` (created); returns it.

    By default a game day (``game_day()``): the control run plus router, broker and
    rollback under latency, pod-kill and faulty-kernel, with load records, oracle records,
    fault ledgers, broker timelines (changes in the broker's ``{"old", "new"}`` form),
    Chaos-Toolkit-shaped journals and result.json files, vectorised with numpy.
    """
    scenarios = list(scenarios) if scenarios is not None else game_day()
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i, sc in enumerate(scenarios):
        write_experiment(
            root / sc.name,
            sc,
            start + 120.0 * i,
            requests_per_experiment,
            oracle_share,
            rng,
            run_id,
        )
    (root / "run.json").write_text(
        json.dumps(
            {"run_id": run_id, "experiments": [sc.name for sc in scenarios], "started_at": start}
        )
    )
    return root


def write_campaign(
    root: Path,
    trip_times: Mapping[str, Sequence[float | None]],
    scenarios: Sequence[Scenario] | None = None,
    certify: bool = False,
    requests_per_experiment: int = 300,
    seed: int = 7,
    run_id: str = "synthetic-campaign",
    start: float = 1_700_000_000.0,
) -> Path:
    """A campaign folder as ``gameday run --repeat N`` leaves it: run ``k`` of scenario
    ``name`` in ``name@rKK``, tripping ``trip_times[name][k - 1]`` seconds after its fault
    (None: no trip); a scenario not in ``trip_times`` repeats as itself. N is the longest
    list. run.json carries the campaign (repeat, certify, the load seed of each run)."""
    from dataclasses import replace

    scenarios = list(scenarios) if scenarios is not None else game_day()
    repeat = max((len(v) for v in trip_times.values()), default=1)
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    i = 0
    for k in range(1, repeat + 1):
        for sc in scenarios:
            name = f"{sc.name}@r{k:02d}"
            times = trip_times.get(sc.name)
            run = sc
            if times is not None:
                t = times[k - 1] if k <= len(times) else None
                run = replace(sc, trips=t is not None, detection_s=t if t is not None else 0.0)
            run = replace(run, name=name)
            write_experiment(
                root / name, run, start + 120.0 * i, requests_per_experiment, 0.05, rng, run_id
            )
            names.append(name)
            i += 1
    (root / "run.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "experiments": names,
                "started_at": start,
                "campaign": {
                    "repeat": repeat,
                    "certify": certify,
                    "first_load_seed": 0,
                    "load_seeds": {n: int(n.rsplit("@r", 1)[1]) - 1 for n in names},
                    "order": "round-robin: round k runs every experiment once, with seed "
                    "first_load_seed + k - 1",
                },
            }
        )
    )
    return root
