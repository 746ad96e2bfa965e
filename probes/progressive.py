"""Probes for clusters whose canary is driven by a progressive-delivery controller: Argo
Rollouts (``Rollout``) and Flagger (``Canary``), read through the Kubernetes API
(CustomObjectsApi, ``get`` only, in the target's namespace).

A status alone must never pass (those controllers have had fail-open bugs): each probe
pairs it with the traffic served after it (``gameday.evidence.controllers``). These probes
never change anything in the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday.evidence import controllers as ctl
from probes._cluster import (
    canary_traffic_after,
    kubernetes_target,
    non_negative,
)
from probes._context import MAX_WAIT_S, Configuration, Secrets
from probes._result import Slo

__all__ = ["argo_rollout_aborted", "argo_rollout_status", "flagger_canary_failed",
           "flagger_canary_status"]  # fmt: skip

ARGO = ("argoproj.io", "v1alpha1", "rollouts")
FLAGGER = ("flagger.app", "v1beta1", "canaries")
POLL_S = 1.0


def _read(
    configuration: Configuration | None, crd: tuple[str, str, str], name: str, what: str
) -> JsonObject:
    target = kubernetes_target(configuration, what)
    from kubernetes import client

    group, version, plural = crd
    api = client.CustomObjectsApi(target.api_client())
    try:
        obj = api.get_namespaced_custom_object(group, version, target.namespace, plural, name)
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            raise ActivityFailed(
                f"{plural}.{group} {name!r} not found in namespace {target.namespace!r} "
                f"(is the controller installed and the name right?)"
            ) from None
        if status == 403:
            raise ActivityFailed(
                f"reading {plural}.{group} {name!r} is forbidden: the chaos runner's Role "
                "needs get on it (deploy/k8s/components/progressive-delivery)"
            ) from None
        raise ActivityFailed(
            f"reading {plural}.{group} {name!r} in {target.namespace!r} failed: "
            f"{getattr(exc, 'reason', None) or exc}"
        ) from None
    if not isinstance(obj, dict):
        raise ActivityFailed(f"{plural}.{group} {name!r}: the API answered {type(obj).__name__}")
    return obj


# --- Argo Rollouts -------------------------------------------------------------------
def argo_rollout_status(
    rollout: str,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """What the Argo Rollout says: phase, abort, the RolloutAborted condition, its time
    (epoch seconds) and the canary weight when traffic routing reports one."""
    return ctl.argo_view(_read(configuration, ARGO, rollout, "argo_rollout_status"))


def argo_rollout_aborted(
    rollout: str,
    grace_s: float = 5.0,
    max_canary_requests: int = 0,
    timeout_s: float = 0.0,
    canary_version: str | None = None,
    canary_promql: str | None = None,
    total_promql: str | None = None,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The Rollout is aborted — ``status.abort`` true, phase ``Degraded``, condition
    ``Progressing``/``RolloutAborted`` — its canary weight (if reported) is 0, AND at most
    ``max_canary_requests`` canary-served requests started later than ``grace_s`` after
    the abort. Waits up to ``timeout_s`` for the abort status.

    The result's ``measured`` is the number of canary-served requests that started later
    than ``grace_s`` after the status change (the run's load records, or a PromQL
    expression), ``allowed`` is ``max_canary_requests``; a status that never says aborted
    within ``timeout_s`` is a failed check naming expected and actual::

        - type: probe
          name: argo-aborted-and-canary-drained
          tolerance: {type: probe, name: slo-met,
                      provider: {type: python, module: probes.slo, func: slo_met}}
          provider: {type: python, module: probes.progressive, func: argo_rollout_aborted,
                     arguments: {rollout: llm-server, grace_s: 5, timeout_s: 60}}
    """
    return _paired(
        check="argo_rollout_aborted",
        name=rollout,
        read=lambda: argo_rollout_status(rollout, configuration),
        is_done=ctl.argo_aborted,
        expected="aborted (status.abort true, phase Degraded, condition RolloutAborted)",
        since_key="aborted_at",
        grace_s=grace_s,
        max_canary_requests=max_canary_requests,
        timeout_s=timeout_s,
        traffic=_traffic(canary_version, canary_promql, total_promql, prometheus_url),
        configuration=configuration,
    )


# --- Flagger -------------------------------------------------------------------------
def flagger_canary_status(
    canary: str,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> JsonObject:
    """What the Flagger Canary says: phase, canaryWeight, failedChecks, when it changed."""
    return ctl.flagger_view(_read(configuration, FLAGGER, canary, "flagger_canary_status"))


def flagger_canary_failed(
    canary: str,
    grace_s: float = 5.0,
    max_canary_requests: int = 0,
    timeout_s: float = 0.0,
    canary_version: str | None = None,
    canary_promql: str | None = None,
    total_promql: str | None = None,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
) -> Slo:
    """The Flagger Canary has failed — phase ``Failed`` with ``canaryWeight`` 0 — AND at
    most ``max_canary_requests`` canary-served requests started later than ``grace_s``
    after its last transition. Waits up to ``timeout_s`` for the Failed phase."""
    return _paired(
        check="flagger_canary_failed",
        name=canary,
        read=lambda: flagger_canary_status(canary, configuration),
        is_done=ctl.flagger_failed,
        expected="phase Failed",
        since_key="changed_at",
        grace_s=grace_s,
        max_canary_requests=max_canary_requests,
        timeout_s=timeout_s,
        traffic=_traffic(canary_version, canary_promql, total_promql, prometheus_url),
        configuration=configuration,
    )


# --- the pairing -----------------------------------------------------------------------
def _traffic(
    canary_version: str | None,
    canary_promql: str | None,
    total_promql: str | None,
    prometheus_url: str | None,
) -> JsonObject:
    """The probes' traffic arguments as ``canary_traffic_after`` takes them."""
    return {
        "canary_version": canary_version,
        "canary_promql": canary_promql,
        "total_promql": total_promql,
        "prometheus": prometheus_url,
    }


def _paired(
    *,
    check: str,
    name: str,
    read: Callable[[], JsonObject],
    is_done: Callable[[JsonObject], bool],
    expected: str,
    since_key: str,
    grace_s: float,
    max_canary_requests: int,
    timeout_s: float,
    traffic: JsonObject,
    configuration: Configuration | None,
) -> Slo:
    grace = non_negative("grace_s", grace_s)
    allowed = non_negative("max_canary_requests", max_canary_requests)
    wait = min(non_negative("timeout_s", timeout_s), MAX_WAIT_S)
    deadline = time.monotonic() + wait
    view = read()
    while not is_done(view) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        view = read()
    refused = ctl.status_refusal(
        check, name, view, is_done(view), expected, since_key, allowed, wait
    )
    if refused is not None:
        return refused
    since = float(view[since_key]) + grace
    evidence = canary_traffic_after(since, configuration, **traffic)
    return ctl.paired(check, name, expected, view, since, grace, evidence, allowed)
