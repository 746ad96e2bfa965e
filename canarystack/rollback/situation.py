"""Where one release's rollback stands, read from the broker: the observed state
(``classify``), the step the table (``TRANSITIONS``) runs from there, and the records a
step's events leave; ``fit_reason`` / ``fit_change`` keep what a step writes within the
broker's limits. The runner that drives the steps is ``canarystack.rollback.executor``.

This module must never do I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict, TypeVar, cast, get_args

from canary_contract import strictjson
from canary_contract.broker import Event, Release, RouterBeat
from canary_contract.json import JsonValue
from canary_contract.phases import Phase

# The broker's limits on what a step writes (canarystack/broker/server.py: ``Reason`` and
# ``MAX_EVENT_FIELD_BYTES``); a test checks they agree.
BROKER_MAX_REASON_CHARS = 4000
BROKER_MAX_CHANGE_BYTES = 16 * 1024
# The lists of an annotation's change that may be cut to make it fit, in that order.
_CUTTABLE = ("router_states", "quiet", "lagging", "routers")


def fit_reason(reason: str, limit: int = BROKER_MAX_REASON_CHARS) -> str:
    """``reason`` if the broker takes it, else its start and how long it was."""
    if len(reason) <= limit:
        return reason
    mark = f" ... [cut: {len(reason)} characters]"
    return reason[: max(0, limit - len(mark))] + mark


# An annotation's change: the TypedDict of its step (its keys kept, ``cut`` added).
Change = TypeVar("Change", bound=Mapping[str, object])


def _change_size(change: Mapping[str, object]) -> int:
    return len(strictjson.dumps(change).encode())


def fit_change(change: Change, limit: int = BROKER_MAX_CHANGE_BYTES) -> Change:
    """``change`` if it fits the broker's limit, else a copy whose router lists keep
    their first entries, with ``cut`` saying how many each had."""
    if _change_size(change) <= limit:
        return change
    out = dict(change)
    cut: dict[str, int] = {}
    for key in _CUTTABLE:
        items = out.get(key)
        if not isinstance(items, list) or not items:
            continue
        cut[key] = len(items)
        keep = len(items)
        while keep > 0:
            keep //= 2
            out[key] = items[:keep]
            out["cut"] = dict(cut)
            if _change_size(out) <= limit:
                return cast(Change, out)
    out["cut"] = dict(cut)
    return cast(Change, out)


class Observed(enum.Enum):
    """Where a rollback stands, as read from the broker.

    The step ``TRANSITIONS`` runs from each observed state::

        observed (from the broker)                      step run               next
        ----------------------------------------------  ---------------------  ---------------
        NEEDS_ROLLBACK  tripped, or progressing + a     1 weights_zero: CAS    WAITING_ROUTERS
                        manual request                    weights.canary=0,
                                                          phase=rolling_back
        WAITING_ROUTERS rolling_back, no routers_applied 2 routers_applied:   ROUTERS_APPLIED
                        annotation since it began         wait until every live
                                                          router reports
                                                          applied_revision >= R,
                                                          then annotate
        ROUTERS_APPLIED rolling_back, annotated          3 quarantine: mark    DONE
                                                          the canary version
                                                          quarantined (if not
                                                          yet), CAS phase=
                                                          rolled_back
        DONE            rolled_back                      -                      -
        IDLE            anything else                    -                      -
    """

    IDLE = "idle"
    NEEDS_ROLLBACK = "needs_rollback"
    WAITING_ROUTERS = "waiting_routers"
    ROUTERS_APPLIED = "routers_applied"
    DONE = "done"


class Step(enum.IntEnum):
    WEIGHTS_ZERO = 1
    ROUTERS_APPLIED = 2
    QUARANTINE = 3


# THE transition table: from an observed state, the step to run and the state it leads to.
TRANSITIONS: dict[Observed, tuple[Step, Observed] | None] = {
    Observed.NEEDS_ROLLBACK: (Step.WEIGHTS_ZERO, Observed.WAITING_ROUTERS),
    Observed.WAITING_ROUTERS: (Step.ROUTERS_APPLIED, Observed.ROUTERS_APPLIED),
    Observed.ROUTERS_APPLIED: (Step.QUARANTINE, Observed.DONE),
    Observed.DONE: None,
    Observed.IDLE: None,
}

STEP_NAMES = {
    Step.WEIGHTS_ZERO: "weights_zero",
    Step.ROUTERS_APPLIED: "routers_applied",
    Step.QUARANTINE: "quarantine",
}


class RouterState(TypedDict):
    """What a router last reported, as a ``routers_applied`` annotation lists it."""

    router_id: str
    applied_revision: int | None
    applied_at: float | None
    canary_off_since: float | None


# What a ``routers_applied`` step copies from its annotation's change, in this order.
AppliedKey = Literal[
    "routers", "waited_s", "retries", "lagging", "timed_out", "canary_off_at", "quiet"
]
APPLIED_KEYS: tuple[AppliedKey, ...] = get_args(AppliedKey)


class StepRecord(TypedDict):
    """One step the broker's history shows (``GET /v1/rollbacks/{release}``'s ``steps``);
    a ``routers_applied`` step also carries what its annotation recorded (when it did)."""

    step: int
    name: str
    time: float
    revision: int
    actor: str
    seq: int
    routers: NotRequired[JsonValue]
    waited_s: NotRequired[JsonValue]
    retries: NotRequired[JsonValue]
    lagging: NotRequired[JsonValue]
    timed_out: NotRequired[JsonValue]
    canary_off_at: NotRequired[JsonValue]
    quiet: NotRequired[JsonValue]


@dataclass
class Situation:
    """What the broker shows: the release, the rollback's events, the observed state."""

    release: Release
    observed: Observed
    rolling_back_event: Event | None = None
    applied_event: Event | None = None
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def rollback_revision(self) -> int | None:
        ev = self.rolling_back_event
        return None if ev is None else ev.revision


