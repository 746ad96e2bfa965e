"""``gameday.evidence.checks.record_frame``: the load records as every check reads them
(the probes read the file, this shapes it)."""

from __future__ import annotations

import math

import pandas as pd

from gameday.evidence.checks import RECORD_COLUMNS, record_frame


def test_absent_columns_are_null_and_unknowns_read_the_safe_way() -> None:
    frame = record_frame(
        pd.DataFrame(
            {
                "start_time": [1.0, "x"],
                "ok": [True, None],
                "served_by": ["canary", None],
                "prompt_tokens": [None, 12],
                "planned_prompt_tokens": [300, 20],
            }
        )
    )
    assert set(RECORD_COLUMNS) <= set(frame.columns)
    assert frame["error_kind"].isna().all() and frame["ttft_s"].isna().all()
    assert frame["ok"].tolist() == [True, False]  # unknown is not ok
    assert frame["served_by"].tolist() == ["canary", ""]
    assert frame["tokens"].tolist() == [300.0, 12.0]  # the planned count when none was seen
    assert frame["start_time"].iloc[0] == 1.0 and math.isnan(frame["start_time"].iloc[1])
