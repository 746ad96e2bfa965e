"""Where the traffic evidence a controller's status is paired with comes from: PromQL
expressions over the window since the status change, or the run's load records once the
load has stopped. Pure: the caller asks Prometheus (``value``) and reads the files.

No evidence must never count as a canary that stopped serving: a load that has not
stopped gives no records to pair with (``stopped_records``).
"""

from __future__ import annotations

from collections.abc import Callable

from canary_contract.json import JsonObject
from gameday.evidence.promql import range_window


def promql_traffic(
    url: str,
    canary_promql: str,
    total_promql: str | None,
    since: float,
    now: float,
    value: Callable[[str, float], float | None],
) -> JsonObject:
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


def stopped_records(state: JsonObject | None) -> str:
    """The load records to pair a status with, from the run's load state (``load.json``;
    None: the load never ran); ValueError saying why there are none while the load has
    not stopped."""
    if state is None or state.get("state") != "stopped":
        where = "has not run" if state is None else f"is {state.get('state')!r}, not stopped"
        raise ValueError(
            f"no load records to pair with the controller's status: the load {where}. Add the "
            "probes.load control, run this probe after the method, or pass canary_promql."
        )
    return str(state.get("records"))
