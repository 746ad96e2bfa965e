"""Probes for clusters whose canary is driven by a progressive-delivery controller: Argo
Rollouts (``Rollout``) and Flagger (``Canary``), read through the Kubernetes API
(CustomObjectsApi, ``get`` only, in the target's namespace).

A status alone must never pass (those controllers have had fail-open bugs): each probe
pairs it with the traffic served after it (``gameday.targets.controllers``). These probes
never change anything in the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeVar

from gameday.evidence.controllers import ArgoView, FlaggerView
from gameday.targets import controllers
from probes._cluster import canary_traffic_after, kubernetes_target
from probes._context import MAX_WAIT_S, Configuration, non_negative, reported
from probes._result import Slo

__all__ = ["argo_rollout_aborted", "argo_rollout_status", "flagger_canary_failed",
           "flagger_canary_status"]  # fmt: skip


View = TypeVar("View", bound=Mapping[str, object])


class _TrafficArgs(TypedDict):
    """The probes' traffic arguments as ``canary_traffic_after`` takes them."""

    canary_version: str | None
    canary_promql: str | None
    total_promql: str | None
    prometheus: str | None


def _status(
    controller: controllers.Controller[View], name: str, configuration: Configuration | None
) -> View:
    target = kubernetes_target(configuration, controller.status_probe)
    with reported(controllers.ControllerError):
        return controller.view(controllers.read_object(target, controller.crd, name))


# --- Argo Rollouts -------------------------------------------------------------------
def argo_rollout_status(
    rollout: str,
    configuration: Configuration | None = None,
) -> ArgoView:
    """What the Argo Rollout says: phase, abort, the RolloutAborted condition, its time
    (epoch seconds) and the canary weight when traffic routing reports one."""
    return _status(controllers.ARGO, rollout, configuration)


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
    traffic = _traffic(canary_version, canary_promql, total_promql, prometheus_url)
    return _paired(
        controllers.ARGO, rollout, grace_s, max_canary_requests, timeout_s, traffic, configuration
    )


# --- Flagger -------------------------------------------------------------------------
def flagger_canary_status(
    canary: str,
    configuration: Configuration | None = None,
) -> FlaggerView:
    """What the Flagger Canary says: phase, canaryWeight, failedChecks, when it changed."""
    return _status(controllers.FLAGGER, canary, configuration)


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
) -> Slo:
    """The Flagger Canary has failed — phase ``Failed`` with ``canaryWeight`` 0 — AND at
    most ``max_canary_requests`` canary-served requests started later than ``grace_s``
    after its last transition. Waits up to ``timeout_s`` for the Failed phase."""
    traffic = _traffic(canary_version, canary_promql, total_promql, prometheus_url)
    return _paired(
        controllers.FLAGGER, canary, grace_s, max_canary_requests, timeout_s, traffic, configuration
    )


# --- the pairing -----------------------------------------------------------------------
def _traffic(
    canary_version: str | None,
    canary_promql: str | None,
    total_promql: str | None,
    prometheus_url: str | None,
) -> _TrafficArgs:
    """The probes' traffic arguments as ``canary_traffic_after`` takes them."""
    return {
        "canary_version": canary_version,
        "canary_promql": canary_promql,
        "total_promql": total_promql,
        "prometheus": prometheus_url,
    }


def _paired(
    controller: controllers.Controller[View],
    name: str,
    grace_s: float,
    max_canary_requests: int,
    timeout_s: float,
    traffic: _TrafficArgs,
    configuration: Configuration | None,
) -> Slo:
    """The controller's check (``stopped_check``) with the activity's arguments."""
    grace = non_negative("grace_s", grace_s)
    allowed = non_negative("max_canary_requests", max_canary_requests)
    wait = min(non_negative("timeout_s", timeout_s), MAX_WAIT_S)
    return controllers.stopped_check(
        controller,
        name,
        lambda: _status(controller, name, configuration),
        grace,
        allowed,
        wait,
        lambda since: canary_traffic_after(since, configuration, **traffic),
    )
