"""Gate observers: what a release gate did, read from the parts of a stack that show it.

One small interface (``GateObserver.snapshot``) answers, at one moment: did the gate trip,
what canary weight is in force at every entry point, do pins still reach the canary, and
could the gate see. An ``ObservationLog`` keeps the snapshots of one experiment (a JSON-lines
file in its run folder), and ``history`` turns them into events shaped like canarystack's
broker history (``{"time", "actor", "change": {"phase": ...}}``), so every check, the
timeline and the report read a foreign gate exactly as they read ours:

- a trip is the first moment the gate's signal fired (a Prometheus alert's ``activeAt``,
  which Prometheus keeps, else the first snapshot that saw it), or the canary's weight
  reached 0 without one;
- weight 0 at every entry point is the first snapshot where every weighted route gives the
  canary 0 (a ``routers_applied`` annotation with ``canary_off_at``);
- the rollback is done when the weight is 0 after a trip (``rolled_back``).

A snapshot's times are as good as its polling: ``gameday run`` samples every
``SAMPLE_S`` for the whole experiment, and every probe that waits adds what it saw.

Backends: ``EnvoyAlertObserver`` (an alert in Prometheus is the trip; Envoy's weighted
clusters and the admin runtime that overrides them are the weights); on the Kubernetes API
(``gameday.observers.kubernetes``) an Argo Rollouts ``Rollout``, a Flagger ``Canary``, and
an ``HTTPRoute`` or Istio ``VirtualService``'s weights; canarystack's own gate from its
broker's history and its gate API (``gameday.observers.broker``).

This module only reads: it never changes a weight, an alert or a route.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

import requests

from canary_contract.json import JsonObject, record_json
from gameday.stackhttp import ApiError

__all__ = [
    "READ_TIMEOUT_S",
    "SAMPLE_S",
    "GateObserver",
    "GateSnapshot",
    "ObservationLog",
    "history",
    "release_now",
]

SAMPLE_S = 0.1
READ_TIMEOUT_S = 2.0


class SnapshotJson(TypedDict):
    """A ``GateSnapshot`` as the observation log's lines hold it."""

    time: float
    tripped: bool | None
    tripped_since: float | None
    canary_weight: float | None
    pins_to_canary: bool | None
    sees: bool | None
    why: list[str]
    signal: str


class ObservedEvent(TypedDict):
    """A snapshot history's event, shaped like the broker's (``history``): ``change`` is
    ``{"phase": {"old", "new"}, "trip": ...}``, ``{"weights": ...}`` or an annotation."""

    seq: int
    time: float
    actor: str
    change: Mapping[str, object]
    reason: str


class ObservedWeights(TypedDict):
    canary: float
    stable: float


class ObservedRelease(TypedDict):
    """The release as a broker would show it, from a gate's snapshots (``release_now``):
    ``weights`` when the weight was read, and the latest snapshot (``observed``)."""

    name: str
    phase: str
    revision: int
    weights: NotRequired[ObservedWeights]
    observed: SnapshotJson


@dataclass
class GateSnapshot:
    """What the gate's parts showed at ``time``. ``None``: that part did not answer."""

    time: float
    tripped: bool | None
    tripped_since: float | None  # when the gate's signal started (the source's own record)
    canary_weight: float | None  # percent of unpinned traffic to the canary, worst entry point
    pins_to_canary: bool | None
    sees: bool | None
    why: list[str] = field(default_factory=list)  # what could not be read, or why blind
    signal: str = ""  # which alert (or signal) fired

    def to_json(self) -> SnapshotJson:
        return record_json(self, SnapshotJson, why=list(self.why))

    @classmethod
    def from_json(cls, doc: JsonObject) -> GateSnapshot:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in names})


