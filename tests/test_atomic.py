"""gameday.atomic: a run's files are replaced whole, never left half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gameday import atomic


def test_write_json_makes_the_folder_and_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "result.json"
    atomic.write_json(path, {"verdict": "pass", "at": Path("/x")})
    atomic.write_json(path, {"verdict": "fail"})
    assert json.loads(path.read_text()) == {"verdict": "fail"}
    assert path.read_text().endswith("}\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    atomic.write_text(path, "old\n")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.replace_whole(path, half_then_fail)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_temporary_keeps_the_suffix_for_writers_that_go_by_it(tmp_path: Path) -> None:
    seen: list[str] = []

    def write(tmp: Path) -> None:
        seen.append(tmp.suffix)
        tmp.touch()

    atomic.replace_whole(tmp_path / "timeline.png", write)
    assert seen == [".png"]
    assert (tmp_path / "timeline.png").exists()
