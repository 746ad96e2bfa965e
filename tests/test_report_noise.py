"""The noise floor the gate measured, in every game day's report (#14, "Done when" item 1).

Each experiment's folder holds the gate's answer saved at its end (``gate-evidence.json``,
``gameday.run.sufficiency``). Here the answers come from a real ``ReleaseGate`` fed
baseline-baseline comparisons (batch noise on: KL around 1e-3; off: bit-identical
replicas, KL 0), and the report must show the gate's own figures per bucket, the game
day's line "noise floor > 0 in N/N experiments", and say "noise floor not measured"
(never a 0) where the floor is 0 or missing.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from canarystack.gate.state import GateConfig, ReleaseGate
from gameday.report import build_report
from gameday.report.noise import NOT_MEASURED
from gameday.run.sufficiency import summarise_gate
from tests.report_data import hand_made_experiment
from tests.test_gate_stats import batch, comparison, release

NOISY = {"0-512": 5, "512-1k": 30, "1k-2k": 40, "2k-4k": 60, "4k+": 25}


def gate_answer(per_bucket: dict[str, int], kl: float | None = 1e-3, seed: int = 1) -> Any:
    """A real gate's ``/v1/gate/<release>`` answer after ``per_bucket`` baseline-baseline
    comparisons per bucket (KL drawn around ``kl``; ``None``: bit-identical, KL 0), and a
    few baseline-canary ones."""
    rng = np.random.default_rng(seed)
    gate = ReleaseGate("default", GateConfig())
    gate.on_release(release(), 0.0)
    t, noise = 0.0, []
    for bucket, n in per_bucket.items():
        for _ in range(n):
            t += 0.01
            value = 0.0 if kl is None else float(rng.gamma(2.0, kl / 2.0))
            noise.append(comparison(t, bucket, value, pair="baseline-baseline"))
    gate.ingest(batch(noise), 1.0, 1.0)
    gate.ingest(batch([comparison(t + 0.01 * i, "2k-4k", 0.002) for i in range(10)]), 2.0, 2.0)
    return gate.to_json(2.0)


def save_answer(folder: Path, answer: Any) -> dict[str, Any]:
    """gate-evidence.json as ``gameday.run.sufficiency.write_gate_evidence`` writes it (the
    gate's noise floor kept by ``summarise_gate``)."""
    doc = {"ok": True, "url": "http://127.0.0.1:1/v1/gate/default", **summarise_gate(answer)}
    assert doc["noise_floor"] == answer["noise_floor"]
    doc.update(
        {
            "read_at": 1.0,
            "source": "gameday run",
            "thresholds": {"min_comparisons": 30, "min_canary_outcomes": 10},
        }
    )
    (folder / "gate-evidence.json").write_text(json.dumps(doc, indent=2))
    return doc


class _Rows(HTMLParser):
    """The noise table's cells per (experiment, scope), from report.html."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], list[str]] = {}
        self._key: tuple[str, str] | None = None
        self._in_td = False
        self.line = ""
        self._in_line = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("class") == "noise-row":
            self._key = (str(a.get("data-experiment")), str(a.get("data-scope")))
            self.rows[self._key] = []
        elif tag == "td" and self._key is not None:
            self._in_td = True
            self.rows[self._key].append("")
        elif tag == "p" and a.get("id") == "noise-line":
            self._in_line = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._key = None
        elif tag == "td":
            self._in_td = False
        elif tag == "p":
            self._in_line = False

    def handle_data(self, data: str) -> None:
        if self._in_td and self._key is not None:
            self.rows[self._key][-1] += data
        if self._in_line:
            self.line += data


def html_rows(run: Path) -> _Rows:
    parser = _Rows()
    parser.feed((run / "report.html").read_text(encoding="utf-8"))
    return parser


def noise_doc(run: Path) -> dict[str, Any]:
    """summary.json's game day line, with each experiment's ``figures.noise_floor``."""
    doc = json.loads((run / "summary.json").read_text())
    per = {e["name"]: e["figures"]["noise_floor"] for e in doc["experiments"]}
    return dict(doc["noise_floor"]) | {"experiments": per}


# ---------------------------------------------------------------------------------------
def test_the_report_shows_the_gates_own_noise_floor_per_bucket(tmp_path: Path) -> None:
    run = tmp_path / "run"
    answer = gate_answer(NOISY)
    floors = answer["noise_floor"]
    assert floors["all"]["kl"] > 0 and floors["0-512"]["borrowed_from"] == "all"  # the premise
    for name, component in (("router-faulty-kernel", "router"), ("broker-faulty-kernel", "broker")):
        save_answer(hand_made_experiment(run, name, component=component), answer)
    build_report(run)

    doc = noise_doc(run)
    assert doc["line"] == "noise floor > 0 in 2/2 experiments"
    assert (doc["measured"], doc["experiments_count"], doc["not_measured"]) == (2, 2, [])
    exp = doc["experiments"]["router-faulty-kernel"]
    assert exp["measured"] is True and exp["reason"] is None
    # summary.json: exactly the gate's figures, per bucket and for all buckets pooled.
    assert exp["all"]["kl_mean"] == floors["all"]["kl_mean"]
    assert exp["all"]["kl_floor"] == floors["all"]["kl"]
    assert exp["all"]["samples"] == floors["all"]["samples"] == sum(NOISY.values())
    for bucket, n in NOISY.items():
        got = exp["buckets"][bucket]
        assert got["noise_comparisons"] == answer["buckets"][bucket]["noise_comparisons"] == n
        assert got["samples"] == floors[bucket]["samples"]
        assert got["kl_mean"] == floors[bucket]["kl_mean"]
        assert got["kl_floor"] == floors[bucket]["kl"]
    # The sparse bucket says whose floor it uses; the others have their own.
    assert exp["buckets"]["0-512"]["measured"] is False
    assert exp["buckets"]["0-512"]["borrowed_from"] == "all"
    assert "uses all's floor" in exp["buckets"]["0-512"]["text"]
    assert exp["buckets"]["2k-4k"]["measured"] is True

    # report.html: the line, and per row the same figures as the gate's.
    page = html_rows(run)
    assert page.line == "noise floor > 0 in 2/2 experiments"
    row = page.rows[("router-faulty-kernel", "all")]
    assert row[2] == str(sum(NOISY.values()))  # the buckets' counters, pooled
    assert row[3:6] == [
        str(floors["all"]["samples"]),
        str(floors["all"]["kl_mean"]),
        str(floors["all"]["kl"]),
    ]
    for bucket, n in NOISY.items():
        cells = page.rows[("router-faulty-kernel", bucket)]
        assert cells[1] == bucket and cells[2] == str(n)
        assert cells[4] == str(floors[bucket]["kl_mean"])
    assert page.rows[("router-faulty-kernel", "0-512")][5] == str(floors["all"]["kl"])

    # junit.xml: the experiment's test case says it.
    out = ET.parse(run / "junit.xml").getroot().iter("testcase")
    case = next(c for c in out if c.get("name") == "experiment router-faulty-kernel")
    assert exp["text"] in (case.findtext("system-out") or "")

    # matrix.csv: a column with each cell's floor.
    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    text = f"noise KL {floors['all']['kl_mean']} (n={sum(NOISY.values())})"
    assert matrix.loc[("router", "faulty-kernel"), "noise_floor"] == text
    assert pd.isna(matrix.loc[("rollback", "latency"), "noise_floor"])  # not run


def test_a_missing_floor_is_said_never_shown_as_zero(tmp_path: Path) -> None:
    run = tmp_path / "run"
    measured = hand_made_experiment(run, "router-faulty-kernel")
    save_answer(measured, gate_answer(NOISY))
    hand_made_experiment(run, "broker-faulty-kernel", component="broker")  # nothing saved
    build_report(run)

    doc = noise_doc(run)
    assert doc["line"] == "noise floor > 0 in 1/2 experiments"
    assert doc["not_measured"] == ["broker-faulty-kernel"]
    missing = doc["experiments"]["broker-faulty-kernel"]
    assert missing["measured"] is False and missing["all"] is None
    assert missing["text"] == (
        f"{NOT_MEASURED}: no gate-evidence.json: the gate's answer was not saved"
    )
    page = html_rows(run)
    assert page.line == "noise floor > 0 in 1/2 experiments"
    cells = page.rows[("broker-faulty-kernel", "all")]
    assert cells[-1] == missing["text"]
    assert not any(c.strip() in ("0", "0.0") for c in cells)
    matrix = pd.read_csv(run / "matrix.csv").set_index(["component", "fault"])
    assert matrix.loc[("broker", "faulty-kernel"), "noise_floor"] == NOT_MEASURED


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            "noise off",
            "the floor is 0 over 160 baseline-baseline comparisons (bit-identical replicas: "
            "is batch noise off?)",
        ),
        (
            "too few",
            "12 baseline-baseline comparison(s), too few for a floor (the gate tests against none)",
        ),
        ("no comparisons", "no baseline-baseline comparison"),
        ("saved without the floor", "gate-evidence.json holds no noise_floor"),
        ("gate unreadable", "the gate could not be read (cannot read the gate at"),
        ("not a number", "noise_floor.all.kl_mean is not a number"),
    ],
)
def test_a_floor_of_zero_or_none_is_flagged(tmp_path: Path, case: str, reason: str) -> None:
    run = tmp_path / "run"
    folder = hand_made_experiment(run, "router-faulty-kernel")
    if case == "noise off":
        doc = save_answer(folder, gate_answer(NOISY, kl=None))
        assert (
            doc["noise_floor"]["all"]["kl"] == 0.0 and doc["noise_floor"]["all"]["source"] == "all"
        )
    elif case == "too few":
        doc = save_answer(folder, gate_answer({"2k-4k": 12}))
        assert doc["noise_floor"]["all"]["source"] == "none"
    elif case == "no comparisons":
        save_answer(folder, gate_answer({}))
    elif case == "saved without the floor":
        # An older gameday run saved the counters, not the floor.
        doc = {"ok": True, **summarise_gate(gate_answer(NOISY))}
        del doc["noise_floor"]
        (folder / "gate-evidence.json").write_text(json.dumps(doc))
    elif case == "gate unreadable":
        error = "cannot read the gate at http://127.0.0.1:1/v1/gate/default: refused"
        (folder / "gate-evidence.json").write_text(json.dumps({"ok": False, "error": error}))
    else:
        doc = save_answer(folder, gate_answer(NOISY))
        doc["noise_floor"]["all"]["kl_mean"] = "0.001"
        (folder / "gate-evidence.json").write_text(json.dumps(doc))
    build_report(run)

    doc = noise_doc(run)
    assert doc["line"] == "noise floor > 0 in 0/1 experiments"
    exp = doc["experiments"]["router-faulty-kernel"]
    assert exp["measured"] is False
    assert exp["text"].startswith(f"{NOT_MEASURED}: ")
    assert reason in exp["reason"]
    page = html_rows(run)
    assert page.rows[("router-faulty-kernel", "all")][-1] == exp["text"]
    # No 0 stands in a figure's column as if it had been measured.
    for cells in page.rows.values():
        if len(cells) == 8:
            assert cells[4].strip() not in ("0", "0.0") and cells[5].strip() not in ("0", "0.0")
