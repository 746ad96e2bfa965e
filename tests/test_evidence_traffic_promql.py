"""The traffic evidence the cluster probes pair a controller's status with, as pure
functions (``gameday.evidence.traffic.records_traffic``, ``gameday.evidence.promql``), and
the probe over them (``probes._cluster.canary_traffic_after``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from chaoslib.exceptions import ActivityFailed

from gameday.evidence.promql import expand, instant_value, range_window
from gameday.evidence.traffic import records_traffic
from probes._cluster import canary_traffic_after
from tests.run_support import record, write_load_state, write_records


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "start_time": [9.0, 10.0, 11.0, 12.0],
            "served_by": ["canary", "canary", "baseline", "canary"],
            "ok": [True, False, True, True],
        }
    )


def test_records_traffic_counts_what_started_at_or_after_since() -> None:
    assert records_traffic(_frame(), 10.0) == {
        "canary_rule": "served_by == 'canary'",
        "canary": 2,
        "total": 3,
        "failed": 1,
    }


def test_records_traffic_by_model_version_reads_the_versions() -> None:
    versions = pd.DataFrame(
        {"start_time": [9.0, 10.0, 11.0, 12.0], "model_version": ["v2", "v2", "v1", "v1"]}
    )
    got = records_traffic(_frame(), 10.0, "v2", versions)
    assert (got["canary_rule"], got["canary"], got["total"]) == ("model_version == 'v2'", 1, 3)
    with pytest.raises(ValueError, match="model_version"):
        records_traffic(_frame(), 10.0, "v2", None)


def test_instant_value_sums_a_vector_reads_a_scalar_and_refuses_the_rest() -> None:
    vector = {"resultType": "vector", "result": [{"value": [1, "2"]}, {"value": [1, "3.5"]}]}
    assert instant_value(vector) == 5.5
    assert instant_value({"resultType": "scalar", "result": [1, "7"]}) == 7.0
    assert instant_value({"resultType": "vector", "result": []}) is None
    for bad in (
        {"resultType": "matrix", "result": [{"values": []}]},
        {"resultType": "vector", "result": [{"metric": {}}]},
    ):
        with pytest.raises(ValueError, match="instant vector or a scalar"):
            instant_value(bad)


def test_range_window_is_whole_seconds_and_at_least_one() -> None:
    assert range_window(100.0, 136.2) == "37s"
    assert range_window(100.0, 100.0) == "1s"


def test_counting_by_version_over_records_without_model_version_is_a_clear_failure(
    tmp_path: Path,
) -> None:
    # Records from a load without the model_version column: the probe must say it cannot
    # read them (before, pyarrow's error escaped the activity).
    rows = [record(start_time=10.0, served_by="canary")]
    path = write_records(tmp_path, rows)
    table = pq.read_table(path)
    pq.write_table(table.drop(["model_version"]), path)
    write_load_state(tmp_path)
    cfg = {"gameday_run_dir": str(tmp_path)}
    with pytest.raises(ActivityFailed, match="cannot read the load records"):
        canary_traffic_after(5.0, cfg, canary_version="v2")
    # and with the column, the same records count
    pq.write_table(table, path)
    got = canary_traffic_after(5.0, cfg, canary_version="v2")
    assert (got["source"], got["total"]) == ("records", 1)


def test_a_template_expression_gets_the_namespace_and_window_or_says_what_it_lacks() -> None:
    expr = 'sum(increase(router_requests_total{namespace="{namespace}"}[{window}]))'
    assert expand(expr, 29.6, "stack", "k8s") == (
        'sum(increase(router_requests_total{namespace="stack"}[30s]))'
    )
    assert expand("max(x[{window}])", 0.2, None, "local") == "max(x[1s])"  # at least 1 s
    assert expand("up", None, None, "local") == "up"  # nothing to fill in
    with pytest.raises(ValueError, match="target 'local' is not a Kubernetes target"):
        expand(expr, 30, None, "local")
    with pytest.raises(ValueError, match=r"uses \{window\}: pass window_s"):
        expand("max(x[{window}])", None, None, "local")
    for bad in ("", "  ", None, 3):
        with pytest.raises(ValueError, match="argument promql must be a PromQL expression"):
            expand(bad, 30, "stack", "k8s")
