"""What a target's replicas say about themselves over the harness's API (``StackApi``):
which do not answer ``/health``, and which faults they hold. Only reads."""

from __future__ import annotations

from gameday.api import ApiError, StackApi
from gameday.targets.base import ROLES, TargetError


def unhealthy(api: StackApi) -> list[str]:
    """One line per replica of any component that does not answer ``/health`` with 200
    (or per component whose replicas cannot be listed); empty when all do."""
    problems: list[str] = []
    health_urls = getattr(api.target, "health_urls", None)
    if callable(health_urls):  # a foreign stack: the health URL each part states
        for name, url in health_urls():
            try:
                status = api.get_status(url)
            except ApiError as exc:
                problems.append(f"{name}: {exc}")
                continue
            if status != 200:
                problems.append(f"{name} ({url}): health answered HTTP {status}")
        return problems
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
    backends = getattr(api.target, "fault_kinds", None)
    for role in ROLES:
        if callable(backends):  # a foreign stack: only the roles it has a fault backend for
            if not backends(role):
                continue
            backend = api.target.fault_backend(role)  # type: ignore[attr-defined]
            if backend is not None:
                found.extend(backend.active(api.session))
                continue
        for rep in api.target.replicas(role):
            for fault in api.faults(rep.url, api.target.fault_headers(role)):
                found.append(
                    f"{rep.name}: {fault.get('kind')} (id {fault.get('id')}, "
                    f"{fault.get('remaining_s')} s left)"
                )
    return found
