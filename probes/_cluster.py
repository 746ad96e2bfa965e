"""Shared by the cluster probes (``probes.kubernetes``, ``probes.progressive``,
``probes.prometheus``): the Kubernetes target, times, and the traffic evidence that pairs
a controller's status with what users were actually served.

No traffic at all after the status change must never count as the canary having stopped
serving: the check fails (fail-closed). This module only reads.
"""

from __future__ import annotations

import os
import time
from functools import partial

import requests
from chaoslib.exceptions import ActivityFailed

from gameday.api import ApiError, PrometheusApi
from gameday.evidence.canary_traffic import TrafficEvidence, promql_traffic
from gameday.evidence.controllers import epoch_s
from gameday.evidence.promql import instant_value
from gameday.run.folder import RecordsError
from gameday.targets import TargetError
from gameday.targets.kubernetes import KubernetesTarget
from probes._context import Configuration, get_target, reported, run_folder

__all__ = [
    "canary_traffic_after",
    "epoch_s",
    "kubernetes_target",
    "prometheus_url",
    "promql_value",
]

CONFIG_PROMETHEUS_URL = "prometheus_url"
ENV_PROMETHEUS_URL = "PROMETHEUS_URL"


def kubernetes_target(configuration: Configuration | None, what: str) -> KubernetesTarget:
    """The run's target, which must be a Kubernetes target inside its blast radius."""
    target = get_target(configuration)
    if not isinstance(target, KubernetesTarget):
        raise ActivityFailed(
            f"{what} needs a kubernetes target, but the target is {target.kind!r}: point "
            "gameday_target (or $GAMEDAY_TARGET) at a target file with kind: kubernetes."
        )
    try:
        target.check_namespace()
    except TargetError as exc:
        raise ActivityFailed(f"{what}: {exc}") from None
    return target


# --- Prometheus ----------------------------------------------------------------------
def prometheus_url(configuration: Configuration | None, given: str | None) -> str:
    """The ``prometheus_url`` argument, else the configuration entry ``prometheus_url``, else
    ``$PROMETHEUS_URL``."""
    url = (
        given
        or (configuration or {}).get(CONFIG_PROMETHEUS_URL)
        or os.environ.get(ENV_PROMETHEUS_URL)
    )
    if not url:
        raise ActivityFailed(
            "no Prometheus URL: pass prometheus_url, set the configuration entry "
            f"{CONFIG_PROMETHEUS_URL!r}, or export {ENV_PROMETHEUS_URL} "
            "(e.g. http://prometheus-server.monitoring.svc:80)."
        )
    return str(url).rstrip("/")


def promql_value(url: str, expr: str, at: float | None = None) -> float | None:
    """An instant query's value: the sum of a vector's samples, or a scalar; None when the
    vector is empty (no series matched). ActivityFailed when Prometheus says no."""
    with reported(ApiError), requests.Session() as session:
        data = PrometheusApi(session, url).query(expr, at)
    try:
        return instant_value(data)
    except ValueError as exc:
        raise ActivityFailed(f"Prometheus answered {expr!r} with {exc}.") from None


# --- traffic evidence ------------------------------------------------------------------
def canary_traffic_after(
    since: float,
    configuration: Configuration | None,
    *,
    canary_version: str | None = None,
    canary_promql: str | None = None,
    total_promql: str | None = None,
    prometheus: str | None = None,
) -> TrafficEvidence:
    """Requests started after ``since``: ``{"source", "canary", "total", ...}``; ``total``
    None when the source cannot tell. ActivityFailed when there is no evidence to read.

    Two sources: a PromQL expression over the Prometheus HTTP API, with ``{window}``
    replaced by the seconds since ``since`` (``[{window}]`` -> ``[37s]``); else the run's
    load records (once the ``probes.load`` control has stopped the load): canary-served
    means ``served_by == "canary"``, or, for stacks whose router does not say (a service
    mesh driven by Argo Rollouts or Flagger), ``model_version`` equal to ``canary_version``.
    """
    if canary_promql:
        url = prometheus_url(configuration, prometheus)
        value = partial(promql_value, url)
        return promql_traffic(url, canary_promql, total_promql, since, time.time(), value)
    with reported(RecordsError):
        return run_folder(configuration).records_traffic(since, canary_version)