class GateObserver(ABC):
    """Reads a gate's state; ``name`` is what the events' ``actor`` says.

    Every check reads a gate through the four broker-shaped reads below (``release``,
    ``events``, ``routers``, ``gate_state``). A foreign gate answers them from its
    snapshots (``history``, ``release_now``); canarystack's gate keeps a history of its
    own, and ``gameday.observers.broker.BrokerObserver`` reads it from the broker.
    ``gate_api`` says whether the gate also answers canarystack's gate API (its noise
    floor and counters, ``gate_state``).
    """

    name: str
    log: ObservationLog
    gate_api: bool = False

    @abstractmethod
    def read(self, session: requests.Session) -> GateSnapshot:
        """What the gate's parts show now (never raises for a part that does not answer:
        that part is None and ``why`` says so)."""

    def snapshot(self, session: requests.Session) -> GateSnapshot:
        """``read``, kept in the log."""
        snap = self.read(session)
        self.log.append(snap)
        return snap

    # --- the broker-shaped reads -----------------------------------------------------
    def release(self, session: requests.Session, release: str) -> Mapping[str, object]:
        """The release as a broker would show it (phase, weights), from what was seen."""
        snap = self.snapshot(session)
        return release_now(self.log.snapshots(), snap, release)

    def events(
        self, session: requests.Session, after_seq: int = 0
    ) -> Sequence[Mapping[str, object]]:
        """The release's history after ``after_seq``, oldest first (``history``)."""
        self.snapshot(session)
        events = history(self.log.snapshots(), self.name)
        return [e for e in events if e["seq"] > after_seq]

    def routers(self, session: requests.Session) -> Sequence[Mapping[str, object]]:
        """The entry points that report themselves (heartbeats); none here: a foreign
        gate's snapshot reads every entry point's weight itself."""
        return []

    def gate_state(self, session: requests.Session) -> Mapping[str, object]:
        """canarystack's gate API answer; ApiError (404, not applicable) for a gate
        without it."""
        raise ApiError(
            f"not applicable: the gate read by {self.name!r} has no canarystack gate API "
            "(its noise floor and counters)",
            self.name,
            404,
        )

    def where(self) -> str:
        """Where the gate is read (failure messages): the observer's name, or a URL."""
        return self.name

    def summary(self, session: requests.Session) -> str:
        """One line on what the gate shows now (failure messages)."""
        snap = self.snapshot(session)
        firing = f"{snap.signal} firing" if snap.tripped else "no alert firing"
        seen = "it can see" if snap.sees else f"it cannot see ({'; '.join(snap.why)})"
        return f"the gate ({self.name}): {firing}, canary weight {snap.canary_weight}%, {seen}"


class ObservationLog:
    """Snapshots of one experiment: a JSON-lines file when ``path`` is given (shared by
    ``gameday run``'s sampler and the probes of ``chaos run``), else in memory."""

    _lock = threading.Lock()

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: list[GateSnapshot] = []

    def append(self, snap: GateSnapshot) -> None:
        if self.path is None:
            self._memory.append(snap)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(snap.to_json(), sort_keys=True) + "\n")

    def snapshots(self) -> list[GateSnapshot]:
        if self.path is None:
            return list(self._memory)
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash: the others stand
            if isinstance(doc, dict):
                out.append(GateSnapshot.from_json(doc))
        return sorted(out, key=lambda s: s.time)


def _event(
    seq: int, t: float, actor: str, change: Mapping[str, object], reason: str
) -> ObservedEvent:
    return {"seq": seq, "time": t, "actor": actor, "change": change, "reason": reason}


def history(snaps: list[GateSnapshot], actor: str) -> list[ObservedEvent]:
    """The snapshots as broker-shaped events, oldest first (module docstring)."""
    events: list[ObservedEvent] = []
    trip_t: float | None = None
    trip_signal = ""
    off_t: float | None = None
    for s in snaps:
        if s.tripped and trip_t is None:
            trip_t = min(s.time, s.tripped_since or s.time)
            trip_signal = s.signal
        if s.canary_weight == 0 and off_t is None:
            off_t = s.time
    if off_t is not None and (trip_t is None or off_t < trip_t):
        trip_t, trip_signal = off_t, trip_signal or "canary weight set to 0"
    if trip_t is not None:
        trip = {"test": trip_signal or "gate signal", "bucket": None, "samples": None}
        change = {"phase": {"old": "progressing", "new": "tripped"}, "trip": trip}
        events.append(_event(0, trip_t, actor, change, f"{trip_signal} fired"))
    if off_t is not None:
        routers = {"annotation": "routers_applied", "canary_off_at": off_t}
        events.append(_event(0, off_t, actor, {"weights": {"canary": 0}}, "canary weight 0"))
        events.append(_event(0, off_t, actor, routers, "every entry point gives the canary 0"))
        done = {"phase": {"old": "tripped", "new": "rolled_back"}}
        events.append(_event(0, off_t, actor, done, "canary weight 0 after the trip"))
    events.sort(key=lambda e: e["time"])
    for i, e in enumerate(events, start=1):
        e["seq"] = i
    return events


def _new_phase(event: ObservedEvent) -> str | None:
    """The phase an event of ``history`` sets, if any."""
    change = event["change"].get("phase")
    new = change.get("new") if isinstance(change, dict) else None
    return new if isinstance(new, str) else None


def release_now(snaps: list[GateSnapshot], latest: GateSnapshot, release: str) -> ObservedRelease:
    """The release as the broker would show it: phase and weights, from the log."""
    events = history([*snaps, latest], "observer")
    phases = [p for p in map(_new_phase, events) if p is not None]
    phase = phases[-1] if phases else "progressing"
    weight = latest.canary_weight
    observed = latest.to_json()
    if weight is None:
        return {"name": release, "phase": phase, "revision": len(events), "observed": observed}
    weights: ObservedWeights = {"canary": weight, "stable": 100 - weight}
    return {"name": release, "phase": phase, "revision": len(events), "weights": weights,
            "observed": observed}  # fmt: skip
