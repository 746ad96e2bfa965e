"""One experiment's timeline: from the fault to the completed rollback, against the SLOs.

Over 400 lines because it is one idea: each milestone, where its time came from, and the
SLO checks measured on them. It computes; it must never read files or draw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import pandas as pd

from canary_contract.json import record_json
from gameday.evidence.events import (
    annotation_events,
    event_time,
    first_phase,
    new_value,
    phase_events,
)
from gameday.evidence.faults import reference_fault
from gameday.evidence.milestones import last_canary_request, weights_applied
from gameday.report.loader import ExperimentData, parse_time

DEFAULT_DRIFT_KL = 0.05  # nats; a healthy canary of the reference stack shows ~0.01
DEFAULT_SLO_S: dict[str, float] = {
    "detection_s": 5.0,
    "weights_applied_s": 5.0,  # DESIGN.md §4: weight 0 applied at every router, p95 <= 5 s
    "rollback_s": 5.0,
    "rollback_complete_s": 30.0,
}
# Events a few seconds before the journal's start still belong to the experiment (the
# harness may annotate while Chaos Toolkit starts up).
WINDOW_SLACK_S = 2.0

MILESTONES: tuple[tuple[str, str, str | None], ...] = (
    ("fault_injected", "fault injected", None),
    ("first_drifted_sample", "first drifted sample", None),
    ("gate_tripped", "gate trip", "detection_s"),
    ("weights_applied", "weights applied at every router", "weights_applied_s"),
    ("last_canary_request", "last canary-served request", "rollback_s"),
    ("rollback_complete", "rollback complete", "rollback_complete_s"),
)


# A broker event of timeline.json as decoded, its ``time`` parsed to epoch seconds.
Event = Mapping[str, object]
# Where a milestone's time came from, beyond its source sentence (open keys: the
# routers_applied annotation's, the oracle record's, the trip evidence).
Detail = Mapping[str, object]
# A milestone's time, the sentence saying where it came from, and its detail.
Found = tuple[float | None, str, Detail]


class MilestoneJson(TypedDict):
    """A milestone in timeline.json (``Milestone``'s fields, ``slo_key`` as ``slo``)."""

    name: str
    label: str
    time: float | None
    since_fault_s: float | None
    step_s: float | None
    source: str
    slo: str | None
    allowed_s: float | None
    slo_source: str | None
    ok: bool | None
    detail: Detail


class TimelineCheckJson(TypedDict):
    check: str
    measured: float | None
    allowed: float
    unit: str
    ok: bool
    note: str


class MarkerJson(TypedDict):
    label: str
    time: float
    kind: str
    since_reference_s: float | None


class TimelineJson(TypedDict):
    """One experiment's entry of summary.json's timelines (``Timeline``'s fields)."""

    experiment: str
    reference: str
    reference_time: float | None
    tripped: bool
    trips: int
    trip: Mapping[str, object] | None
    drift_kl_threshold: float
    milestones: list[MilestoneJson]
    checks: list[TimelineCheckJson]
    markers: list[MarkerJson]
    notes: list[str]


@dataclass
class Milestone:
    """One point of the timeline (``MILESTONES``, in order), with where its time came from:

    1. ``fault_injected`` — the reference fault of ``gameday.evidence.faults`` in
       ``faults.jsonl``; the broker's ``fault_injected`` / ``pod_killed`` annotations
       stand in when the ledger is missing.
    2. ``first_drifted_sample`` — the first oracle record after the fault whose
       ``kl_mean`` exceeds the drift threshold, else the gate's trip evidence
       ``first_sample_time``.
    3. ``gate_tripped`` — the broker event whose change sets the phase to ``tripped``.
    4. ``weights_applied`` — canary weight 0 in force at every live router
       (``gameday.evidence.milestones.WeightsApplied``, the same reading as the probe's).
    5. ``last_canary_request`` — the latest ``start_time`` of a canary-served request at
       or after the fault (load records).
    6. ``rollback_complete`` — the event whose change sets the phase to ``rolled_back``.
    """

    name: str
    label: str
    time: float | None  # epoch seconds
    since_fault_s: float | None
    step_s: float | None  # since the previous milestone that has a time
    source: str
    slo_key: str | None = None
    allowed_s: float | None = None
    slo_source: str | None = None
    ok: bool | None = None
    detail: Detail = field(default_factory=dict)

    def to_json(self) -> MilestoneJson:
        return record_json(
            self,
            MilestoneJson,
            since_fault_s=_round(self.since_fault_s),
            step_s=_round(self.step_s),
            slo=self.slo_key,
        )


@dataclass
class TimelineCheck:
    check: str
    measured: float | None
    allowed: float
    unit: str
    ok: bool
    note: str

    def to_json(self) -> TimelineCheckJson:
        return record_json(self, TimelineCheckJson, measured=_round(self.measured))


@dataclass
class Marker:
    label: str
    time: float
    kind: str  # milestone | fault | clear | kill | phase

    def to_json(self, reference_time: float | None) -> MarkerJson:
        since = _since(self.time, reference_time)
        return record_json(self, MarkerJson, since_reference_s=since)


@dataclass
class Timeline:
    experiment: str
    reference: str  # "fault" | "start" | "none"
    reference_time: float | None  # the fault, else the experiment's start
    tripped: bool
    trips: int
    trip: Mapping[str, object] | None  # the trip event's evidence, as timeline.json has it
    drift_kl: float
    milestones: list[Milestone]
    checks: list[TimelineCheck]
    markers: list[Marker]
    notes: list[str]

    def milestone(self, name: str) -> Milestone:
        return next(m for m in self.milestones if m.name == name)

    @property
    def time_to_trip_s(self) -> float | None:
        return self.milestone("gate_tripped").since_fault_s

    @property
    def trip_since_reference_s(self) -> float | None:
        """Since the fault, or since the start for a run without one (a false trip)."""
        t = self.milestone("gate_tripped").time
        return None if t is None or self.reference_time is None else t - self.reference_time

    def to_json(self) -> TimelineJson:
        return record_json(
            self,
            TimelineJson,
            drift_kl_threshold=self.drift_kl,
            milestones=[m.to_json() for m in self.milestones],
            checks=[c.to_json() for c in self.checks],
            markers=[m.to_json(self.reference_time) for m in self.markers],
        )


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _since(t: float | None, ref: float | None) -> float | None:
    return None if t is None or ref is None else round(t - ref, 4)


# ---------------------------------------------------------------------------------------
# Broker events


def window_events(exp: ExperimentData) -> list[Event]:
    """The broker events of this experiment, in order (those before its start dropped).

    Only events inside the experiment's window count, since the broker keeps the history
    of every earlier experiment on the same release. Events carry changes as
    ``{"phase": {"old": ..., "new": ...}}`` (flattened keys such as ``weights.canary``) or
    plain ``{"phase": "tripped"}``; ``gameday.evidence.events`` reads both.
    """
    if exp.timeline is None:
        return []
    decoded: list[dict[str, object]] = [
        e for e in exp.timeline.get("events") or [] if isinstance(e, dict)
    ]
    for e in decoded:
        e["time"] = parse_time(e.get("time"))
    events: list[Event] = [e for e in decoded if e["time"] is not None]
    start = exp.window_start()
    if start is not None:
        events = [e for e in events if event_time(e) >= start - WINDOW_SLACK_S]
    events.sort(key=lambda e: (event_time(e), _seq(e)))
    return events


def _seq(event: Event) -> float:
    """An event's ``seq`` for ordering events of the same time (0 when it has none)."""
    seq = event.get("seq")
    return seq if isinstance(seq, int | float) and not isinstance(seq, bool) else 0


def _change(event: Event) -> Mapping[str, object]:
    change = event.get("change")
    return change if isinstance(change, dict) else {}


# ---------------------------------------------------------------------------------------
# The fault


def find_fault(exp: ExperimentData, events: list[Event]) -> tuple[float | None, str]:
    """The reference fault's time and a sentence saying where it came from."""
    spec = exp.spec
    if spec and spec.fault == "none":
        return None, "this experiment injects no fault"
    ref = reference_fault(
        exp.faults, spec.fault if spec else None, spec.component if spec else None
    )
    if ref is not None:
        return ref.time, f"faults.jsonl: {ref.describe()}"
    # No ledger: the broker's annotations.
    annotated = annotation_events(events, "fault_injected")
    kernel = [e for e in annotated if _change(e).get("kind") == "kernel"]
    for group, why in (
        (kernel, "kernel fault_injected annotation"),
        (annotated, "fault_injected annotation"),
        (annotation_events(events, "pod_killed"), "pod_killed annotation"),
    ):
        if group:
            return event_time(group[0]), f"timeline.json: {why}"
    return None, "no fault found in faults.jsonl or timeline.json"


# ---------------------------------------------------------------------------------------
# Building a timeline


def slo_allowed(
    exp: ExperimentData, key: str, probe_allowed: dict[str, float]
) -> tuple[float, str]:
    if exp.spec and key in exp.spec.slo:
        return exp.spec.slo[key], "experiment gameday.slo"
    if key in probe_allowed:
        return probe_allowed[key], "the experiment's SLO probe"
    return DEFAULT_SLO_S[key], "report default"


def build_timeline(exp: ExperimentData, probe_allowed: dict[str, float] | None = None) -> Timeline:
    """``probe_allowed``: check name -> allowed, from the journal's SLO probe outputs."""
    probe_allowed = probe_allowed or {}
    events = window_events(exp)
    notes: list[str] = []
    fault_time, fault_source = find_fault(exp, events)
    drift_kl = exp.spec.drift_kl if exp.spec and exp.spec.drift_kl is not None else DEFAULT_DRIFT_KL

    trip_event = first_phase(events, "tripped")
    trips = len(phase_events(events, "tripped"))
    trip = None
    if trip_event is not None:
        evidence = new_value(trip_event.get("change"), "trip")
        trip = evidence if isinstance(evidence, dict) else None
    trip_time = event_time(trip_event) if trip_event else None

    times: dict[str, Found] = {}
    times["fault_injected"] = (fault_time, fault_source, {})
    times["first_drifted_sample"] = _first_drift(exp, fault_time, drift_kl, trip)
    times["gate_tripped"] = (
        (
            trip_time,
            f"timeline.json: event seq {trip_event.get('seq')} sets phase tripped "
            f"(actor {trip_event.get('actor')})",
            {"evidence": trip},
        )
        if trip_event
        else (None, "no event sets phase tripped", {})
    )
    routers = [r for r in (exp.timeline or {}).get("routers") or [] if isinstance(r, dict)]
    applied = weights_applied(events, trip_time, routers)
    if applied is not None:
        times["weights_applied"] = (
            applied.time,
            f"timeline.json: {applied.sentence()}",
            applied.detail(),
        )
    else:
        times["weights_applied"] = (None, _routers_without_annotation(exp, events), {})
    times["last_canary_request"] = _last_canary(exp, fault_time)
    done = first_phase(events, "rolled_back", since=trip_time)
    times["rollback_complete"] = (
        (event_time(done), f"timeline.json: event seq {done.get('seq')} sets phase rolled_back", {})
        if done
        else (None, "no event sets phase rolled_back", {})
    )

    reference_time, reference = fault_time, "fault"
    if reference_time is None:
        reference_time = exp.window_start()
        reference = "start" if reference_time is not None else "none"
        if reference_time is None and len(exp.records):
            reference_time, reference = float(exp.records["start_time"].min()), "start"

    milestones: list[Milestone] = []
    previous: float | None = None
    for name, label, slo_key in MILESTONES:
        t, source, detail = times[name]
        m = Milestone(
            name=name,
            label=label,
            time=t,
            since_fault_s=None if t is None or fault_time is None else t - fault_time,
            step_s=None if t is None or previous is None else t - previous,
            source=source,
            detail=detail,
            slo_key=slo_key,
        )
        if t is not None:
            previous = t
        milestones.append(m)

    expect = exp.spec.expect if exp.spec else None
    checks = _checks(
        exp, milestones, expect, trips, trip_time, reference_time, probe_allowed, notes
    )
    markers = _markers(exp, events, milestones)
    return Timeline(
        experiment=exp.name,
        reference_time=reference_time,
        reference=reference,
        milestones=milestones,
        tripped=trip_event is not None,
        trips=trips,
        trip=trip,
        drift_kl=drift_kl,
        checks=checks,
        markers=markers,
        notes=notes,
    )


def _routers_without_annotation(exp: ExperimentData, events: list[Event]) -> str:
    """What the router list says when the rollback executor wrote no routers_applied."""
    zero = [e for e in events if new_value(e.get("change"), "weights.canary") == 0]
    routers = [r for r in (exp.timeline or {}).get("routers") or [] if isinstance(r, dict)]
    if not zero or not routers:
        return "no routers_applied annotation"
    revision = zero[0].get("revision")
    applied = [r.get("applied_revision") for r in routers]
    if isinstance(revision, int) and all(isinstance(a, int) and a >= revision for a in applied):
        return (
            f"no routers_applied annotation; at collection all {len(routers)} live routers "
            f"reported revision >= {revision} (canary weight 0), time unknown"
        )
    return f"no routers_applied annotation; live routers report revisions {applied}"


def _first_drift(
    exp: ExperimentData,
    fault_time: float | None,
    threshold: float,
    trip: Mapping[str, object] | None,
) -> Found:
    gate_first = parse_time(trip.get("first_sample_time")) if trip else None
    oracle = exp.oracle
    if fault_time is not None and len(oracle):
        t = oracle["time"].to_numpy()
        kl = oracle["kl_mean"].to_numpy()
        error = oracle["error"]
        clean = (error.isna() | (error == "")).to_numpy()
        hit = (t >= fault_time) & clean & (kl > threshold)
        if hit.any():
            i = int(np.flatnonzero(hit)[np.argmin(t[hit])])
            detail = {
                "kl_mean": float(kl[i]),
                "threshold": threshold,
                "bucket": str(oracle["bucket"].iloc[i]),
                "gate_first_sample_time": gate_first,
            }
            return float(t[i]), f"oracle: first record with kl_mean > {threshold:g}", detail
    if gate_first is not None:
        return gate_first, "gate trip evidence: first_sample_time", {"threshold": threshold}
    why = "no oracle record above the threshold after the fault, and no trip evidence"
    return None, why, {"threshold": threshold}


def _last_canary(exp: ExperimentData, fault_time: float | None) -> Found:
    rec = exp.records
    if fault_time is None:
        return None, "unknown without a fault time", {}
    if not len(rec):
        return None, "no load records", {}
    last, count = last_canary_request(
        rec["served_by"].to_numpy(), rec["start_time"].to_numpy(), fault_time
    )
    if last is None:
        return None, "records: no canary-served request at or after the fault", {"requests": 0}
    return last, "records: latest start_time served by the canary", {"requests": count}


def _checks(
    exp: ExperimentData,
    milestones: list[Milestone],
    expect: str | None,
    trips: int,
    trip_time: float | None,
    reference_time: float | None,
    probe_allowed: dict[str, float],
    notes: list[str],
) -> list[TimelineCheck]:
    """The checks against the SLOs, all measured from the fault (keys of the experiment's
    ``gameday.slo``, else the SLO probe's, else ``DEFAULT_SLO_S``): ``detection_s``
    (gate_tripped), ``weights_applied_s``, ``rollback_s`` (no canary-served request
    started later than this), ``rollback_complete_s``. An experiment that expects no trip
    gets one check instead, ``no_trip`` (trips seen, allowed 0)."""
    if expect in ("no_trip", "blind", "colour_lost"):  # nor may a blind gate or a lost tag
        note = "no trip" if trips == 0 else f"tripped {trips} time(s)"
        if trip_time is not None and reference_time is not None:
            note += f", first at +{trip_time - reference_time:.2f} s"
        return [TimelineCheck("no_trip", float(trips), 0.0, "count", trips == 0, note)]
    if expect != "trip":
        return []
    checks: list[TimelineCheck] = []
    fault = milestones[0]
    for m in milestones:
        if m.slo_key is None:
            continue
        allowed, source = slo_allowed(exp, m.slo_key, probe_allowed)
        m.allowed_s, m.slo_source = allowed, source
        if fault.time is None:
            m.ok = False
            checks.append(
                TimelineCheck(
                    m.slo_key,
                    None,
                    allowed,
                    "s",
                    False,
                    f"{m.label}: not measurable, the fault time is unknown",
                )
            )
            continue
        if m.name == "last_canary_request" and m.time is None and m.detail.get("requests") == 0:
            m.ok = True
            checks.append(
                TimelineCheck(
                    m.slo_key,
                    0.0,
                    allowed,
                    "s",
                    True,
                    "no canary-served request started after the fault",
                )
            )
            continue
        if m.time is None:
            m.ok = False
            checks.append(
                TimelineCheck(m.slo_key, None, allowed, "s", False, f"{m.label}: {m.source}")
            )
            continue
        measured = float(m.since_fault_s or 0.0)
        m.ok = measured <= allowed
        checks.append(
            TimelineCheck(
                m.slo_key,
                measured,
                allowed,
                "s",
                m.ok,
                f"fault → {m.label}: {measured:.2f} s (allowed {allowed:g} s)",
            )
        )
    return checks


def _markers(exp: ExperimentData, events: list[Event], milestones: list[Milestone]) -> list[Marker]:
    markers = [Marker(m.label, m.time, "milestone") for m in milestones if m.time is not None]
    for f in exp.faults:
        action = str(f.get("action"))
        if action in ("inject", "clear", "kill"):
            label = f"{action} {f.get('kind')} on {f.get('replica') or f.get('component')}"
            markers.append(Marker(label, float(f["time"]), {"inject": "fault"}.get(action, action)))
    if not exp.faults:
        for e in annotation_events(events, "fault_injected") + annotation_events(
            events, "pod_killed"
        ):
            ch = _change(e)
            markers.append(
                Marker(
                    f"{ch.get('annotation')} {ch.get('kind') or ''} on {ch.get('component')}",
                    event_time(e),
                    "fault",
                )
            )
    markers.sort(key=lambda m: m.time)
    return markers


def records_after(records: pd.DataFrame, t: float | None, variant: str) -> int:
    """How many requests served by ``variant`` started after ``t`` (0 when t is None)."""
    if t is None or not len(records):
        return 0
    mask = (records["served_by"] == variant).to_numpy() & (records["start_time"].to_numpy() > t)
    return int(mask.sum())
