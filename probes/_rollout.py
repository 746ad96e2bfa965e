"""The canary Deployment's rollouts, for ``probes.kubernetes``: reading it, patching it and
waiting until its pods are what was asked for, through the Kubernetes API.

It acts on one Deployment only, the target's ``model-canary`` workload (blast-radius
checked before any call); it must never touch another workload.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from chaoslib.exceptions import ActivityFailed

from gameday.targets import TargetError
from gameday.targets.kubernetes import KubernetesTarget
from probes._cluster import kubernetes_target, non_negative
from probes._context import MAX_WAIT_S, Configuration, harness_errors

VERSION_ANNOTATION = "canarystack.io/model-version"
BUILD_ANNOTATION = "canarystack.io/build"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
KERNEL_FAULT_FLAG = "--kernel-fault"
POLL_S = 1.0
CANARY = "model-canary"


def api_failed(what: str, exc: Exception) -> ActivityFailed:
    """``what`` failed, with the API's status and reason."""
    return ActivityFailed(
        f"{what} failed: HTTP {getattr(exc, 'status', '?')} {getattr(exc, 'reason', exc)}"
    )


def pod_ready(p: Any) -> bool:
    """A pod that is Running, Ready and not being deleted."""
    conditions = (p.status.conditions if p.status else None) or []
    return bool(
        p.metadata.deletion_timestamp is None
        and p.status is not None
        and p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in conditions)
    )


def ready_pods(target: KubernetesTarget, role: str) -> list[str]:
    """Names of the pods of ``role`` that are Running, Ready and not being deleted."""
    api = target.core_api()
    try:
        pods = api.list_namespaced_pod(target.namespace, label_selector=target.selector(role))
    except Exception as exc:
        raise TargetError(f"listing pods of {role} failed: {exc}") from None
    return sorted(p.metadata.name for p in pods.items if pod_ready(p))


def canary_deployment(target: KubernetesTarget, what: str) -> tuple[Any, str]:
    """(AppsV1Api, name) of the target's canary Deployment, inside the blast radius."""
    from kubernetes import client

    target.check_allowed(CANARY)  # it rolls the canary's pods
    kind, name = target.workload(CANARY)
    if kind != "deployment":
        raise ActivityFailed(
            f"{what} rolls out a Deployment, but workloads.model-canary is {kind}/{name}"
        )
    return client.AppsV1Api(target.api_client()), name


@dataclass(frozen=True)
class CanaryChange:
    """One change of the canary Deployment: where it is, and the time it may take."""

    target: KubernetesTarget
    apps: Any  # AppsV1Api
    name: str
    wait: float  # seconds: the activity's deadline_s, capped at MAX_WAIT_S
    t0: float  # time.monotonic() when the activity began

    @property
    def deadline(self) -> float:
        return self.t0 + self.wait

    def took_s(self) -> float:
        return round(time.monotonic() - self.t0, 3)


@contextmanager
def canary_change(
    configuration: Configuration | None, activity: str, deadline_s: float, doing: str
) -> Iterator[CanaryChange]:
    """The canary Deployment ``activity`` changes within ``deadline_s``; inside, the
    harness's errors become ``ActivityFailed`` naming what it was ``doing``."""
    wait = min(non_negative("deadline_s", deadline_s), MAX_WAIT_S)
    target = kubernetes_target(configuration, activity)
    t0 = time.monotonic()
    with harness_errors(doing):
        apps, name = canary_deployment(target, activity)
        yield CanaryChange(target, apps, name, wait, t0)


def read_deployment(target: KubernetesTarget, apps: Any, name: str) -> Any:
    """deployment/``name`` as the API has it now."""
    try:
        return apps.read_namespaced_deployment(name, target.namespace)
    except Exception as exc:
        raise api_failed(f"reading deployment/{name}", exc) from None


def patch_deployment(
    target: KubernetesTarget, apps: Any, name: str, patch: list[Any], what: str
) -> None:
    """One JSON patch of deployment/``name``; ``what`` names it in the error."""
    try:
        apps.patch_namespaced_deployment(name, target.namespace, patch)
    except Exception as exc:
        raise api_failed(what, exc) from None


