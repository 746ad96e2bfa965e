"""A controller check's traffic evidence from PromQL (``gameday.evidence.canary_traffic``),
pure; the probe over it is ``probes._cluster.canary_traffic_after``
(tests/test_evidence_traffic_promql.py)."""

from __future__ import annotations

from gameday.evidence import canary_traffic


def test_promql_traffic_fills_the_window_and_asks_each_expression_at_one_time() -> None:
    asked: list[tuple[str, float]] = []

    def value(expr: str, at: float) -> float | None:
        asked.append((expr, at))
        return None if "canary" in expr else 40.0

    out = canary_traffic.promql_traffic(
        "http://prom", "sum(increase(canary[{window}]))", "sum(increase(all[{window}]))",
        100.0, 136.2, value,
    )  # fmt: skip
    assert asked == [("sum(increase(canary[37s]))", 136.2), ("sum(increase(all[37s]))", 136.2)]
    assert (out["source"], out["canary"], out["total"]) == ("prometheus", None, 40.0)
    alone = canary_traffic.promql_traffic("http://prom", "c[{window}]", None, 0.0, 0.5, value)
    assert (alone["total_query"], alone["total"], len(asked)) == (None, None, 3)
