"""Kubernetes activities: readiness after a pod kill, a fresh or a bad canary rollout and
its undo, and the namespace guard for experiments that use ``chaosk8s`` directly.

The three rollout actions are the only things here that change the cluster, and they
change one Deployment: the target's ``model-canary`` workload, inside the blast radius.
The guard must never let a ``chaosk8s`` activity act outside it.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed, InterruptExecution

from canary_contract.json import JsonObject
from gameday import faults as gd_faults
from gameday.evidence.faults import bad_build_entries, is_bad_build
from gameday.evidence.workloads import is_whole, ready_within
from probes._broker import (
    FRESH_SUFFIX,
    get_release,
    patch_release,
    register_version,
    unused_version,
)
from probes._cluster import kubernetes_target, non_negative
from probes._context import MAX_WAIT_S, Configuration, Secrets, harness_errors, ledger
from probes._guard import activities, refused_namespaces
from probes._result import Slo
from probes._rollout import (
    BUILD_ANNOTATION,
    POLL_S,
    VERSION_ANNOTATION,
    CanaryChange,
    api_failed,
    bad_build_patch,
    canary_change,
    first_started,
    parse_kernel_fault,
    patch_deployment,
    previous_good,
    read_deployment,
    ready_pods,
    revision,
    wait_for_version,
    wait_rolled_out,
)

__all__ = [
    "before_activity_control",
    "before_experiment_control",
    "roll_out_bad_canary",
    "start_fresh_canary",
    "undo_canary_rollout",
    "wait_for_ready",
]

DEFAULT_BUILD_MIN_PROMPT_TOKENS = 2048  # --kernel-fault MODE without :MIN_PROMPT_TOKENS


# --- readiness -------------------------------------------------------------------------
def wait_for_ready(
    component: str,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """Wait until every workload of ``component`` is whole again: the workload reports
    all its replicas available AND that many of its pods are Running, Ready and not being
    deleted (right after a kill the controller may not have counted the loss yet).

    Measured: seconds from this run's last pod kill of the component (the ledger) until
    this probe saw it whole — an upper bound, as close as the probe's start and ``poll_s``
    allow — else the seconds waited; allowed: ``timeout_s``. Not whole in time: a failed
    check naming desired, available and ready pods.
    """
    allowed = min(non_negative("timeout_s", timeout_s), MAX_WAIT_S)
    poll = max(0.05, non_negative("poll_s", poll_s))
    target = kubernetes_target(configuration, "wait_for_ready")
    with harness_errors(f"waiting for {component} to be ready"):
        roles = target.expand_role(component)
        kills = [
            e.time for e in ledger(configuration).entries()
            if e.action == "kill" and e.component in roles
        ]  # fmt: skip
        start = max(kills) if kills else time.time()
        since = "pod kill" if kills else "probe start"
        deadline = time.monotonic() + allowed
        while True:
            states = [
                {**target.workload_status(role), "ready_pods": ready_pods(target, role)}
                for role in roles
            ]
            if all(is_whole(s) for s in states):
                return ready_within(component, states, allowed, time.time() - start, since)
            if time.monotonic() >= deadline:
                return ready_within(component, states, allowed, None, since)
            time.sleep(poll)


# --- a fresh canary before an experiment -------------------------------------------------
def start_fresh_canary(
    weight: int = 5,
    deadline_s: float = 300.0,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """Make the release ``progressing`` with a canary that is not quarantined and the
    canary weight ``weight``: nothing to do when it already is; after a trip, wait for
    the rollback to finish, then roll out a new canary version (``<version>-g<epoch ms>``)
    on the canary Deployment and switch the release to it. ActivityFailed naming the step
    that did not finish within ``deadline_s``.

    What a cluster needs between experiments and a local stack does not (``gameday run``
    gives every local experiment a fresh stack): a release the previous experiment tripped
    and rolled back cannot take its quarantined canary version again. The new version is
    the canary Deployment's pod-template annotation ``canarystack.io/model-version`` (the
    model servers' ``--version``), registered on the broker once the rollout is done.
    """
    try:
        wanted = int(weight)
    except (TypeError, ValueError):
        raise ActivityFailed(f"argument weight must be an integer, got {weight!r}") from None
    if not 1 <= wanted <= 100:
        raise ActivityFailed(f"argument weight must be from 1 to 100, got {weight!r}")
    with canary_change(
        configuration, "start_fresh_canary", deadline_s, "starting a fresh canary"
    ) as change:
        target = change.target
        release = _after_any_rollback(change)
        canary = release.get("canary") or {}
        phase = release.get("phase")
        weights = release.get("weights") or {}
        if phase == "progressing" and canary and not canary.get("quarantined"):
            if weights.get("canary") == wanted:
                return {"changed": False, "phase": phase, "canary_version": canary["version"]}
            patched = patch_release(
                target, {"weights": {"canary": wanted}}, "gameday: canary weight for the run"
            )
            return {
                "changed": True,
                "phase": patched["phase"],
                "canary_version": canary["version"],
                "weight": wanted,
            }
        previous = str(canary.get("version") or (release.get("stable") or {}).get("version"))
        version = _roll_out_new_version(change, previous)
        manifest = {"name": release.get("name"), "version": version, "engine": "sim",
                    "previous": previous}  # fmt: skip
        register_version(target, version, manifest)
        patched = patch_release(
            target,
            {"phase": "progressing", "canary": version, "weights": {"canary": wanted}},
            f"gameday: fresh canary {version} after {phase}",
        )
    return {
        "changed": True,
        "phase": patched["phase"],
        "previous_phase": phase,
        "previous_canary_version": previous,
        "canary_version": version,
        "weight": wanted,
        "took_s": change.took_s(),
    }


def _after_any_rollback(change: CanaryChange) -> JsonObject:
    """The release once no rollback is pending or running (``tripped``/``rolling_back``
    end with the rollback executor); ActivityFailed at the change's deadline."""
    target = change.target
    release = get_release(target)
    while release.get("phase") in ("tripped", "rolling_back"):
        if time.monotonic() >= change.deadline:
            raise ActivityFailed(
                f"release {target.release!r} is still {release.get('phase')!r} after "
                f"{change.wait:g} s: the rollback executor has not finished the last rollback"
            )
        time.sleep(POLL_S)
        release = get_release(target)
    return release