def _progress(dep: Any) -> tuple[int, Any, bool, str]:
    """(desired replicas, status, whether the controller has rolled the current template out
    to all of them and they are available, the rollout's progress in words) of a
    Deployment."""
    from kubernetes import client

    desired = dep.spec.replicas if dep.spec.replicas is not None else 1
    st = dep.status or client.V1DeploymentStatus()
    rolled_out = (
        (st.observed_generation or 0) >= (dep.metadata.generation or 0)
        and (st.updated_replicas or 0) == desired
        and (st.available_replicas or 0) == desired
    )
    progress = (
        f"generation {dep.metadata.generation} observed {st.observed_generation}, "
        f"{st.updated_replicas or 0} updated / {st.available_replicas or 0} available / "
        f"{st.replicas or 0} in all of {desired}"
    )
    return desired, st, rolled_out, progress


def _canary_pods(target: KubernetesTarget) -> Any:
    return target.core_api().list_namespaced_pod(
        target.namespace, label_selector=target.selector(CANARY)
    )


def rolled_out_to_version(target: KubernetesTarget, name: str, version: str) -> tuple[bool, str]:
    """(done, progress): deployment/``name`` has rolled out and every live canary pod
    carries ``VERSION_ANNOTATION`` = ``version`` (none terminating)."""
    from kubernetes import client

    apps = client.AppsV1Api(target.api_client())
    dep: Any = apps.read_namespaced_deployment(name, target.namespace)
    desired, st, rolled_out, progress = _progress(dep)
    if not (rolled_out and (st.replicas or 0) == desired):
        return False, progress
    stale = [
        p.metadata.name
        for p in _canary_pods(target).items
        if p.metadata.deletion_timestamp
        or (p.metadata.annotations or {}).get(VERSION_ANNOTATION) != version
    ]
    if stale:
        return False, f"{progress}; pods not on {version} yet: {', '.join(stale)}"
    return True, progress


def wait_for_version(
    target: KubernetesTarget, name: str, version: str, deadline: float, wait: float
) -> None:
    """Wait until ``rolled_out_to_version``; ActivityFailed naming the progress when
    ``deadline`` (monotonic) passes."""
    while True:
        done, progress = rolled_out_to_version(target, name, version)
        if done:
            return
        if time.monotonic() >= deadline:
            raise ActivityFailed(
                f"the canary rollout to {version} did not finish within {wait:g} s: {progress}"
            )
        time.sleep(POLL_S)


def wait_rolled_out(
    target: KubernetesTarget, apps: Any, name: str, build: str | None, deadline: float, wait: float
) -> list[Any]:
    """Wait until deployment/``name`` has rolled out and every live canary pod is Ready and
    carries ``BUILD_ANNOTATION`` = ``build`` (None: carries none); its pods, or
    ActivityFailed naming the progress when ``deadline`` (monotonic) passes."""
    while True:
        try:
            dep: Any = apps.read_namespaced_deployment(name, target.namespace)
            pods = _canary_pods(target)
        except Exception as exc:
            raise api_failed(f"reading deployment/{name} and its pods", exc) from None
        desired, _, rolled_out, progress = _progress(dep)
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        stale = [
            p.metadata.name
            for p in live
            if (p.metadata.annotations or {}).get(BUILD_ANNOTATION) != build
        ]
        ready = [p for p in live if p.metadata.name not in stale and pod_ready(p)]
        if rolled_out and not stale and len(ready) >= desired:
            return ready
        if time.monotonic() >= deadline:
            left = f"; pods of another build: {', '.join(stale)}" if stale else ""
            raise ActivityFailed(
                f"the rollout of deployment/{name} did not finish within {wait:g} s: "
                f"{progress}, {len(ready)} pods of the wanted build Ready{left}"
            )
        time.sleep(POLL_S / 2)


def model_container(dep: Any, name: str) -> tuple[int, Any]:
    """(index, container) of the model server in the Deployment's pod template: the one
    named ``model``, else the only one."""
    containers = list(dep.spec.template.spec.containers or [])
    for i, c in enumerate(containers):
        if c.name == "model":
            return i, c
    if len(containers) == 1:
        return 0, containers[0]
    names = ", ".join(str(c.name) for c in containers) or "none"
    raise ActivityFailed(
        f"deployment/{name} has no container named 'model' and not exactly one container "
        f"({names}): cannot tell which one is the model server"
    )


