"""The three-gate matrix (bench/gate_matrix.py) is quoted as the run folders say: a gate
that never trips on a faulty kernel says so in its column, false trips are counted over
the controls that ran, and an experiment a gate did not run is never shown as a pass."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import quote  # noqa: E402


def _gate(label: str, rows: dict[str, dict[str, object]], false_trips: int) -> dict[str, object]:
    return {
        "label": label,
        "target": "t.yaml",
        "verdict": "fail",
        "experiments": rows,
        "false_trips": false_trips,
        "controls_run": 3,
    }


def test_the_matrix_has_a_column_per_gate_and_says_never_tripped() -> None:
    faulty = ["router/faulty-kernel", "router/broken-kernel"]
    res = {
        "faulty": faulty,
        "controls": ["control", "control/benign-noise", "control/small-drift"],
        "gates": {
            "a": _gate(
                "judge",
                {
                    "router/faulty-kernel": {
                        "verdict": "pass",
                        "tripped": True,
                        "time_to_trip_s": 2.5,
                        "drifted_served": 0,
                    },
                    "router/broken-kernel": {"verdict": "not run"},
                },
                0,
            ),
            "b": _gate(
                "alerts",
                {
                    k: {
                        "verdict": "fail",
                        "tripped": False,
                        "time_to_trip_s": None,
                        "drifted_served": 40,
                    }
                    for k in faulty
                },
                1,
            ),
        },
    }
    lines = quote.r_gate_matrix(res)
    table = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("|")}
    assert table[""].endswith("| judge | alerts |")
    assert table["time to trip, `router/faulty-kernel`"].endswith("| 2.50 s | **never tripped** |")
    assert "| not run |" in table["time to trip, `router/broken-kernel`"]
    assert table["drifted answers served, `router/faulty-kernel`"].endswith("| 0 | 40 |")
    assert table["false trips, healthy controls"].endswith("| 0 of 3 | 1 of 3 |")
    passed = table["experiments passed"]
    assert "| 1 of 2 (`router/broken-kernel` not run) |" in passed
    assert passed.endswith("| 0 of 2 (`router/faulty-kernel` fail, `router/broken-kernel` fail) |")
