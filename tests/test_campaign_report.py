"""The report of a campaign (``gameday run --repeat N``), built from synthetic campaign
folders (``gameday.report.synthetic.write_campaign``): passes/N, time to trip p50/p95 with
95 % intervals, the worst run and the ECDF per cell in summary.json, matrix.csv,
junit.xml and report.html; --certify's verdict; and a plain run's report unchanged."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import xmlschema

from gameday.report import build_report
from gameday.report.campaign import HTML_MARKER
from gameday.report.matrix import MATRIX_COLUMNS
from gameday.report.synthetic import Scenario, write_campaign, write_run

SCENARIOS = [
    Scenario("control", "control", "none", "no_trip", False, title="healthy"),
    Scenario("router-faulty-kernel", "router", "faulty-kernel", "trip", True, 1.8, "kernel"),
]
TIMES = [1.5, 2.0, 2.5, 3.0, 3.5]  # p50 2.5, p95 (linear) 3.0 + 0.8 * 0.5 = 3.4


def _build(root: Path, times: list[float | None], certify: bool = False) -> dict[str, Any]:
    write_campaign(
        root,
        {"router-faulty-kernel": times, "control": [None] * len(times)},
        SCENARIOS,
        certify=certify,
        requests_per_experiment=200,
    )
    build_report(root)
    return json.loads((root / "summary.json").read_text())


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("campaign") / "run"
    return root, _build(root, list(TIMES))


def _cell(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in doc["campaign"]["cells"] if c["experiment"] == name)


def test_summary_gives_passes_percentiles_intervals_worst_run_and_ecdf(
    campaign: tuple[Path, dict[str, Any]],
) -> None:
    _, doc = campaign
    assert doc["verdict"] == "pass"
    cell = _cell(doc, "router-faulty-kernel")
    assert cell["passes_text"] == "5/5" and cell["runs"] == 5
    st = cell["time_to_trip"]
    assert st["n"] == 5
    assert st["p50"]["value_s"] == pytest.approx(2.5, abs=0.01)
    assert st["p95"]["value_s"] == pytest.approx(3.4, abs=0.01)
    # 5 runs: no distribution-free 95 % interval for the median on either side.
    assert st["p50"]["ci95_s"] == [None, None] and st["p50"]["ci95_unbounded"] == [True, True]
    assert cell["worst_run"]["name"] == "router-faulty-kernel@r05"
    assert cell["worst_run"]["time_to_trip_s"] == pytest.approx(3.5, abs=0.01)
    assert cell["worst_run"]["load_seed"] == 4
    assert [round(f, 2) for _, f in cell["ecdf"]] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert cell["load_seeds"] == [0, 1, 2, 3, 4]
    control = _cell(doc, "control")
    assert control["passes_text"] == "5/5" and control["tripped_runs"] == 0
    # 0 false trips in 5 runs bound the false-trip probability only at 45 % (95 %).
    assert control["false_trip_probability_upper_95"] == pytest.approx(1 - 0.05 ** (1 / 5), 1e-3)
    assert doc["campaign"]["percentile_method"].startswith("linear")


def test_matrix_junit_and_html_show_the_cells(campaign: tuple[Path, dict[str, Any]]) -> None:
    root, _ = campaign
    matrix = pd.read_csv(root / "matrix.csv")
    row = matrix[(matrix.component == "router") & (matrix.fault == "faulty-kernel")].iloc[0]
    assert row["passes"] == 5 and row["runs"] == 5
    assert row["text"].startswith("5/5 pass\np50 2.5 s")
    assert row["worst_run"] == "router-faulty-kernel@r05"
    xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit.xsd")).validate(
        str(root / "junit.xml")
    )  # Jenkins' schema, as for a plain run
    suites = {s.get("name"): s for s in ET.parse(root / "junit.xml").getroot()}
    cases = {c.get("name"): c for c in suites["campaign"].iter("testcase")}
    assert set(cases) == {"campaign control", "campaign router-faulty-kernel"}
    assert "5/5 passed" in (cases["campaign router-faulty-kernel"].findtext("system-out") or "")
    html = (root / "report.html").read_text()
    assert '<section id="campaign">' in html and HTML_MARKER not in html
    assert 'data-experiment="router-faulty-kernel"' in html
    assert 'alt="ECDF of time to trip, router-faulty-kernel" src="data:image/png;base64,' in html
    assert (root / "ecdf-router-faulty-kernel.png").stat().st_size > 1000


def test_a_missed_trip_is_the_worst_run_and_fails_the_cell(tmp_path: Path) -> None:
    doc = _build(tmp_path / "run", [1.5, 2.0, None, 3.0])
    cell = _cell(doc, "router-faulty-kernel")
    assert cell["verdict"] == "fail" and cell["passes_text"] == "3/4"
    assert cell["missed_trips"] == 1
    assert cell["worst_run"]["name"] == "router-faulty-kernel@r03"
    assert cell["time_to_trip"]["p95"]["value_s"] is None  # infinite: a missed trip
    assert doc["verdict"] == "fail"


def test_certify_with_too_few_clean_runs_is_inconclusive_and_says_what_they_prove(
    tmp_path: Path,
) -> None:
    doc = _build(tmp_path / "run", list(TIMES), certify=True)
    assert doc["verdict"] == "inconclusive"
    sentence = doc["campaign"]["certification"][0]
    assert sentence.startswith("not certified: 5 runs, 0 over 5 s prove at most p54.9 <= 5 s")
    assert sentence in doc["reasons"]
    assert doc["headline"].startswith("INCONCLUSIVE")
    junit = ET.parse(tmp_path / "run" / "junit.xml").getroot()
    case = next(
        c for c in junit.iter("testcase") if c.get("name") == "campaign router-faulty-kernel"
    )
    assert case.find("error") is not None and case.find("error").get("type") == "Inconclusive"  # type: ignore[union-attr]


def test_a_plain_run_report_has_no_campaign(tmp_path: Path) -> None:
    """--repeat 1 (the default) gives the report as it was: no campaign anywhere."""
    root = write_run(tmp_path / "run", SCENARIOS, requests_per_experiment=200)
    summary = build_report(root)
    doc = json.loads((root / "summary.json").read_text())
    assert "campaign" not in doc
    assert doc == json.loads(json.dumps(summary.to_json(), default=str)) | {
        "report_build_s": doc["report_build_s"],
        "noise_floor": doc["noise_floor"],
    }
    assert list(pd.read_csv(root / "matrix.csv").columns) == list(MATRIX_COLUMNS)
    html = (root / "report.html").read_text()
    assert HTML_MARKER not in html and 'id="campaign"' not in html
    suites = [s.get("name") for s in ET.parse(root / "junit.xml").getroot()]
    assert "campaign" not in suites
    assert not list(root.glob("ecdf-*.png"))


def test_a_prometheus_that_cannot_be_reached_is_said_in_each_experiment(tmp_path: Path) -> None:
    from tests.procs import free_port

    root = write_run(tmp_path / "run", SCENARIOS, requests_per_experiment=200)
    build_report(root, prometheus_url=f"http://127.0.0.1:{free_port()}")
    for scenario in SCENARIOS:
        missing = root / scenario.name / "prometheus.missing.txt"
        assert missing.is_file(), scenario.name
        assert "127.0.0.1" in missing.read_text()
