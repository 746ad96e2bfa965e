"""Probes over Prometheus (PromQL through the HTTP API ``/api/v1/query``), for routers and
gates that export their weights, traffic and trips as metrics.

An answer that is not a finite number, and an empty answer where traffic is not shown to
be scraped, must never pass: the check fails and says so. These probes only read.
"""

from __future__ import annotations

import math

from chaoslib.exceptions import ActivityFailed

from gameday.evidence.promql import bounded, drained, expand
from probes._cluster import prometheus_url as _url
from probes._cluster import promql_value
from probes._context import Configuration, get_target, non_negative, reported
from probes._result import Slo

__all__ = ["canary_drained", "metric_at_least", "metric_at_most", "query_value"]

# Metric names exported by canarystack's router (canarystack/router/server.py).
WEIGHT_QUERY = 'max(router_canary_weight_percent{namespace="{namespace}"})'
CANARY_QUERY = (
    'sum(increase(router_requests_total{namespace="{namespace}",variant="canary"}[{window}]))'
)
TOTAL_QUERY = 'sum(increase(router_requests_total{namespace="{namespace}"}[{window}]))'
# The same on a local target: its Prometheus scrapes one stack (gameday.prom).
LOCAL_QUERIES = {
    WEIGHT_QUERY: "max(router_canary_weight_percent)",
    CANARY_QUERY: 'sum(increase(router_requests_total{variant="canary"}[{window}]))',
    TOTAL_QUERY: "sum(increase(router_requests_total[{window}]))",
}


def _expand(expr: str, configuration: Configuration | None, window_s: float | None) -> str:
    """``gameday.evidence.promql.expand`` of ``expr``, with the target's namespace (the
    target is read only when ``expr`` names one)."""
    target = get_target(configuration) if isinstance(expr, str) and "{namespace}" in expr else None
    namespace = getattr(target, "namespace", None)
    with reported(ValueError):
        return expand(expr, window_s, namespace and str(namespace), target.name if target else "")


def query_value(
    promql: str,
    window_s: float | None = None,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
) -> float | None:
    """The value of an instant query (a vector is summed); None when no series matched
    or the answer is not a finite number (NaN, +Inf, -Inf).

    An answer that is not a finite number (``NaN``: a ratio or a quantile over no traffic;
    ``±Inf``: a division by zero, or a quantile above a histogram's largest finite bucket) is
    no figure: None here, and a failed check in the probes.
    """
    url = _url(configuration, prometheus_url)
    value = promql_value(url, _expand(promql, configuration, window_s))
    return None if value is None or not math.isfinite(value) else value


def _namespace(configuration: Configuration | None) -> str | None:
    namespace = getattr(get_target(configuration), "namespace", None)
    return str(namespace) if namespace else None


def _bounded(
    check: str,
    promql: str,
    limit: float,
    unit: str,
    at_most: bool,
    window_s: float | None,
    url_arg: str | None,
    configuration: Configuration | None,
) -> Slo:
    allowed = float(limit)
    url = _url(configuration, url_arg)
    expr = _expand(promql, configuration, window_s)
    value = promql_value(url, expr)
    return bounded(check, value, allowed, unit, at_most, {"query": expr, "prometheus_url": url})


def metric_at_most(
    promql: str,
    max_value: float,
    check: str = "promql_at_most",
    unit: str = "count",
    window_s: float | None = None,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
) -> Slo:
    """The expression's value is at most ``max_value`` (no series at all fails)."""
    return _bounded(check, promql, max_value, unit, True, window_s, prometheus_url, configuration)


def metric_at_least(
    promql: str,
    min_value: float,
    check: str = "promql_at_least",
    unit: str = "count",
    window_s: float | None = None,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
) -> Slo:
    """The expression's value is at least ``min_value`` (no series at all fails)."""
    return _bounded(check, promql, min_value, unit, False, window_s, prometheus_url, configuration)


def canary_drained(
    window_s: float = 30.0,
    max_canary_requests: float = 0.0,
    weight_promql: str = WEIGHT_QUERY,
    canary_promql: str = CANARY_QUERY,
    total_promql: str = TOTAL_QUERY,
    prometheus_url: str | None = None,
    configuration: Configuration | None = None,
) -> Slo:
    """Every router reports canary weight 0 AND the routers served at most
    ``max_canary_requests`` canary requests in the last ``window_s`` seconds, while they
    served some requests (so the zero is traffic, not a missing metric).

    It pairs a status with traffic: the routers *say* the canary weight is 0
    (``router_canary_weight_percent``) AND they *served* no canary request in the window
    (``router_requests_total{variant="canary"}``) while they did serve requests — an empty
    answer is never read as "zero" unless the total shows that the metrics are scraped. On a
    local target (one Prometheus per stack, ``gameday.prom``) the default queries select
    every router, without a namespace::

        - type: probe
          name: weight-0-and-no-canary-traffic
          tolerance: {type: probe, name: slo-met,
                      provider: {type: python, module: probes.slo, func: slo_met}}
          provider: {type: python, module: probes.prometheus, func: canary_drained,
                     arguments: {window_s: 30}}
    """
    window = non_negative("window_s", window_s)
    if window < 1:
        raise ActivityFailed(f"argument window_s must be at least 1, got {window_s!r}")
    allowed = non_negative("max_canary_requests", max_canary_requests)
    url = _url(configuration, prometheus_url)
    given = {"weight": weight_promql, "canary": canary_promql, "total": total_promql}
    if any(q in LOCAL_QUERIES for q in given.values()) and not _namespace(configuration):
        given = {k: LOCAL_QUERIES.get(q, q) for k, q in given.items()}
    queries = {k: _expand(q, configuration, window) for k, q in given.items()}
    raw = {k: promql_value(url, q) for k, q in queries.items()}
    return drained(raw, window, allowed, queries, url)
