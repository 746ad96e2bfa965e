"""``gameday.evidence.jsonl``: the one reading of the probes' own JSON-lines records (the
coloured requests sent, the dependency watch ticks). Before it, the two readers differed:
the dependency watch accepted ``NaN`` lines and a file that was not UTF-8 crashed the
colouring probe's read instead of passing over the bad line."""

from __future__ import annotations

from pathlib import Path

from gameday.evidence.jsonl import json_objects
from probes import colouring, dependency
from probes._run_records import run_json_lines


def test_objects_in_file_order_and_every_other_line_passed_over() -> None:
    raw = (
        b'{"a": 1}\n'
        b"\n"
        b"[1, 2]\n"  # JSON, not an object
        b'{"b": NaN}\n'  # not strict JSON
        b'{"c": "\xff"}\n'  # not UTF-8
        b'{"d": 2}\r\n'
        b'{"torn": tr'  # a kill mid-write
    )
    assert json_objects(raw) == [{"a": 1}, {"d": 2}]


def test_an_empty_file_has_no_objects() -> None:
    assert json_objects(b"") == []


def test_the_run_folder_file_absent_is_no_rows(tmp_path: Path) -> None:
    cfg = {"gameday_run_dir": str(tmp_path / "no-such-run")}
    assert run_json_lines(cfg, "x.jsonl") == []


def test_colouring_reads_the_sent_requests_past_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / colouring.SENT_NAME).write_bytes(
        b'{"request_id": "r1", "trace_id": "t", "tag": "g", "at": 1.0}\n'
        b'{"request_id": "\xff"}\n'
        b'{"request_id": 7}\n'  # no string id: not a sent request
        b'{"request_id": "r2", "trace_id": "t", "tag": "g", "at": 2.0}\n'
    )
    sent = colouring.read_sent({"gameday_run_dir": str(tmp_path)})
    assert [row["request_id"] for row in sent] == ["r1", "r2"]


def test_dependency_summary_counts_only_strict_watch_ticks(tmp_path: Path) -> None:
    (tmp_path / dependency.WATCH_NAME).write_bytes(
        b'{"time": 1.0, "health": {"router-0": true}, "redis": true}\n'
        b'{"time": NaN, "health": {"router-0": false}, "redis": false}\n'
        b'{"time": 2.0, "health": {"router-0": false}, "redis": true}\n'
    )
    lines = run_json_lines({"gameday_run_dir": str(tmp_path)}, dependency.WATCH_NAME)
    assert [line["time"] for line in lines] == [1.0, 2.0]
