"""Pure parts of gameday.load: SSE measurement, pacing schedule, records, options, shapes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gameday.load.buckets import bucket_of, parse_edges
from gameday.load.options import CHAT, LoadOptions, OptionsError, parse_headers, plain_parser
from gameday.load.pacing import TraceSchedule, ramp_users
from gameday.load.records import (
    LOAD_COLUMNS,
    LOAD_SCHEMA,
    ORACLE_SCHEMA,
    ParquetSink,
    part_paths,
)
from gameday.load.sse import SSEDecoder, StreamMeasurement, percentile


def chunk(text: str = "", usage: dict[str, int] | None = None, chat: bool = False) -> str:
    if chat:
        choice = {"index": 0, "delta": {"content": text} if text else {"role": "assistant"}}
    else:
        choice = {"index": 0, "text": text}
    return json.dumps({"choices": [choice] if text or chat else [], "usage": usage})


def feed(m: StreamMeasurement, lines: list[tuple[str, float]]) -> None:
    d = SSEDecoder()
    for line, now in lines:
        payload = d.feed_line(line + "\n")
        if payload is not None:
            m.on_payload(payload, now)


def test_ttft_is_the_first_event_with_content_not_a_role_chunk() -> None:
    m = StreamMeasurement(t_sent=10.0)
    feed(
        m,
        [
            ("data: " + chunk(chat=True), 10.001),  # role only: headers-time, not TTFT
            ("", 10.001),
            (": keep-alive", 10.05),
            ("data: " + chunk("", chat=True), 10.06),
            ("", 10.06),
            ("data: " + chunk(" ka", chat=True), 10.2),
            ("", 10.2),
            ("data: " + chunk(" lu", chat=True), 10.25),
            ("", 10.25),
            ("data: " + chunk(" mo", chat=True), 10.35),
            ("", 10.35),
            ("data: " + chunk(usage={"prompt_tokens": 7, "completion_tokens": 3}), 10.36),
            ("", 10.36),
            ("data: [DONE]", 10.37),
            ("", 10.37),
        ],
    )
    assert m.ttft_s == pytest.approx(0.2)
    mean, p99, mx = m.itl()
    assert mean == pytest.approx(0.075) and p99 == pytest.approx(0.1) and mx == pytest.approx(0.1)
    assert (m.prompt_tokens, m.completion_tokens) == (7, 3)
    assert m.error_kind() == (None, None)


def test_stream_error_kinds() -> None:
    cut = StreamMeasurement(t_sent=0.0)
    feed(cut, [("data: " + chunk(" a"), 0.1), ("", 0.1)])
    assert cut.error_kind()[0] == "broken_stream"
    assert "[DONE]" in (cut.error_kind()[1] or "")
    empty = StreamMeasurement(t_sent=0.0)
    feed(
        empty,
        [
            ("data: " + chunk(usage={"prompt_tokens": 1, "completion_tokens": 0}), 0.1),
            ("", 0.1),
            ("data: [DONE]", 0.1),
            ("", 0.1),
        ],
    )
    assert empty.error_kind()[0] == "empty_completion" and empty.ttft_s is None
    bad = StreamMeasurement(t_sent=0.0)
    feed(bad, [("data: {not json", 0.1), ("", 0.1), ("data: [DONE]", 0.1), ("", 0.1)])
    assert bad.error_kind()[0] == "broken_stream"
    one = StreamMeasurement(t_sent=0.0)
    feed(one, [("data: " + chunk(" a"), 0.1), ("", 0.1), ("data: [DONE]", 0.2), ("", 0.2)])
    assert one.itl() == (None, None, None) and one.error_kind() == (None, None)


def test_sse_decoder_handles_crlf_multiline_and_a_tail_without_blank_line() -> None:
    d = SSEDecoder()
    assert d.feed_line(b'data: {"a":\r\n') is None
    assert d.feed_line(b"data: 1}\r\n") is None
    assert d.feed_line(b"\r\n") == '{"a":\n1}'
    assert d.feed_line(b"event: x\n") is None
    assert d.feed_line(b"data:[DONE]") is None
    assert d.flush() == "[DONE]"


def test_percentile_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 99) == 99.0 and percentile(values, 50) == 50.0
    assert percentile([3.0], 99) == 3.0


def test_schedule_open_loop_due_times_worker_shares_and_late_counter() -> None:
    clock = [100.0]
    s = TraceSchedule(
        [0.0, 1.0, 1.0, 4.0], time_scale=0.5, late_tolerance_s=0.1, clock=lambda: clock[0]
    )
    s.start()
    dues = [s.take() for _ in range(5)]
    assert [d.due if d else None for d in dues] == [100.0, 100.5, 100.5, 102.0, None]
    assert s.duration_s == 2.0
    assert dues[0] is not None and s.mark_started(dues[0], now=100.05) == pytest.approx(0.05)
    assert dues[1] is not None and s.mark_started(dues[1], now=101.0) == pytest.approx(0.5)
    assert (s.started, s.late, s.max_lag_s) == (2, 1, pytest.approx(0.5))
    # two processes split the trace between them, each request exactly once
    a = TraceSchedule(list(range(7)), worker_index=0, worker_count=2)
    b = TraceSchedule(list(range(7)), worker_index=1, worker_count=2)
    a.start(0.0)
    b.start(0.0)
    got = []
    for sch in (a, b):
        while (slot := sch.take()) is not None:
            got.append(slot.index)
    assert sorted(got) == list(range(7)) and (len(a), len(b)) == (4, 3)
    with pytest.raises(ValueError, match="trace-time-scale"):
        TraceSchedule([0.0], time_scale=0)


def test_parquet_sink_schema_row_groups_and_atomic_close(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "records.parquet"
    sink = ParquetSink(path, LOAD_SCHEMA, rows_per_group=3, flush_interval_s=3600)
    row = dict.fromkeys(LOAD_COLUMNS)
    row.update(run_id="r", request_id="x", ok=True, status=200, stream=True, served_by="")
    for i in range(7):
        sink.add({**row, "request_id": f"x{i}", "ttft_s": i / 10})
    sink.add_columns({"run_id": ["r"], "request_id": ["w0"], "ok": [False], "status": [503]})
    assert not path.exists()  # readers never see half a file
    assert [p.name for p in part_paths(path)] == [
        "records.part-000001.parquet",
        "records.part-000002.parquet",
    ]  # two closed parts of 3 rows; 2 rows still buffered
    sink.close()
    assert path.exists() and part_paths(path) == []
    table = pq.read_table(path)
    assert table.schema.equals(LOAD_SCHEMA) and table.num_rows == 8
    assert table.column("request_id").to_pylist()[-1] == "w0"
    assert tuple(table.schema.names) == LOAD_COLUMNS
    empty = ParquetSink(tmp_path / "oracle.parquet", ORACLE_SCHEMA)
    empty.close()
    assert pq.read_table(tmp_path / "oracle.parquet").num_rows == 0


def parse(*args: str) -> argparse.Namespace:
    return plain_parser().parse_args(list(args))


def test_options_defaults_and_validation() -> None:
    o = LoadOptions.from_namespace(parse("--host", "http://127.0.0.1:9/"))
    assert o.host == "http://127.0.0.1:9" and o.shape == "steady" and not o.chat and o.stream
    o = LoadOptions.from_namespace(
        parse(
            "--host",
            "http://h:1",
            "--api-path",
            CHAT,
            "--header",
            "x-canary-variant: canary",
            "--records-out",
            "/tmp/x/records.parquet",
        )
    )
    assert o.chat and o.headers == {"x-canary-variant": "canary"}
    assert o.oracle_out == "/tmp/x/oracle.parquet"
    o = LoadOptions.from_namespace(
        parse("--host", "http://h:1", "--prompt-mix", "azure-trace:x.csv")
    )
    assert o.shape == "trace"
    bad = [
        ((), "no --host"),
        (("--host", "h:1"), "http://"),
        (("--host", "http://h", "--api-path", "/v1/embeddings"), "--api-path"),
        (("--host", "http://h", "--max-tokens", "0"), "--max-tokens must be >= 1"),
        (("--host", "http://h", "--trace-time-scale", "0"), "--trace-time-scale must be > 0"),
        (("--host", "http://h", "--shape", "trace"), "--shape trace needs"),
        (("--host", "http://h", "--bucket-edges", "5,4"), "--bucket-edges"),
        (("--host", "http://h", "--header", "nocolon"), "--header 'nocolon'"),
        (("--host", "http://h", "--variant-value", "v2=green"), "--variant-value 'v2=green'"),
        (("--host", "http://h", "--pin-value", "v2"), "--pin-value 'v2': give VARIANT=VALUE"),
        (("--host", "http://h", "--variant-header", "a b"), "--variant-header 'a b'"),
    ]
    for args, words in bad:
        with pytest.raises(OptionsError, match=words.replace("(", r"\(")):
            LoadOptions.from_namespace(parse(*args))
    assert parse_headers(["a:b", "c: d:e"]) == {"a": "b", "c": "d:e"}
    o = LoadOptions.from_namespace(
        parse(
            "--host", "http://h", "--variant-header", "X-Model-Version",
            "--variant-value", "v7=baseline", "--variant-value", "v8=canary",
            "--pin-header", "x-route-to", "--pin-value", "canary=v8",
        )
    )  # fmt: skip
    assert (o.variant_header, o.variant_values) == (
        "x-model-version",
        {"v7": "baseline", "v8": "canary"},
    )
    assert (o.pin_header, o.pin_values) == ("x-route-to", {"canary": "v8"})


def test_buckets_mirror_the_stack_labels() -> None:
    assert [bucket_of(n) for n in (0, 511, 512, 1024, 2047, 2048, 4096, 9999)] == [
        "0-512",
        "0-512",
        "512-1k",
        "1k-2k",
        "1k-2k",
        "2k-4k",
        "4k+",
        "4k+",
    ]
    assert bucket_of(100, parse_edges("100,200")) == "100-200"


def test_ramp_curve() -> None:
    assert [ramp_users(t, 1, 9, 8.0) for t in (0, 2, 4, 8, 20)] == [1, 3, 5, 9, 9]
    assert ramp_users(0, 1, 9, 0) == 9
