"""Kubernetes activities: readiness after a pod kill, a fresh or a bad canary rollout and
its undo, and the namespace guard for experiments that use ``chaosk8s`` directly.

The three rollout actions are the only things here that change the cluster, and they
change one Deployment: the target's ``model-canary`` workload, inside the blast radius.
The guard must never let a ``chaosk8s`` activity act outside it. The work is the harness
core's (``gameday.targets.rollout``, ``gameday.targets.guard``); these are its adapters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chaoslib.exceptions import ActivityFailed, InterruptExecution
from chaoslib.types import Activity, Experiment

from gameday.evidence.rollouts import BUILD_ANNOTATION as BUILD_ANNOTATION  # for the tests
from gameday.evidence.rollouts import VERSION_ANNOTATION as VERSION_ANNOTATION
from gameday.evidence.rollouts import BadBuildParams, RolloutError, build_patch, parse_kernel_fault
from gameday.targets import rollout as core
from gameday.targets.broker_writes import target_broker
from gameday.targets.kubernetes import KubernetesTarget
from gameday.targets.rollout import CANARY, CanaryChange
from probes._cluster import kubernetes_target
from probes._context import (
    MAX_WAIT_S,
    Configuration,
    Secrets,
    get_target,
    harness_errors,
    ledger,
    non_negative,
    reported,
)
from probes._guard import activities, refused_namespaces
from probes._result import Slo

__all__ = [
    "before_activity_control",
    "before_experiment_control",
    "roll_out_bad_build",
    "roll_out_bad_canary",
    "start_fresh_canary",
    "undo_canary_rollout",
    "wait_for_ready",
]


@contextmanager
def rollout_errors(doing: str) -> Iterator[None]:
    """The harness's errors as ``ActivityFailed`` naming what it was ``doing``; a
    ``RolloutError`` as the ``ActivityFailed`` of its own message."""
    with harness_errors(doing), reported(RolloutError):
        yield


@contextmanager
def canary_change(
    configuration: Configuration | None, activity: str, deadline_s: float, doing: str
) -> Iterator[CanaryChange]:
    """The canary Deployment ``activity`` changes within ``deadline_s``; inside, the
    harness's errors become ``ActivityFailed`` (``rollout_errors``)."""
    wait = min(non_negative("deadline_s", deadline_s), MAX_WAIT_S)
    with rollout_errors(doing):
        target = canary_cluster(configuration, activity)
        yield CanaryChange.begin(target, activity, wait)


def canary_cluster(configuration: Configuration | None, activity: str) -> KubernetesTarget:
    """The cluster the canary's Deployment is on: a Kubernetes target's own, or a foreign
    stack's (``kind: external``, ``components.model-canary.rollout``)."""
    target = get_target(configuration)
    rollout_cluster = getattr(target, "rollout_cluster", None)
    if callable(rollout_cluster):
        target.check_allowed(CANARY)
        cluster: KubernetesTarget = rollout_cluster(CANARY)
        cluster.check_namespace()
        return cluster
    return kubernetes_target(configuration, activity)


