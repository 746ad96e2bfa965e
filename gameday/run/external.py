"""What ``gameday run`` does for a stack it did not build (``kind: external``).

- ``prepare``: the target file's command that brings the stack to its starting state,
  run before each experiment with its timeout (a fresh reference stack, a redeploy);
- ``Sampler``: the gate observer read every ``SAMPLE_S`` for the whole experiment, into
  the run folder's ``observations.jsonl`` (a foreign gate keeps no history the harness can
  read afterwards: Envoy's runtime has none);
- ``observed_gate_evidence``: what the gate had to see, from the harness's own records
  (canary-served requests, and the oracle's pinned pairs per bucket), in the shape of
  ``gate-evidence.json``, so an alert that never tripped while drifted answers were
  served is judged a miss, not "the gate's counters could not be read".

This module never stops a process it did not start, and runs only the command the
target file states.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Literal, TypedDict, cast

import requests

from canary_contract.buckets import bucket_of
from canary_contract.json import JsonObject
from gameday.atomic import write_json
from gameday.observers import SAMPLE_S
from gameday.run.sufficiency import GATE_EVIDENCE_NAME, BucketCounts, Thresholds
from gameday.targets import Target, TargetError
from gameday.targets.external import ExternalTarget

__all__ = [
    "OBSERVATIONS_NAME",
    "Sampler",
    "exposed_answers",
    "observed_gate_evidence",
    "prepare",
]

OBSERVATIONS_NAME = "observations.jsonl"


def prepare(target: Target, folder: Path) -> None:
    """Run the target's ``prepare.command`` (output to ``prepare.log`` in ``folder``);
    TargetError naming the command when it fails or overruns."""
    if not isinstance(target, ExternalTarget) or target.spec.prepare is None:
        return
    spec = target.spec.prepare
    log = folder / "prepare.log"
    t0 = time.monotonic()
    with log.open("w") as out:
        try:
            done = subprocess.run(
                spec.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=spec.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TargetError(
                f"target {target.name!r}: prepare command {spec.command} did not finish in "
                f"{spec.timeout_s:g} s (prepare.timeout_s); see {log}"
            ) from None
        except OSError as exc:
            raise TargetError(
                f"target {target.name!r}: prepare command {spec.command} could not start: "
                f"{exc.strerror}"
            ) from None
    if done.returncode != 0:
        raise TargetError(
            f"target {target.name!r}: prepare command {spec.command} exited "
            f"{done.returncode}; see {log}"
        )
    with log.open("a") as out:
        out.write(f"# prepared in {time.monotonic() - t0:.2f} s\n")


class Sampler:
    """Reads the target's gate observer every ``SAMPLE_S`` in a thread of its own, until
    stopped; nothing for a target without an observer."""

    def __init__(self, target: Target | None) -> None:
        self.target = target if isinstance(target, ExternalTarget) else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        if self.target is not None and self.target.spec.observer is not None:
            self._thread = threading.Thread(target=self._loop, name="gate-sampler", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        assert self.target is not None
        observer = self.target.observer()
        with requests.Session() as session:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    observer.snapshot(session)
                except (OSError, TargetError):
                    pass  # the snapshot says what did not answer; a full disk stops nothing
                self._stop.wait(max(0.0, SAMPLE_S - (time.monotonic() - t0)))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _load_frame(folder: Path, name: str) -> list[JsonObject]:
    import pyarrow.parquet as pq

    path = folder / name
    if not path.exists():
        return []
    try:
        rows: list[JsonObject] = pq.read_table(path).to_pylist()
        return rows
    except (OSError, ValueError):
        return []


class ObservedEvidence(TypedDict):
    """``gate-evidence.json`` as ``observed_gate_evidence`` writes it for a foreign gate."""

    ok: Literal[True]
    state: str
    source: str
    buckets: dict[str, BucketCounts]
    comparisons: int
    canary_outcomes: int
    oracle_pairs: int
    read_at: float
    thresholds: dict[str, int]


def observed_gate_evidence(
    target: Target, folder: Path, limits: Thresholds, started: float
) -> ObservedEvidence | None:
    """``gate-evidence.json`` for a foreign gate (None for canarystack's own): per bucket,
    the canary-served requests users made (``canary_outcomes``, and ``comparisons``: each
    canary answer a user got is one the gate could have judged), counted from
    ``started``; the oracle's pinned pairs beside them (``oracle_pairs``)."""
    if not isinstance(target, ExternalTarget):
        return None
    buckets: dict[str, BucketCounts] = {}

    def bucket(row: JsonObject) -> BucketCounts:
        tokens = row.get("prompt_tokens") or row.get("planned_prompt_tokens") or 0
        label = str(row.get("bucket") or bucket_of(int(tokens or 0)))
        return buckets.setdefault(
            label,
            {
                "comparisons": 0,
                "noise_comparisons": 0,
                "canary_outcomes": 0,
                "baseline_outcomes": 0,
            },
        )

    for row in _load_frame(folder, "records.parquet"):
        if float(row.get("start_time") or 0) < started:
            continue
        served = row.get("served_by")
        if served in ("canary", "baseline"):
            counts = bucket(row)
            if served == "canary":
                counts["canary_outcomes"] += 1
            else:
                counts["baseline_outcomes"] += 1
            # Every canary answer a user got is one the gate could have judged.
            counts["comparisons"] += served == "canary"
    oracle = sum(
        1 for row in _load_frame(folder, "oracle.parquet") if float(row.get("time") or 0) >= started
    )
    doc: ObservedEvidence = {
        "ok": True,
        "state": "observed",
        "source": "gameday run (the harness's own records: a foreign gate keeps no counters)",
        "buckets": buckets,
        "comparisons": sum(b["comparisons"] for b in buckets.values()),
        "canary_outcomes": sum(b["canary_outcomes"] for b in buckets.values()),
        "oracle_pairs": oracle,
        "read_at": time.time(),
        # A foreign gate compares nothing itself: one canary answer served to a user in
        # the fault's buckets is evidence it had to act on (min_comparisons 1); the canary
        # must still have had traffic (min_canary_outcomes as for canarystack).
        "thresholds": {**limits.to_json(), "min_comparisons": 1},
    }
    write_json(folder / GATE_EVIDENCE_NAME, doc)
    return doc


def exposed_answers(folder: Path) -> int | None:
    """How many answers users got from the faulty canary after its fault (canary-served
    requests that started after the first canary fault of the run's ledger; for a kernel
    fault only prompts at or above its ``min_prompt_tokens``, the ones it harms). None when
    the ledger holds no fault on the canary (nothing to be exposed to)."""
    from gameday.faults import FaultLedger

    try:
        entries = FaultLedger(folder / "faults.jsonl").entries()
    except (OSError, ValueError):
        return None
    bad = next(
        (
            e
            for e in entries
            if e.action == "inject"
            and e.component == "model-canary"
            and e.kind in ("kernel", "errors", "hang")
        ),
        None,
    )
    if bad is None:
        return None
    # int() of what the ledger holds, as ever (a value it cannot take raises)
    floor = (
        int(cast("str | float", (bad.params or {}).get("min_prompt_tokens") or 0))
        if bad.kind == "kernel"
        else 0
    )
    count = 0
    for row in _load_frame(folder, "records.parquet"):
        tokens = row.get("prompt_tokens") or row.get("planned_prompt_tokens") or 0
        if (
            row.get("served_by") == "canary"
            and float(row.get("start_time") or 0) >= bad.time
            and int(tokens) >= floor
        ):
            count += 1
    return count