def phase_moved_to(event: Event, phase: str) -> bool:
    moved = event.change.get("phase")
    return isinstance(moved, dict) and moved.get("new") == phase


def _quarantined(event: Event) -> bool:
    q = event.change.get("canary.quarantined")
    return isinstance(q, dict) and q.get("new") is True


def classify(release: Release, events: Sequence[Event], manual: bool = False) -> Situation:
    """The observed state of the latest rollback, from the release and the events since
    its latest move to ``rolling_back``.

    The executor keeps no state that matters: before every step it reads the release and
    its event history and classifies where the rollback stands; ``TRANSITIONS`` says which
    step runs from there. A SIGKILL at any point therefore resumes correctly on restart,
    and no side effect happens twice (each step's write is a compare-and-set, or is
    skipped when the broker already shows it). Pure: tests call it directly.
    """
    phase = release.phase
    start = None
    for ev in events:
        if phase_moved_to(ev, "rolling_back"):
            start = ev
    applied = None
    steps: list[StepRecord] = []
    if start is not None:
        steps.append(step_record(Step.WEIGHTS_ZERO, "weights_zero", start))
        for ev in events:
            if ev.seq <= start.seq:
                continue
            change = ev.change
            if (
                change.get("annotation") == "routers_applied"
                and int(change.get("revision", -1)) >= start.revision
                and applied is None
            ):
                applied = ev
                steps.append(step_record(Step.ROUTERS_APPLIED, "routers_applied", ev))
            elif _quarantined(ev):
                steps.append(step_record(Step.QUARANTINE, "quarantined", ev))
            elif phase_moved_to(ev, "rolled_back"):
                steps.append(step_record(Step.QUARANTINE, "rolled_back", ev))
    if phase is Phase.TRIPPED or (phase is Phase.PROGRESSING and manual):
        observed = Observed.NEEDS_ROLLBACK
        if phase is Phase.TRIPPED:
            steps = []  # a new trip: the steps of an older rollback are history
    elif phase is Phase.ROLLING_BACK:
        observed = Observed.WAITING_ROUTERS if applied is None else Observed.ROUTERS_APPLIED
    elif phase is Phase.ROLLED_BACK:
        observed = Observed.DONE
    else:
        observed = Observed.IDLE
    return Situation(release, observed, start, applied, steps)


def canary_off_at(routers: Sequence[RouterBeat]) -> float | None:
    """The latest ``canary_off_since`` over ``routers`` (GET /v1/routers entries): when the
    last of them stopped sending canary traffic. None when any of them reports none, or
    there are none."""
    off: list[float] = []
    for r in routers:
        if r.canary_off_since is None:
            return None
        off.append(r.canary_off_since)
    return max(off) if off else None


def router_state(r: RouterBeat) -> RouterState:
    return {
        "router_id": r.router_id,
        "applied_revision": r.applied_revision,
        "applied_at": r.applied_at,
        "canary_off_since": r.canary_off_since,
    }


def step_record(step: Step, name: str, ev: Event) -> StepRecord:
    rec: StepRecord = {
        "step": int(step),
        "name": name,
        "time": ev.time,
        "revision": ev.revision,
        "actor": ev.actor,
        "seq": ev.seq,
    }
    change = ev.change
    if name == "routers_applied":
        # What the annotation recorded, in the order it is listed (keys it lacks left out).
        for key in APPLIED_KEYS:
            if key in change:
                rec[key] = change[key]
    return rec
