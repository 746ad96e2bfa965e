"""Whether traffic evidence shows the canary stopped serving (the cluster probes' rule).

Traffic evidence is ``{"canary", "total", ...}``: canary-served requests after a
controller's status change, and all requests then (None when the source cannot tell).
No traffic at all is *not* evidence that the canary stopped serving: fail-closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import pandas as pd


class RecordsTraffic(TypedDict):
    """Traffic evidence from the load records (``records_traffic``)."""

    canary_rule: str
    canary: int
    total: int
    failed: int


class RecordsEvidence(RecordsTraffic):
    """``RecordsTraffic`` with where it came from: ``source`` ``records`` and the records'
    file (``gameday.run.folder.RunFolder.records_traffic``)."""

    source: str
    records: str


def records_traffic(
    frame: pd.DataFrame,
    since: float,
    canary_version: str | None = None,
    versions: pd.DataFrame | None = None,
) -> RecordsTraffic:
    """Traffic evidence from the load records: the requests that started at or after
    ``since`` (``total``, ``failed``) and the canary-served ones among them (``canary``,
    by ``canary_rule``): ``served_by == "canary"``, or, for stacks whose router does not say
    (a service mesh driven by Argo Rollouts or Flagger), the rows of ``versions``
    (``model_version``, ``start_time``) whose ``model_version`` is ``canary_version``."""
    after = frame[frame["start_time"] >= since]
    if canary_version:
        if versions is None:
            raise ValueError("counting by canary_version needs the records' model_version")
        mask = (versions["start_time"] >= since) & (versions["model_version"] == canary_version)
        canary = int(mask.sum())
        rule = f"model_version == {canary_version!r}"
    else:
        canary = int((after["served_by"] == "canary").sum())
        rule = "served_by == 'canary'"
    return {
        "canary_rule": rule,
        "canary": canary,
        "total": len(after),
        "failed": int((~after["ok"]).sum()),
    }


def _count(value: object) -> float | None:
    """A count of the evidence (None: the source cannot tell); TypeError for anything but
    a number, never read as no traffic."""
    if value is None:
        return None
    if not isinstance(value, int | float):
        raise TypeError(f"traffic evidence holds {value!r} where a count belongs")
    return float(value)


def judge_traffic(
    evidence: Mapping[str, object], allowed: float
) -> tuple[float | None, bool, str | None]:
    """(measured canary requests, ok, why-not) for traffic evidence; fail-closed."""
    canary, total = _count(evidence.get("canary")), _count(evidence.get("total"))
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
