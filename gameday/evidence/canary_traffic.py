"""The traffic evidence a controller's status is paired with, from PromQL expressions
over the window since the status change (the load records' count is
``gameday.evidence.traffic.records_traffic``). Pure: the caller asks Prometheus
(``value``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias, TypedDict

from gameday.evidence.promql import range_window
from gameday.evidence.traffic import RecordsEvidence


class PromqlTraffic(TypedDict):
    """Traffic evidence from PromQL (``promql_traffic``); ``canary`` and ``total`` None
    where no series matched."""

    source: str
    prometheus_url: str
    canary_query: str
    total_query: str | None
    canary: float | None
    total: float | None


# What a controller's status is paired with: PromQL's counts or the load records'.
TrafficEvidence: TypeAlias = PromqlTraffic | RecordsEvidence


def promql_traffic(
    url: str,
    canary_promql: str,
    total_promql: str | None,
    since: float,
    now: float,
    value: Callable[[str, float], float | None],
) -> PromqlTraffic:
    """Traffic evidence from PromQL: ``canary_promql`` (and ``total_promql``, if given)
    with ``{window}`` the seconds since ``since`` (``[{window}]`` -> ``[37s]``), each
    answered by ``value(expr, now)`` (None: no series matched)."""
    w = range_window(since, now)
    canary_expr = canary_promql.replace("{window}", w)
    canary = value(canary_expr, now)
    total = None
    total_expr = None
    if total_promql:
        total_expr = total_promql.replace("{window}", w)
        total = value(total_expr, now)
    return {
        "source": "prometheus",
        "prometheus_url": url,
        "canary_query": canary_expr,
        "total_query": total_expr,
        # an empty vector for the canary's series is 0 only when total traffic is known
        "canary": canary,
        "total": total,
    }