def without_kernel_fault(args: list[str]) -> list[str]:
    """``args`` without any ``--kernel-fault VALUE`` / ``--kernel-fault=VALUE``."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == KERNEL_FAULT_FLAG:
            skip = True
            continue
        if a.startswith(KERNEL_FAULT_FLAG + "="):
            continue
        out.append(a)
    return out


def parse_kernel_fault(raw: Any) -> tuple[str, str, str]:
    """(value, mode, min prompt tokens or "") of a ``--kernel-fault`` value
    ``MODE[:MIN_PROMPT_TOKENS]``; ActivityFailed naming the argument when malformed."""
    value = str(raw).strip()
    mode, _, tokens = value.partition(":")
    if not mode or any(ch.isspace() for ch in value) or (tokens and not tokens.isdigit()):
        raise ActivityFailed(
            f"argument kernel_fault is {raw!r}: give MODE[:MIN_PROMPT_TOKENS], "
            "e.g. fp8-kv-scale:2048 (the model server's --kernel-fault)"
        )
    return value, mode, tokens


def bad_build_patch(apps: Any, dep: Any, name: str, value: str) -> tuple[str, list[Any]]:
    """(build, JSON patch) that makes deployment/``name`` the bad build ``--kernel-fault
    VALUE``: its model container's args with the flag (an earlier one replaced, not
    stacked) and the pod template's ``BUILD_ANNOTATION``.

    The whole container list is replaced (a JSON patch cannot test an index): the same
    containers as read, the model server's with the bad build's args."""
    index, container = model_container(dep, name)
    args = [*without_kernel_fault(list(container.args or [])), KERNEL_FAULT_FLAG, value]
    build = f"kernel-fault={value}"
    annotations = dep.spec.template.metadata.annotations or {}
    containers = apps.api_client.sanitize_for_serialization(dep.spec.template.spec.containers)
    containers[index]["args"] = args
    patch: list[Any] = [
        {"op": "replace", "path": "/spec/template/spec/containers", "value": containers},
        {
            "op": "replace" if annotations else "add",
            "path": "/spec/template/metadata/annotations",
            "value": {**annotations, BUILD_ANNOTATION: build},
        },
    ]
    return build, patch


def first_started(pods: list[Any], not_before: float) -> float | None:
    """The earliest ``startedAt`` of the pods' running containers (seconds; the API gives
    whole seconds, so this errs early: a detection time measured from it errs long), not
    before ``not_before`` (the patch: nothing of the new build ran before it); None when
    no pod reports one."""
    times: list[float] = []
    for p in pods:
        for c in (p.status.container_statuses if p.status is not None else None) or []:
            running = c.state.running if c.state is not None else None
            started = running.started_at if running is not None else None
            if started is not None:
                times.append(started.timestamp())
    return max(min(times), not_before) if times else None


def revision(rs: Any) -> int:
    """A ReplicaSet's rollout revision (-1: none)."""
    raw = (rs.metadata.annotations or {}).get(REVISION_ANNOTATION, "")
    return int(raw) if str(raw).isdigit() else -1


def previous_good(dep: Any, sets: list[Any]) -> tuple[Any | None, int, int]:
    """(the ReplicaSet to roll back to, the Deployment's revision, how many it owns): the
    highest revision below the current one among the ReplicaSets the Deployment owns whose
    pod template carries no bad build; None when there is none."""
    uid = dep.metadata.uid
    owned = [
        rs
        for rs in sets
        if any(o.uid == uid and o.controller for o in rs.metadata.owner_references or [])
    ]
    current = int((dep.metadata.annotations or {}).get(REVISION_ANNOTATION, "0") or 0)
    older = sorted((rs for rs in owned if 0 <= revision(rs) < current), key=revision)
    previous = next(
        (
            rs
            for rs in reversed(older)
            if (rs.spec.template.metadata.annotations or {}).get(BUILD_ANNOTATION) is None
        ),
        None,
    )
    return previous, current, len(owned)