# --- readiness -------------------------------------------------------------------------
def wait_for_ready(
    component: str,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    configuration: Configuration | None = None,
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
        return core.wait_whole(target, component, allowed, poll, ledger(configuration))


# --- a fresh canary before an experiment -------------------------------------------------
def start_fresh_canary(
    weight: int = 5,
    deadline_s: float = 300.0,
    configuration: Configuration | None = None,
) -> core.FreshCanary:
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
        return core.fresh_canary(change, wanted, target_broker(change.target))


# --- a faulty canary as a rollout of a bad build ----------------------------------------
def roll_out_bad_canary(
    kernel_fault: str = "fp8-kv-scale:2048",
    deadline_s: float = 120.0,
    hold_traffic: bool = False,
    configuration: Configuration | None = None,
) -> core.BuildRolledOut:
    """Roll the canary Deployment out to a known-bad build: its model container's args
    gain ``--kernel-fault KERNEL_FAULT`` (``MODE[:MIN_PROMPT_TOKENS]``, the model server
    validates it) and its pod template the annotation ``canarystack.io/build``. Waits for
    the rollout (``deadline_s``); the ledger's fault time is when the bad build's server
    could first take a request (its ``/health`` ``uptime_s`` back from when it answered:
    with host networking and a shared port a pod takes connections before its readiness
    is seen), else when its first container started (whole seconds, before the
    interpreter's start-up), else when the rollout was seen done; the patch time and the
    others are in the detail.
    The canary version the broker knows is unchanged: the same version, a bad build of it,
    as a rebuilt image under the same tag. Undo with ``undo_canary_rollout``.

    ``hold_traffic``: the canary's weight is 0 while the new pods start and comes back
    when they serve (a canary controller sends traffic only to ready pods); the fault is
    timed from then. For engines that take a minute to start (vLLM): without it, users
    meet a minute of 503s from the starting pod and the gate trips on those errors, not
    on the bad build."""
    with rollout_errors("rolling out a bad canary build"):
        value, mode, tokens = parse_kernel_fault(kernel_fault)
        if not isinstance(hold_traffic, bool):
            raise RolloutError(
                f"argument hold_traffic is {hold_traffic!r}: give true or false (in an "
                "experiment: a configuration entry with env_var_type: bool)"
            )
        hold = hold_traffic
    with canary_change(
        configuration, "roll_out_bad_canary", deadline_s, "rolling out a bad canary build"
    ) as change:
        broker = target_broker(change.target) if hold else None
        book = ledger(configuration)
        return core.roll_out_bad_build(change, value, mode, tokens, book, hold=broker)


def roll_out_bad_build(
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    image: str | None = None,
    container: str | None = None,
    min_prompt_tokens: int = 0,
    deadline_s: float = 300.0,
    configuration: Configuration | None = None,
) -> core.BuildRolledOut:
    """Roll the canary's Deployment out to a bad build of any engine: its engine container
    gains ``args`` (e.g. vLLM's ``[--kv-cache-dtype, fp8]``), ``env`` and, when given,
    ``image``, and its pod template the annotation ``canarystack.io/build``. Waits for the
    rollout (``deadline_s``); the ledger's fault (a ``kernel`` fault on ``model-canary``
    acting on prompts of at least ``min_prompt_tokens``) is timed when the bad build's
    server could first take a request (as ``roll_out_bad_canary``). For a Kubernetes
    target and for a foreign stack whose target file names
    ``components.model-canary.rollout``. Undo with ``undo_canary_rollout``::

        - type: action
          name: canary-rolls-out-fp8-kv-cache
          provider:
            type: python
            module: probes.kubernetes
            func: roll_out_bad_build
            arguments: {args: [--kv-cache-dtype, fp8], deadline_s: 300}
    """
    with rollout_errors("rolling out a bad build"):
        tokens = int(non_negative("min_prompt_tokens", min_prompt_tokens))
        if args is not None and not (
            isinstance(args, list) and all(isinstance(a, str) for a in args)
        ):
            raise RolloutError(f"argument args must be a list of strings, got {args!r}")
        if env is not None and not (
            isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
        ):
            raise RolloutError(f"argument env must map names to strings, got {env!r}")
    with canary_change(
        configuration, "roll_out_bad_build", deadline_s, "rolling out a bad build"
    ) as change:
        dep = core.read_deployment(change.target, change.apps, change.name)
        build, patch = build_patch(
            change.apps, dep, change.name, container, list(args or []), dict(env or {}), image
        )
        params = BadBuildParams(mode="bad-build", min_prompt_tokens=tokens, build=build)
        foreign = get_target(configuration).kind == "external"
        return core.roll_out_build(
            change, build, patch, params, ledger(configuration), admin_urls=not foreign
        )


def undo_canary_rollout(
    deadline_s: float = 120.0,
    configuration: Configuration | None = None,
) -> core.BuildKept | core.BuildUndone:
    """``kubectl rollout undo deployment/model-canary`` through the API: the Deployment's
    pod template becomes its previous ReplicaSet's (the highest revision below the current
    one, among the ReplicaSets the Deployment owns); waits for that rollout. Nothing to do
    when the canary is not a bad build of ``roll_out_bad_canary`` (idempotent, so it can
    be an experiment's rollback). Closes the ledger's bad-build entries."""
    with canary_change(
        configuration, "undo_canary_rollout", deadline_s, "undoing the canary rollout"
    ) as change:
        return core.undo_bad_build(change, ledger(configuration))


# --- the namespace guard (Chaos Toolkit controls; the rule is gameday.targets.guard) ---
def before_experiment_control(
    context: Experiment,
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
    _guard(activities(context), configuration, secrets)


def before_activity_control(
    context: Activity,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """The same check on each activity, right before it runs."""
    _guard([context], configuration, secrets)


def _guard(
    guarded: list[Activity], configuration: Configuration | None, secrets: Secrets | None
) -> None:
    """InterruptExecution naming every chaosk8s activity the blast radius refuses."""
    problems = refused_namespaces(guarded, configuration, secrets)
    if problems:
        raise InterruptExecution(
            "refused by the kubernetes blast-radius guard: " + "; ".join(problems)
        )
