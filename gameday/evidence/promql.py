"""What PromQL answers show: a bound on one expression's value, and a canary drained
(weight 0 at every router AND no canary traffic while there was traffic); and the
expression a probe's template asks.

Pure: the answers in, the SLO result out. An answer that is not a finite number, or an
empty answer where traffic is not shown to be scraped, must never pass.
"""

from __future__ import annotations

import math

from canary_contract.json import JsonObject
from gameday.evidence.slo import Slo, result

DRAINED = "canary_drained"


def instant_value(data: JsonObject) -> float | None:
    """An instant query's answer (the ``data`` of ``/api/v1/query``) as one number: the sum
    of a vector's samples, or a scalar; None for an empty vector (no series matched).
    ValueError for any other answer (a matrix, a string, malformed samples)."""
    kind, values = data.get("resultType"), data.get("result") or []
    try:
        if kind == "scalar":
            return float(values[1])
        if kind == "vector":
            if not values:
                return None
            return float(sum(float(sample["value"][1]) for sample in values))
    except (TypeError, ValueError, KeyError, IndexError):
        pass
    raise ValueError(
        f"a {kind!r} result; the probe needs an instant vector or a scalar "
        "(wrap the expression in sum(...))"
    )


def expand(expr: object, window_s: float | None, namespace: str | None, target: str) -> str:
    """``expr`` with ``{namespace}`` the namespace of the Kubernetes target ``target`` and
    ``{window}`` the check's window in whole seconds (e.g. ``30s``); ValueError naming
    what is missing (no expression, no namespace, no window)."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError(f"argument promql must be a PromQL expression, got {expr!r}")
    if "{namespace}" in expr:
        if not namespace:
            raise ValueError(
                f"the expression {expr!r} uses {{namespace}}, but the target "
                f"{target!r} is not a Kubernetes target: write the label out instead."
            )
        expr = expr.replace("{namespace}", namespace)
    if "{window}" in expr:
        if window_s is None:
            raise ValueError(f"the expression {expr!r} uses {{window}}: pass window_s.")
        expr = expr.replace("{window}", f"{max(1, round(window_s))}s")
    return expr


def range_window(since: float, now: float) -> str:
    """A PromQL range covering ``since``..``now``, in whole seconds (at least 1 s)."""
    return f"{max(1, math.ceil(now - since))}s"


def not_finite(value: float) -> str:
    """Why a non-finite answer is no figure."""
    if math.isnan(value):
        return (
            "the query answered NaN, not a number: a ratio or a quantile over no samples "
            "(no traffic in the window?)"
        )
    return (
        f"the query answered {'+' if value > 0 else '-'}Inf: a division by zero, or a "
        "quantile above the histogram's largest finite bucket"
    )


def bounded(
    check: str,
    value: float | None,
    allowed: float,
    unit: str,
    at_most: bool,
    detail: dict[str, object],
) -> Slo:
    """``value`` at most (``at_most``) or at least ``allowed``; no series at all fails."""
    sign = "<=" if at_most else ">="
    if value is None:
        detail["why"] = (
            f"the query matched no series (expected a value {sign} "
            f"{allowed:g}): is the metric scraped, and are its labels right?"
        )
        return result(check, None, allowed, unit, False, **detail)
    if not math.isfinite(value):
        detail["why"] = not_finite(value)
        return result(check, None, allowed, unit, False, **detail)
    ok = value <= allowed if at_most else value >= allowed
    if not ok:
        detail["why"] = f"expected {sign} {allowed:g}, got {value:g}"
    return result(check, value, allowed, unit, ok, **detail)


def drained(
    raw: dict[str, float | None],
    window: float,
    allowed: float,
    queries: dict[str, str],
    url: str,
) -> Slo:
    """The routers' answers to ``queries`` (``weight``, ``canary``, ``total`` over the
    last ``window`` seconds) show weight 0 and at most ``allowed`` canary-served requests
    among some."""
    odd = {k: v for k, v in raw.items() if v is not None and not math.isfinite(v)}
    values = {k: (None if k in odd else v) for k, v in raw.items()}
    detail: dict[str, object] = {"queries": queries, "values": values, "prometheus_url": url}
    if odd:
        detail["why"] = "; ".join(f"{k} query: {not_finite(v)}" for k, v in odd.items())
        return result(DRAINED, None, allowed, "count", False, **detail)
    weight, canary, total = values["weight"], values["canary"], values["total"]
    if weight is None or total is None:
        missing = [k for k in ("weight", "total") if values[k] is None]
        detail["why"] = (
            f"no series for the {' and '.join(missing)} query: cannot tell whether the canary "
            "was drained (are the routers scraped, with a namespace label?)"
        )
        return result(DRAINED, None, allowed, "count", False, **detail)
    if total <= 0:
        detail["why"] = (
            f"the routers served no request in the last {window:g} s: no traffic shows "
            "whether the canary was drained (is the load running?)"
        )
        return result(DRAINED, None, allowed, "count", False, **detail)
    served = 0.0 if canary is None else float(canary)
    problems = []
    if weight != 0:
        problems.append(f"a router still reports canary weight {weight:g} (expected 0)")
    if served > allowed:
        problems.append(
            f"{served:g} canary-served requests in the last {window:g} s "
            f"(expected at most {allowed:g})"
        )
    if problems:
        detail["why"] = "; ".join(problems)
    return result(DRAINED, served, allowed, "count", not problems, **detail)
