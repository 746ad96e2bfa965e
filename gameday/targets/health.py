"""What a target's replicas say about themselves over the harness's API (``StackApi``):
which do not answer ``/health``, and which faults they hold. Only reads."""

from __future__ import annotations

from gameday.api import ApiError, StackApi
from gameday.targets.base import ROLES, TargetError


def unhealthy(api: StackApi) -> list[str]:
    """One line per replica of any component that does not answer ``/health`` with 200
    (or per component whose replicas cannot be listed); empty when all do."""
    problems: list[str] = []
    for role in ROLES:
        try:
            replicas = api.target.replicas(role)
        except TargetError as exc:
            problems.append(f"{role}: {exc}")
            continue
        for rep in replicas:
            try:
                status = api.health_status(rep.url)
            except ApiError as exc:
                problems.append(f"{rep.name}: {exc}")
                continue
            if status != 200:
                problems.append(f"{rep.name} ({rep.url}): /health answered HTTP {status}")
    return problems


def active_faults(api: StackApi) -> list[str]:
    """One line per fault a replica of any component holds: its kind, id and time left."""
    found: list[str] = []
    for role in ROLES:
        for rep in api.target.replicas(role):
            for fault in api.faults(rep.url, api.target.fault_headers(role)):
                found.append(
                    f"{rep.name}: {fault.get('kind')} (id {fault.get('id')}, "
                    f"{fault.get('remaining_s')} s left)"
                )
    return found
