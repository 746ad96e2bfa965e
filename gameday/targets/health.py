"""What a target's replicas say about themselves over the harness's API (``StackApi``):
which do not answer ``/health``, and which faults they hold. Only reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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


def _stated(api: StackApi, role: str, key: str) -> frozenset[str] | None:
    """What every replica of ``role`` states under ``key`` in its ``/health`` (a list),
    intersected; None when one states nothing there or cannot be read."""
    found: frozenset[str] | None = None
    try:
        for rep in api.target.replicas(role):
            stated = api.health(rep.url).get(key)
            if not isinstance(stated, list):
                return None
            mine = frozenset(str(x) for x in stated)
            found = mine if found is None else found & mine
    except (ApiError, TargetError):
        return None
    return found


@dataclass(frozen=True)
class StatedFaults:
    """The faults a stack's parts say they can be given (``/health``): per role, the fault
    kinds (``fault_kinds``), and the canary's ``kernel`` fault modes (``kernel_modes``). A
    real engine's pod states both (vLLM: the kernel fault only, as bf16 and, on a CPU with
    AVX-512, an FP8 KV cache); a part that states nothing (the simulator) can be given
    every fault the harness has."""

    kinds: Mapping[str, frozenset[str]] = field(default_factory=dict)
    kernel_modes: frozenset[str] | None = None


def stated_faults(api: StackApi) -> StatedFaults:
    """What the target's parts state (``StatedFaults``); nothing for a foreign stack, whose
    file says what it has, or for a part that cannot be read (the fault's own refusal then
    says why)."""
    if callable(getattr(api.target, "health_urls", None)):
        return StatedFaults()
    kinds = {role: k for role in ROLES if (k := _stated(api, role, "fault_kinds")) is not None}
    return StatedFaults(kinds, _stated(api, "model-canary", "kernel_modes"))
