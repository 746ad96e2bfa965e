"""Heatmap cells: the numbers behind every cell, for records where the answer is known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gameday.report.frames import LOAD_COLUMNS, ORACLE_COLUMNS, read_parquet
from gameday.report.heatmaps import bucket_order, choose_bin_s, heatmap_cells, render_heatmaps
from gameday.report.loader import ExperimentData
from gameday.report.synthetic_files import write_oracle, write_records

REF = 1_700_000_000.0
NAN = math.nan

# variant, prompt tokens, seconds since REF, ttft_s, ok
RECORDS = [
    ("baseline", 100, 0.5, 0.1, True),
    ("baseline", 200, 1.0, 0.2, True),
    ("baseline", 300, 4.9, 0.3, True),
    ("baseline", 150, 2.0, NAN, False),
    ("canary", 3000, 5.0, 0.5, True),  # exactly on a bin edge: opens bin 5
    ("canary", 2500, 9.99, 0.7, True),
    ("baseline", 2100, 6.0, 0.2, True),
    ("baseline", 2200, 7.0, 0.4, True),
    ("", 50, 1.5, NAN, False),  # failed before the router said who served it
    ("baseline", 600, -5.0, 0.15, True),
    ("canary", 700, -0.01, 0.25, True),
]
# seconds since REF, prompt tokens, kl_mean, error
ORACLE = [
    (1.0, 3000, 0.01, None),
    (2.0, 3100, 0.03, None),
    (3.0, 3200, 0.5, "timeout"),  # a failed pair has no KL worth counting
    (12.0, 5000, 0.2, None),
]

EXPECTED = {
    # (panel, variant, bucket, t_bin_s): (samples, value)
    ("ttft_p99_s", "baseline", "0-512", 0.0): (3, 0.298),  # linear: 0.2 + 0.98 * 0.1
    ("ttft_p99_s", "baseline", "2k-4k", 5.0): (2, 0.398),
    ("ttft_p99_s", "baseline", "512-1k", -5.0): (1, 0.15),
    ("ttft_p99_s", "canary", "2k-4k", 5.0): (2, 0.698),
    ("ttft_p99_s", "canary", "512-1k", -5.0): (1, 0.25),
    ("error_rate", "baseline", "0-512", 0.0): (4, 0.25),
    ("error_rate", "baseline", "2k-4k", 5.0): (2, 0.0),
    ("error_rate", "baseline", "512-1k", -5.0): (1, 0.0),
    ("error_rate", "canary", "2k-4k", 5.0): (2, 0.0),
    ("error_rate", "canary", "512-1k", -5.0): (1, 0.0),
    ("error_rate", "unknown", "0-512", 0.0): (1, 1.0),
    ("canary_share", "all", "0-512", 0.0): (4, 0.0),
    ("canary_share", "all", "2k-4k", 5.0): (4, 0.5),
    ("canary_share", "all", "512-1k", -5.0): (2, 0.5),
    ("drift_kl", "oracle", "2k-4k", 0.0): (2, 0.02),
    ("drift_kl", "oracle", "4k+", 10.0): (1, 0.2),
}


def _write(folder: Path) -> ExperimentData:
    write_records(
        folder / "records.parquet",
        {
            "served_by": [r[0] for r in RECORDS],
            "prompt_tokens": [r[1] for r in RECORDS],
            "start_time": [REF + r[2] for r in RECORDS],
            "ttft_s": [r[3] for r in RECORDS],
            "ok": [r[4] for r in RECORDS],
        },
    )
    write_oracle(
        folder / "oracle.parquet",
        {
            "time": [REF + o[0] for o in ORACLE],
            "prompt_tokens": [o[1] for o in ORACLE],
            "kl_mean": [o[2] for o in ORACLE],
            "error": [o[3] for o in ORACLE],
        },
    )
    exp = ExperimentData(name="hand", path=folder)
    exp.records = read_parquet(
        folder / "records.parquet", LOAD_COLUMNS, ("start_time",), "hand", exp.missing, True, ""
    )
    exp.oracle = read_parquet(
        folder / "oracle.parquet", ORACLE_COLUMNS, ("time",), "hand", exp.missing, False, ""
    )
    assert exp.missing == []
    return exp


def test_every_cell_of_every_panel(tmp_path: Path) -> None:
    exp = _write(tmp_path)
    data = heatmap_cells(exp.records, exp.oracle, REF, bin_s=5.0)
    got = {
        (r.panel, r.variant, r.bucket, r.t_bin_s): (r.samples, r.value)
        for r in data.cells.itertuples()
    }
    assert set(got) == set(EXPECTED)
    for key, (samples, value) in EXPECTED.items():
        assert got[key][0] == samples, key
        assert got[key][1] == pytest.approx(value, abs=1e-9), key
    assert data.buckets == ["0-512", "512-1k", "2k-4k", "4k+"]
    assert list(data.bin_edges()) == [-5.0, 0.0, 5.0, 10.0, 15.0]


def test_a_panel_as_a_grid_has_nan_where_there_is_no_data(tmp_path: Path) -> None:
    exp = _write(tmp_path)
    data = heatmap_cells(exp.records, exp.oracle, REF, bin_s=5.0)
    grid = data.grid("ttft_p99_s", "canary")
    assert list(grid.index) == data.buckets
    assert list(grid.columns) == [-5.0, 0.0, 5.0, 10.0]
    assert grid.loc["2k-4k", 5.0] == pytest.approx(0.698)
    assert grid.loc["512-1k", -5.0] == pytest.approx(0.25)
    assert int(grid.notna().to_numpy().sum()) == 2


def test_cells_follow_the_bin_width(tmp_path: Path) -> None:
    exp = _write(tmp_path)
    data = heatmap_cells(exp.records, exp.oracle, REF, bin_s=10.0)
    share = data.cells[data.cells["panel"] == "canary_share"].set_index(["bucket", "t_bin_s"])
    # 0-512 over [0, 10): the four baseline requests; 2k-4k over [0, 10): 2 of 4 canary.
    assert share.loc[("0-512", 0.0), "value"] == 0.0
    assert share.loc[("2k-4k", 0.0), "value"] == pytest.approx(0.5)
    assert share.loc[("512-1k", -10.0), "samples"] == 2


def test_report_writes_the_cells_next_to_the_png(tmp_path: Path) -> None:
    from matplotlib.image import imread

    from gameday.report import build_report
    from tests.report_data import FAULT, hand_made_experiment

    hand_made_experiment(tmp_path / "run")
    summary = build_report(tmp_path / "run", bin_s=2.0)
    csv = pd.read_csv(tmp_path / "run" / "heatmap-router-faulty-kernel.csv")
    assert list(csv.columns) == ["panel", "variant", "bucket", "t_bin_s", "samples", "value"]
    # The hand-made records: canary requests at -5 (bin -6), +1 (bin 0), +3 (bin 2).
    canary = csv[(csv.panel == "ttft_p99_s") & (csv.variant == "canary")]
    assert sorted(canary.t_bin_s) == [-6.0, 0.0, 2.0]
    assert canary.set_index("t_bin_s").loc[2.0, "value"] == pytest.approx(0.45)
    drift = csv[csv.panel == "drift_kl"].set_index("t_bin_s")["value"]
    # Oracle pairs at +0.5 (0.01) and +1.2 (0.09) share bin 0; +2.0 (0.5) is bin 2;
    # +1.5 failed and is left out; -3 (0.2) is bin -4.
    assert drift.to_dict() == pytest.approx({-4.0: 0.2, 0.0: 0.05, 2.0: 0.5})
    exp = summary.experiments[0]
    assert exp.heatmap is not None and exp.heatmap.reference_time == FAULT
    image = imread(tmp_path / "run" / "heatmap-router-faulty-kernel.png")
    assert image.shape[1] == 13 * 72 and image.shape[0] > 300


def test_bucket_order_is_by_prompt_length_with_unknown_last() -> None:
    records = pd.DataFrame(
        {
            "bucket": pd.Categorical(["4k+", None, "0-512", "custom-9k", "1k-2k"]),
            "prompt_tokens": [5000.0, 10.0, 20.0, 9000.0, 1500.0],
        }
    )
    oracle = pd.DataFrame({"bucket": pd.Categorical(["512-1k"]), "prompt_tokens": [700.0]})
    assert bucket_order(records, oracle) == [
        "0-512",
        "512-1k",
        "1k-2k",
        "4k+",
        "custom-9k",
        "unknown",
    ]


@pytest.mark.parametrize(
    ("span", "expected"),
    [(0, 1.0), (60, 1.0), (90, 2.0), (250, 5.0), (3000, 60.0), (10**6, 16667.0)],
)
def test_bin_width_is_a_few_seconds_for_an_experiment(span: float, expected: float) -> None:
    assert choose_bin_s(span) == expected


def test_empty_inputs_give_empty_cells_and_still_draw(tmp_path: Path) -> None:
    empty = ExperimentData(name="e", path=tmp_path)
    data = heatmap_cells(empty.records, empty.oracle, None)
    assert data.cells.empty and data.reference == "none"
    render_heatmaps(data, tmp_path / "x.png", "empty")
    assert (tmp_path / "x.png").stat().st_size > 0


def test_many_records_bin_like_a_loop_would(tmp_path: Path) -> None:
    """The vectorised binning agrees with a slow, obvious computation on random data."""
    rng = np.random.default_rng(3)
    n = 5000
    t = REF + rng.uniform(-30, 60, n)
    tokens = rng.integers(1, 6000, n)
    served = rng.choice(np.array(["baseline", "canary", ""], dtype=object), n, p=[0.8, 0.15, 0.05])
    ok = rng.random(n) > 0.1
    ttft = np.where(ok, rng.uniform(0.01, 2, n), np.nan)
    write_records(
        tmp_path / "records.parquet",
        {"start_time": t, "served_by": served, "prompt_tokens": tokens, "ok": ok, "ttft_s": ttft},
    )
    missing: list = []
    rec = read_parquet(
        tmp_path / "records.parquet", LOAD_COLUMNS, ("start_time",), "x", missing, True, ""
    )
    data = heatmap_cells(rec, ExperimentData(name="x", path=tmp_path).oracle, REF, bin_s=5.0)
    cells = data.cells.set_index(["panel", "variant", "bucket", "t_bin_s"])
    labels = np.array(["0-512", "512-1k", "1k-2k", "2k-4k", "4k+"])[
        np.searchsorted([512, 1024, 2048, 4096], tokens, side="right")
    ]
    for i in rng.choice(n, 40, replace=False):  # spot-check cells through random records
        b = math.floor((t[i] - REF) / 5.0) * 5.0
        same = (labels == labels[i]) & (np.floor((t - REF) / 5.0) * 5.0 == b)
        variant = served[i] or "unknown"
        mine = same & (np.where(served == "", "unknown", served) == variant)
        assert cells.loc[("error_rate", variant, labels[i], b), "value"] == pytest.approx(
            (~ok[mine]).mean()
        )
        if variant != "unknown" and ok[mine].any():
            assert cells.loc[("ttft_p99_s", variant, labels[i], b), "value"] == pytest.approx(
                np.quantile(ttft[mine & ok], 0.99)
            )
        known = same & (served != "")
        if known.any():
            assert cells.loc[("canary_share", "all", labels[i], b), "value"] == pytest.approx(
                (served[known] == "canary").mean()
            )
