"""Whether traffic evidence shows the canary stopped serving (the cluster probes' rule).

Traffic evidence is ``{"canary", "total", ...}``: canary-served requests after a
controller's status change, and all requests then (None when the source cannot tell).
No traffic at all is *not* evidence that the canary stopped serving: fail-closed.
"""

from __future__ import annotations

from canary_contract.json import JsonObject


def judge_traffic(evidence: JsonObject, allowed: float) -> tuple[float | None, bool, str | None]:
    """(measured canary requests, ok, why-not) for traffic evidence; fail-closed."""
    canary, total = evidence.get("canary"), evidence.get("total")
    if total is not None and total <= 0:
        why = (
            "no request at all after the status change: nothing shows whether the canary "
            "stopped serving (is the load running and reaching the router?)"
        )
        return None, False, why
    if canary is None:
        if total is None:
            why = (
                "the canary query matched no series and no total_promql says traffic flowed: "
                "cannot tell an idle canary from a metric that is not scraped"
            )
            return None, False, why
        canary = 0.0
    measured = float(canary)
    if measured > allowed:
        why = (
            f"expected at most {allowed:g} canary-served requests after the status change, "
            f"got {measured:g}"
        )
        return measured, False, why
    return measured, True, None
