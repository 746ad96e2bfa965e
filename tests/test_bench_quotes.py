"""The benchmark figures in the docs are quoted from bench/results/, never typed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _results  # noqa: E402
import quote  # noqa: E402


def test_docs_blocks_match_results_files() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/quote.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def _results_file(tmp_path: Path, name: str, figures: dict[str, object]) -> Path:
    run = _results.Run(name, argv=["--duration-s", "3"])
    path: Path = run.write(figures, tmp_path / f"{name}.json")
    return path


BROKER = {
    "patches": 10,
    "watches": 2,
    "patch_ms": {"p50": 1.234, "p99": 5.678},
    "watch_wake_ms": {"p50": 2.5, "p99": 9.25},
    "commit_ms": {"full": {"p50": 0.4, "p99": 3.4}, "normal": {"p50": 0.08, "p99": 0.6}},
}


def test_a_block_is_filled_from_its_file_and_a_stale_one_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _results_file(tmp_path, "broker_api", BROKER)
    monkeypatch.setattr(quote, "RESULTS", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(
        "intro\n<!-- bench:broker_api -->\nhand-typed 1.0 ms\n<!-- /bench:broker_api -->\n"
    )
    monkeypatch.setattr(quote, "DOCS", [doc])
    monkeypatch.setattr(quote, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["quote.py", "--check"])
    assert quote.main() == 1  # the hand-typed figure is stale
    monkeypatch.setattr(sys, "argv", ["quote.py"])
    assert quote.main() == 0
    text = doc.read_text()
    assert "hand-typed" not in text
    assert "| PATCH | 1.234 | 5.678 |" in text
    assert "`.venv/bin/python bench/broker_api.py --duration-s 3`" in text
    monkeypatch.setattr(sys, "argv", ["quote.py", "--check"])
    assert quote.main() == 0


def test_a_missing_results_file_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quote, "RESULTS", tmp_path)
    text = quote.render("gate_detection")
    assert "Not measured" in text and "bench/gate_detection.py" in text


def test_results_file_records_provenance(tmp_path: Path) -> None:
    path = _results_file(tmp_path, "broker_api", BROKER)
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "broker_api"
    assert doc["machine"]["cores"] >= 1
    assert set(doc["load_1m"]) == {"start", "end"}
    assert "linear" in doc["percentile"]
    assert doc["results"] == BROKER


def test_one_percentile_definition() -> None:
    import numpy as np

    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        assert _results.percentile(values, q) == pytest.approx(np.percentile(values, 100 * q))
    assert _results.percentile([], 0.5) is None
    with pytest.raises(ValueError, match="q must be in"):
        _results.percentile(values, 95)


def test_a_certify_campaign_is_quoted_from_the_reports_own_figures(tmp_path: Path) -> None:
    """bench/certify_campaign.py copies the campaign report's cell (never a figure of its
    own), and quote renders it with the certification sentence; a run folder without a
    certified campaign is refused by name."""
    import certify_campaign

    from gameday.report.build import build_report
    from gameday.report.synthetic import Scenario, write_campaign

    root = tmp_path / "run"
    faulty = Scenario(
        "router-faulty-kernel", "router", "faulty-kernel", "trip", True, 1.8, "kernel"
    )
    write_campaign(root, {"router-faulty-kernel": [1.5, 2.0, 6.0]}, [faulty], certify=True)
    build_report(root)
    cell = json.loads((root / "summary.json").read_text())["campaign"]["cells"][0]
    figures = certify_campaign.campaign_figures(root)
    assert figures["cells"][0]["time_to_trip"] == cell["time_to_trip"]
    text = "\n".join(quote.r_certify_campaign(figures))
    assert f"{cell['passes_text']} passed" in text
    assert f"p95 {quote._f(cell['time_to_trip']['p95']['value_s'])} s" in text
    assert cell["certification"]["sentence"] in text

    plain = tmp_path / "plain"
    write_campaign(plain, {"router-faulty-kernel": [1.5, 2.0]}, [faulty], certify=False)
    build_report(plain)
    with pytest.raises(SystemExit, match="no certified campaign"):
        certify_campaign.campaign_figures(plain)
