"""The reference fault: the one every time of a game day is measured from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from canary_contract.faults import FaultAction
from gameday.evidence.ledger import FaultEntry

FaultRow = Mapping[str, Any]  # one line of faults.jsonl (``gameday.faults.FaultEntry``)
BAD_BUILD_PREFIX = "build-"  # the fault id of a bad-build entry: build-<pod uid>


@dataclass(frozen=True)
class ReferenceFault:
    """The fault the gate must catch, with the sentence saying why it is that one."""

    entry: FaultRow
    why: str

    @property
    def time(self) -> float:
        return float(self.entry["time"])

    def describe(self) -> str:
        where = self.entry.get("replica") or self.entry.get("component")
        return f"{self.why} ({self.entry.get('kind')} on {where})"


def reference_fault(
    entries: Sequence[FaultRow], fault: str | None = None, component: str | None = None
) -> ReferenceFault | None:
    """The fault the gate must catch, from the run's ledger, in this order:

    1. the ``kernel`` fault injected on ``model-canary`` (faulty-kernel and pod-kill
       experiments: the canary's bad build is what the gate is there for);
    2. any ``kernel`` fault injected;
    3. with the experiment's own fault known (``fault``/``component`` of its ``gameday``
       extension): its ``latency`` injection, or its ``pod-kill``, on its component;
    4. the ledger's first injection or pod kill.

    None when the ledger holds none of these (an experiment without a fault).
    """

    def on(action: str | None, kind: str | None = None, comp: str | None = None) -> FaultRow | None:
        for f in entries:
            if action is None and f.get("action") not in ("inject", "kill"):
                continue
            if action is not None and f.get("action") != action:
                continue
            if kind is not None and f.get("kind") != kind:
                continue
            if comp is not None and not str(f.get("component") or "").startswith(comp):
                continue
            return f
        return None

    candidates: list[tuple[FaultRow | None, str]] = [
        (on("inject", "kernel", "model-canary"), "kernel fault injected on model-canary"),
        (on("inject", "kernel"), "kernel fault injected"),
    ]
    if fault == "latency":
        candidates.append((on("inject", "latency", component), f"latency injected on {component}"))
    if fault == "pod-kill":
        candidates.append((on("kill", None, component), f"pod of {component} killed"))
    first = on(None)
    if first is not None:
        what = "first kill" if first.get("action") == "kill" else "first injection"
        candidates.append((first, f"{what} in the ledger"))
    for entry, why in candidates:
        if entry is not None:
            return ReferenceFault(entry, why)
    return None


def bad_build_entries(
    pods: Sequence[tuple[str, str]],
    urls: Mapping[str, str],
    params: Mapping[str, object],
    detail: Mapping[str, object],
    served_at: float,
) -> list[FaultEntry]:
    """The ledger's entries for a canary rolled out to a bad build, one per ``(pod name,
    pod uid)``: a ``kernel`` injection on ``model-canary`` (what ``reference_fault`` takes
    first) at ``served_at``, the first moment the build could serve users; no TTL (the
    build stays until it is undone) and the fault id ``build-<pod uid>``
    (``is_bad_build`` tells them from the model server's own kernel faults)."""
    return [
        FaultEntry(
            action=FaultAction.INJECT,
            time=served_at,
            component="model-canary",
            replica=name,
            url=urls.get(name, ""),
            kind="kernel",
            fault_id=f"{BAD_BUILD_PREFIX}{uid}",
            ttl_s=None,
            params=params,
            detail=detail,
        )
        for name, uid in pods
    ]


def is_bad_build(entry: FaultEntry) -> bool:
    """A ledger entry of ``bad_build_entries`` (a rollout, not a fault on a server's API)."""
    return entry.kind == "kernel" and (entry.fault_id or "").startswith(BAD_BUILD_PREFIX)
