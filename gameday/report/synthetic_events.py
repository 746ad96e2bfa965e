"""What the broker and the harness record during a synthetic experiment
(``gameday.report.synthetic``): the broker timeline's events, in the broker's
``{"old", "new"}`` form, and the fault ledger's entries. Pure: it writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict


class BrokerEvent(TypedDict):
    """One event of a broker timeline as ``timeline.json`` holds it (the broker's
    ``canary_contract.broker.Event`` without its release)."""

    seq: int
    time: float
    revision: int
    actor: str
    reason: str
    change: dict[str, object]


class Change(TypedDict):
    old: object
    new: object


class FaultAnnotation(TypedDict):
    annotation: str
    component: str
    kind: str


class RoutersApplied(TypedDict):
    annotation: str
    revision: int
    routers: list[str]
    waited_s: float
    retries: int


class LedgerLine(TypedDict):
    """One line of ``faults.jsonl`` (``gameday.evidence.ledger.FaultEntry``, written)."""

    action: str
    time: float
    component: str
    replica: str
    url: str
    kind: str
    fault_id: str
    ttl_s: float
    params: dict[str, object]
    detail: dict[str, object]


def broker_event(
    seq: int, t: float, revision: int, actor: str, reason: str, change: Mapping[str, object]
) -> BrokerEvent:
    """One event of a broker timeline (``timeline.json``'s ``events``)."""
    return {
        "seq": seq,
        "time": t,
        "revision": revision,
        "actor": actor,
        "reason": reason,
        "change": dict(change),
    }


def changed(key: str, old: object, new: object) -> dict[str, Change]:
    """A field's change in the broker's ``{"old", "new"}`` form."""
    return {key: {"old": old, "new": new}}


def fault_injected(component: str, kind: str) -> FaultAnnotation:
    """The harness's annotation of a fault it injected."""
    return {"annotation": "fault_injected", "component": component, "kind": kind}


def routers_applied(revision: int, waited_s: float, retries: int) -> RoutersApplied:
    """The rollback executor's annotation: both routers applied ``revision``."""
    return {
        "annotation": "routers_applied",
        "revision": revision,
        "routers": ["router-0", "router-1"],
        "waited_s": waited_s,
        "retries": retries,
    }


def fault_ledger(
    fault: str, component: str, fault_t: float, end: float, kernel: bool
) -> list[LedgerLine]:
    """The fault ledger (``faults.jsonl``) of a ``fault`` on ``component`` at ``fault_t``
    (with the canary's faulty kernel when ``kernel``), cleared 5 s before ``end``."""
    ledger: list[LedgerLine] = []

    def entry(
        action: str, when: float, component: str, kind: str, params: dict[str, object]
    ) -> LedgerLine:
        return {
            "action": action,
            "time": when,
            "component": component,
            "replica": f"{component}-0",
            "url": "http://127.0.0.1:1",
            "kind": kind,
            "fault_id": f"f-{len(ledger)}",
            "ttl_s": 60.0,
            "params": params,
            "detail": {},
        }

    if fault in ("latency", "faulty-kernel"):
        ledger.append(
            entry("inject", fault_t - (0.5 if kernel else 0), component, "latency", {"ms": 200})
        )
    if kernel:
        ledger.append(
            entry("inject", fault_t, "model-canary", "kernel", {"min_prompt_tokens": 2048})
        )
    if fault == "pod-kill":
        ledger.append(entry("kill", fault_t + 0.5, component, "pod-kill", {}))
    ledger.append(entry("clear", end - 5, component, "latency", {}))
    return ledger


def trip_events(trip_t: float, applied_t: float, detection_s: float) -> list[BrokerEvent]:
    """The broker events of a drift trip at ``trip_t`` and the rollback it starts: canary
    weight 0, both routers applied at ``applied_t``, canary quarantined, rolled back."""
    evidence = {
        "test": "drift",
        "bucket": "2k-4k",
        "statistic": 0.09,
        "threshold": 0.03,
        "samples": 12,
        "first_sample_time": trip_t - detection_s + 0.3,
        "last_sample_time": trip_t - 0.1,
        "tripped_at": trip_t,
        "detail": {},
    }
    tripped = {**changed("phase", "progressing", "tripped"), **changed("trip", None, evidence)}
    zeroed = {**changed("phase", "tripped", "rolling_back"), **changed("weights.canary", 5, 0)}
    return [
        broker_event(4, trip_t, 6, "gate", "drift", tripped),
        broker_event(5, trip_t + 0.1, 7, "rollback", "rollback", zeroed),
        broker_event(6, applied_t, 7, "rollback", "applied", routers_applied(7, 0.5, 0)),
        broker_event(
            7, applied_t + 0.2, 8, "rollback", "q", changed("canary.quarantined", False, True)
        ),
        broker_event(
            8,
            applied_t + 0.3,
            9,
            "rollback",
            "done",
            changed("phase", "rolling_back", "rolled_back"),
        ),
    ]
