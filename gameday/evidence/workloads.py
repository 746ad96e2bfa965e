"""Whether a component's Kubernetes workloads are whole again after a pod kill, and the
SLO result for the time it took.

Pure: workload states in (``gameday.targets.kubernetes`` status plus the pods seen Ready).
A workload the controller says is available must never count as whole before that many
of its pods are Ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict

from gameday.evidence.slo import Slo, result

CHECK = "k8s_ready_s"


class WorkloadStatus(TypedDict):
    """Desired and ready replicas of a role's workload (``KubernetesTarget.workload_status``);
    for a role of several workloads, their sums and each one's (``workloads``)."""

    kind: str
    name: str
    namespace: str
    desired: int
    ready: int
    ok: bool
    workloads: NotRequired[list[WorkloadStatus]]


class WorkloadState(WorkloadStatus):
    """A workload's status and the names of its pods seen Running and Ready."""

    ready_pods: list[str]


def is_whole(state: WorkloadState) -> bool:
    """All replicas available AND that many pods Running, Ready and not being deleted
    (right after a kill the controller may not have counted the loss yet)."""
    return bool(state["ok"] and len(state["ready_pods"]) >= state["desired"])


def ready_within(
    component: str,
    states: Sequence[WorkloadState],
    allowed: float,
    took: float | None,
    measured_from: str,
) -> Slo:
    """``took`` seconds until every workload was whole (None: not whole by the deadline,
    a failed check naming desired, available and ready pods)."""
    if took is not None:
        return result(
            CHECK,
            took,
            allowed,
            "s",
            took <= allowed,
            workloads=list(states),
            measured_from=measured_from,
        )
    lagging = ", ".join(
        f"{s['kind']}/{s['name']} {s['ready']}/{s['desired']} available, "
        f"{len(s['ready_pods'])} pods Ready"
        for s in states
        if not is_whole(s)
    )
    why = f"{component} should be whole again within {allowed:g} s, but {lagging}"
    return result(CHECK, None, allowed, "s", False, workloads=list(states), why=why)
