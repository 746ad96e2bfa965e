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


def _detection_part(argv: list[str], healthy: list[tuple[str, bool]], seed: int) -> dict:
    """A gate_detection results document as one part writes it, from made-up healthy runs
    (condition, tripped): the bench's own summary code, no stack."""
    import gate_detection
    from detection import summary

    args = gate_detection.parse_args([*argv, "--seed", str(seed)])
    runs = [
        {
            "run": i,
            "condition": cond,
            "canary": f"v{i + 2}",
            "false_trip": {"test": "drift"} if tripped else None,
            "reference_trip_s": {"seed_article": None, "flagger": None},
            "baseline_canary_comparisons": 300,
            "wall_s": 28.0,
        }
        for i, (cond, tripped) in enumerate(healthy)
    ]
    load = {**summary.settings_for(args)["load"], "requests": 100, "non_200": 0, "seed": seed}
    result = summary.report(args, [], runs, [], load, 60.0)
    doc: dict = _results.Run("gate_detection", argv=argv).document(result)
    return doc


def test_a_detection_campaign_in_parts_pools_its_runs_and_refuses_other_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 4.7 h campaign may run in parts: a part's runs are added to the file's and every
    bound is recomputed from the pooled runs; each run names its part and each part its
    command; a part under other settings (run length, users) is refused before it starts
    (the parser) and at the merge, naming the setting; the quote says which conditions are
    not measured yet."""
    import gate_detection
    from detection import summary

    from gameday.report.campaign import exceedance_upper_bound

    first = _detection_part(["--runs", "0"], [("none", False)] * 3, seed=1)
    second = _detection_part(
        ["--runs", "0"],
        [("none", False)] * 2 + [("router_kill", True), ("router_kill", False)],
        seed=2,
    )
    merged = summary.merge(first, second, gate_detection.parse_args(["--seed", "2"]))
    by = merged["healthy_runs"]["by_condition"]
    assert (by["none"]["runs"], by["none"]["false_trips"]) == (5, 0)
    assert by["none"]["upper_bound_95"] == round(exceedance_upper_bound(5, 0), 4)
    assert (by["router_kill"]["runs"], by["router_kill"]["false_trips"]) == (2, 1)
    assert [r["part"] for r in merged["healthy_runs"]["runs"]] == [0, 0, 0, 1, 1, 1, 1]
    assert merged["load"]["seed"] == [1, 2] and merged["load"]["requests"] == 200
    assert [p["healthy_runs"] for p in merged["parts"]] == [
        {"none": 3},
        {"none": 2, "router_kill": 2},
    ]

    shorter = _detection_part(["--healthy-s", "10"], [("none", False)], seed=3)
    with pytest.raises(ValueError, match=r"seconds_each\.healthy: 20\.0 -> 10\.0"):
        summary.merge(first, shorter, gate_detection.parse_args([]))

    path = tmp_path / "gate_detection.json"
    path.write_text(json.dumps(first))
    with pytest.raises(SystemExit) as exit_info:
        gate_detection.parse_args(["--add-to", str(path), "--users", "8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--add-to {path}: this part would run under other settings" in err
    assert "users" in err
    assert gate_detection.parse_args(["--add-to", str(path)]).campaign == first

    text = "\n".join(quote.r_gate_detection(merged))
    assert "| none | 5 | 0 |" in text and "| router_kill | 2 | 1 |" in text
    assert "| broker_kill | not measured yet |" in text
    assert "No faulty-kernel runs in this campaign yet" in text
    assert (
        "ran in 2 parts" in text and "`.venv/bin/python bench/gate_detection.py --runs 0`" in text
    )


def test_a_results_file_names_the_commit_that_ran_not_the_one_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 90-minute campaign outlives commits to its checkout: the file names the commit it
    started at, and the one at the end only as ``commit_at_end`` (once a campaign file
    named a commit made after it started)."""
    heads = iter(["aaaaaaa", "bbbbbbb", "bbbbbbb"])
    monkeypatch.setattr(_results, "_commit", lambda: next(heads))
    run = _results.Run("broker_api", argv=[])
    doc = run.document(BROKER)
    assert (doc["commit"], doc["commit_at_end"]) == ("aaaaaaa", "bbbbbbb")
    monkeypatch.setattr(_results, "_commit", lambda: "ccccccc")
    same = _results.Run("broker_api", argv=[]).document(BROKER)
    assert same["commit"] == "ccccccc" and "commit_at_end" not in same