def _roll_out_new_version(change: CanaryChange, previous: str) -> str:
    """A version the broker has not seen (``<previous>-g<epoch ms>``) rolled out on the
    canary Deployment as its pod-template annotation; the version, once every pod has it."""
    target, name = change.target, change.name
    version = unused_version(target, FRESH_SUFFIX.sub("", previous))
    path = "/spec/template/metadata/annotations/" + VERSION_ANNOTATION.replace("/", "~1")
    patch = [{"op": "add", "path": path, "value": version}]
    what = f"patching deployment/{name} in {target.namespace!r}"
    patch_deployment(target, change.apps, name, patch, what)
    wait_for_version(target, name, version, change.deadline, change.wait)
    return version


# --- a faulty canary as a rollout of a bad build ----------------------------------------
def roll_out_bad_canary(
    kernel_fault: str = "fp8-kv-scale:2048",
    deadline_s: float = 120.0,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """Roll the canary Deployment out to a known-bad build: its model container's args
    gain ``--kernel-fault KERNEL_FAULT`` (``MODE[:MIN_PROMPT_TOKENS]``, the model server
    validates it) and its pod template the annotation ``canarystack.io/build``. Waits for
    the rollout (``deadline_s``); the ledger's fault time is when the bad build's first
    container started (the earliest moment it could serve users: with host networking and
    a shared port a pod takes connections before its readiness is seen), else when the
    rollout was seen done; the patch time and both others are in the detail.
    The canary version the broker knows is unchanged: the same version, a bad build of it,
    as a rebuilt image under the same tag. Undo with ``undo_canary_rollout``."""
    value, mode, tokens = parse_kernel_fault(kernel_fault)
    with canary_change(
        configuration, "roll_out_bad_canary", deadline_s, "rolling out a bad canary build"
    ) as change:
        target, apps, name = change.target, change.apps, change.name
        dep = read_deployment(target, apps, name)
        build, patch = bad_build_patch(apps, dep, name, value)
        patched_at = time.time()
        what = f"patching deployment/{name} in {target.namespace!r}"
        patch_deployment(target, apps, name, patch, what)
        pods = wait_rolled_out(target, apps, name, build, change.deadline, change.wait)
        rolled_out_at = time.time()
        started_at = first_started(pods, patched_at)
        served_at = started_at if started_at is not None else rolled_out_at
        urls = {r.name: r.url for r in target.replicas("model-canary")}
        # the model server's default threshold when the value names none
        threshold = int(tokens) if tokens else DEFAULT_BUILD_MIN_PROMPT_TOKENS
        params: JsonObject = {"mode": mode, "min_prompt_tokens": threshold, "build": build}
        detail: JsonObject = {
            "rollout": f"deployment/{name}",
            "patched_at": patched_at,
            "container_started_at": started_at,
            "rolled_out_at": rolled_out_at,
            "rollout_s": round(rolled_out_at - patched_at, 3),
        }
        names = [p.metadata.name for p in pods]
        book = ledger(configuration)
        for entry in bad_build_entries(
            [(p.metadata.name, p.metadata.uid) for p in pods], urls, params, detail, served_at
        ):
            book.append(entry)
        gd_faults.annotate(
            target,
            {
                "annotation": "fault_injected",
                "component": "model-canary",
                "kind": "kernel",
                "build": build,
                "replicas": names,
            },
            reason=f"gameday rolled the canary out to a bad build ({build})",
        )
    return {
        "deployment": name,
        "build": build,
        "pods": names,
        "patched_at": patched_at,
        "serving_at": served_at,
        "rollout_s": round(served_at - patched_at, 3),
    }


def undo_canary_rollout(
    deadline_s: float = 120.0,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """``kubectl rollout undo deployment/model-canary`` through the API: the Deployment's
    pod template becomes its previous ReplicaSet's (the highest revision below the current
    one, among the ReplicaSets the Deployment owns); waits for that rollout. Nothing to do
    when the canary is not a bad build of ``roll_out_bad_canary`` (idempotent, so it can
    be an experiment's rollback). Closes the ledger's bad-build entries."""
    with canary_change(
        configuration, "undo_canary_rollout", deadline_s, "undoing the canary rollout"
    ) as change:
        target, apps, name = change.target, change.apps, change.name
        dep = read_deployment(target, apps, name)
        current_build = (dep.spec.template.metadata.annotations or {}).get(BUILD_ANNOTATION)
        if current_build is None:
            _close_build_entries(configuration)
            return {"changed": False, "deployment": name, "why": "the canary is no bad build"}
        try:
            sets = apps.list_namespaced_replica_set(
                target.namespace, label_selector=target.selector("model-canary")
            ).items
        except Exception as exc:
            raise api_failed(f"listing the ReplicaSets of deployment/{name}", exc) from None
        previous, current, owned = previous_good(dep, sets)
        if previous is None:
            raise ActivityFailed(
                f"deployment/{name} (revision {current}) has no earlier ReplicaSet without a "
                f"bad build to roll back to ({owned} owned): roll it back by hand"
            )
        template = apps.api_client.sanitize_for_serialization(previous.spec.template)
        labels = dict(template.get("metadata", {}).get("labels") or {})
        labels.pop("pod-template-hash", None)
        template.setdefault("metadata", {})["labels"] = labels
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        patch_deployment(target, apps, name, patch, f"rolling deployment/{name} back")
        wait_rolled_out(target, apps, name, None, change.deadline, change.wait)
        closed = _close_build_entries(configuration)
    return {
        "changed": True,
        "deployment": name,
        "undone_build": current_build,
        "to_replicaset": previous.metadata.name,
        "to_revision": revision(previous),
        "closed_ledger_entries": closed,
        "took_s": change.took_s(),
    }


def _close_build_entries(configuration: Configuration | None) -> int:
    """A ``clear`` in the ledger for each bad-build entry still open (so clear_faults does
    not look for them on the model server's fault API, where they never were)."""
    book = ledger(configuration)
    n = 0
    for e in book.outstanding():
        if is_bad_build(e):
            book.append(e.cleared({"rolled_back": True}))
            n += 1
    return n


# --- the namespace guard (Chaos Toolkit controls; the rule is probes._guard) -----------
def before_experiment_control(
    context: JsonObject,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """Refuse the whole experiment before anything runs if any chaosk8s activity in it
    would act outside the blast radius.

    As a control::

        controls:
          - name: kubernetes-blast-radius
            provider: {type: python, module: probes.kubernetes}
    """
    problems = refused_namespaces(activities(context), configuration, secrets)
    if problems:
        raise InterruptExecution(
            "refused by the kubernetes blast-radius guard: " + "; ".join(problems)
        )


def before_activity_control(
    context: JsonObject,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """The same check on each activity, right before it runs."""
    problems = refused_namespaces([context], configuration, secrets)
    if problems:
        raise InterruptExecution(
            "refused by the kubernetes blast-radius guard: " + "; ".join(problems)
        )
