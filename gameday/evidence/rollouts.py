"""What a canary Deployment's objects say about its rollouts, and the patches that change
them: a pod's readiness, a rollout's progress, the bad build's container args and its
undo's ReplicaSet (``gameday.targets.rollout`` reads and patches them over the API).

Pure: objects as the kubernetes client gave them in; the only API object used is a
client's serializer. A bad build is always marked on its pod template
(``BUILD_ANNOTATION``), so an undo never rolls back to another bad build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from gameday.errors import GamedayError

VERSION_ANNOTATION = "canarystack.io/model-version"
BUILD_ANNOTATION = "canarystack.io/build"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
KERNEL_FAULT_FLAG = "--kernel-fault"
DEFAULT_BUILD_MIN_PROMPT_TOKENS = 2048  # --kernel-fault MODE without :MIN_PROMPT_TOKENS


class RolloutError(GamedayError, RuntimeError):
    """A canary rollout that cannot be made or did not finish; the message is whole (an
    activity reports it as it is)."""


class BadBuildParams(TypedDict):
    """The ledger's params of a bad build: its mode, the prompt length it starts at and
    the build (its ``BUILD_ANNOTATION``)."""

    mode: str
    min_prompt_tokens: int
    build: str


def pod_ready(p: Any) -> bool:
    """A pod that is Running, Ready and not being deleted."""
    conditions = (p.status.conditions if p.status else None) or []
    return bool(
        p.metadata.deletion_timestamp is None
        and p.status is not None
        and p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in conditions)
    )


def progress(dep: Any) -> tuple[int, Any, bool, str]:
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
    words = (
        f"generation {dep.metadata.generation} observed {st.observed_generation}, "
        f"{st.updated_replicas or 0} updated / {st.available_replicas or 0} available / "
        f"{st.replicas or 0} in all of {desired}"
    )
    return desired, st, rolled_out, words


@dataclass(frozen=True)
class BuildRollout:
    """Where a Deployment's rollout to one build stands."""

    done: bool  # rolled out, every live pod of the build and as many Ready as desired
    ready: list[Any]  # the live pods of the build that are Ready
    stale: list[str]  # the live pods of another build
    progress: str  # the controller's progress in words


def build_rollout(dep: Any, pods: list[Any], build: str | None) -> BuildRollout:
    """How far Deployment ``dep`` has rolled out to ``build`` (its pods' ``BUILD_ANNOTATION``;
    None: none), given its pods (``pods``, terminating ones included)."""
    desired, _, rolled_out, words = progress(dep)
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    stale = [
        p.metadata.name
        for p in live
        if (p.metadata.annotations or {}).get(BUILD_ANNOTATION) != build
    ]
    ready = [p for p in live if p.metadata.name not in stale and pod_ready(p)]
    return BuildRollout(rolled_out and not stale and len(ready) >= desired, ready, stale, words)


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
    raise RolloutError(
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
    ``MODE[:MIN_PROMPT_TOKENS]``; RolloutError naming the argument when malformed."""
    value = str(raw).strip()
    mode, _, tokens = value.partition(":")
    if not mode or any(ch.isspace() for ch in value) or (tokens and not tokens.isdigit()):
        raise RolloutError(
            f"argument kernel_fault is {raw!r}: give MODE[:MIN_PROMPT_TOKENS], "
            "e.g. fp8-kv-scale:2048 (the model server's --kernel-fault)"
        )
    return value, mode, tokens


def bad_build_params(mode: str, tokens: str, build: str) -> BadBuildParams:
    """The ledger's params of a bad build: its mode and the prompt length it starts at
    (the model server's default threshold when the value names none)."""
    threshold = int(tokens) if tokens else DEFAULT_BUILD_MIN_PROMPT_TOKENS
    return {"mode": mode, "min_prompt_tokens": threshold, "build": build}


def bad_build_patch(apps: Any, dep: Any, name: str, value: str) -> tuple[str, list[Any]]:
    """(build, JSON patch) that makes deployment/``name`` the bad build ``--kernel-fault
    VALUE``: its model container's args with the flag (an earlier one replaced, not
    stacked) and the pod template's ``BUILD_ANNOTATION``.

    The whole container list is replaced (a JSON patch cannot test an index): the same
    containers as read, the model server's with the bad build's args. ``apps``: only its
    client's serializer is used."""
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


def build_patch(
    apps: Any,
    dep: Any,
    name: str,
    container: str | None,
    args_add: list[str],
    env: dict[str, str],
    image: str | None,
) -> tuple[str, list[Any]]:
    """(build, JSON patch) that makes deployment/``name`` a bad build of any engine: its
    ``container`` (else the model container, ``model_container``) gains ``args_add`` after
    its own args (e.g. vLLM's ``--kv-cache-dtype fp8``), ``env`` (set or replaced) and,
    when given, ``image``; the pod template gets ``BUILD_ANNOTATION`` = the build's name.
    RolloutError when it changes nothing or names no container the template has."""
    if not (args_add or env or image):
        raise RolloutError("a bad build changes something: give args, env or image")
    containers_in = list(dep.spec.template.spec.containers or [])
    if container is None:
        index, _ = model_container(dep, name)
    else:
        found = [i for i, c in enumerate(containers_in) if c.name == container]
        if not found:
            names = ", ".join(str(c.name) for c in containers_in) or "none"
            raise RolloutError(f"deployment/{name} has no container {container!r} ({names})")
        index = found[0]
    containers = apps.api_client.sanitize_for_serialization(containers_in)
    target = containers[index]
    target["args"] = [*(target.get("args") or []), *args_add]
    kept = [e for e in target.get("env") or [] if e.get("name") not in env]
    target["env"] = [*kept, *({"name": k, "value": v} for k, v in sorted(env.items()))]
    if image:
        target["image"] = image
    parts = [*args_add, *(f"{k}={v}" for k, v in sorted(env.items()))]
    build = "bad-build: " + " ".join([*parts, *([f"image={image}"] if image else [])])
    annotations = dep.spec.template.metadata.annotations or {}
    patch: list[Any] = [
        {"op": "replace", "path": "/spec/template/spec/containers", "value": containers},
        {
            "op": "replace" if annotations else "add",
            "path": "/spec/template/metadata/annotations",
            "value": {**annotations, BUILD_ANNOTATION: build[:250]},
        },
    ]
    return build[:250], patch


def version_patch(version: str) -> list[Any]:
    """The JSON patch that rolls the pod template out to ``VERSION_ANNOTATION`` =
    ``version``."""
    path = "/spec/template/metadata/annotations/" + VERSION_ANNOTATION.replace("/", "~1")
    return [{"op": "add", "path": path, "value": version}]


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


def undo_patch(apps: Any, previous: Any) -> list[Any]:
    """The JSON patch that gives a Deployment the pod template of ReplicaSet ``previous``
    (without its ``pod-template-hash`` label, which the controller adds)."""
    template = apps.api_client.sanitize_for_serialization(previous.spec.template)
    labels = dict(template.get("metadata", {}).get("labels") or {})
    labels.pop("pod-template-hash", None)
    template.setdefault("metadata", {})["labels"] = labels
    return [{"op": "replace", "path": "/spec/template", "value": template}]
