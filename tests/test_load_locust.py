"""Real Locust (locustfiles/llm.py) against a real model server, bounded to a few seconds.

- every request sent has exactly one record, with one process and with ``--processes 2``
  (master + workers shipping records): rows = requests the server logged = summary;
- the client's TTFT bias against the server's own ``request_done`` ``ttft_s`` (joined on
  ``x-request-id``) stays within ``TTFT_BIAS_P50_BOUND_S``;
- trace replay starts each request at its offset × time scale within ``PACING_*``, and
  counts (and warns about) starts it could not make on time;
- a bad prompt file stops Locust before any request with a message naming the file, the
  line and the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.procs import Proc, Spawner, free_port, wait_for

pytestmark = pytest.mark.slow

LOCUSTFILE = Path(__file__).resolve().parents[1] / "locustfiles" / "llm.py"
# Measured on the 2-core dev machine: p50 bias 0.4-0.7 ms at 4 users (bench/load_capacity.py
# shows ~1-3 ms near saturation). The bound leaves room for CPU contention from other tests.
TTFT_BIAS_P50_BOUND_S = 0.015
# Measured: requests start 1-5 ms (p95) from their scheduled time; up to ~50 ms with the
# 2 cores oversubscribed by parallel test runs. Starting as fast as users allow instead of
# at the offsets would be off by up to 1 s here.
PACING_P95_BOUND_S = 0.1
PACING_MAX_BOUND_S = 0.3


def locust(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", *args]
    if "--processes" in args:  # the default master port 5557 may be another run's
        port = str(free_port())
        cmd += ["--master-bind-port", port, "--master-port", port]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def replay_trace(
    model: Proc, trace: Path, out: Path, users: int, *args: str
) -> tuple[subprocess.CompletedProcess[str], pd.DataFrame]:
    """Locust replaying ``trace`` against ``model`` with ``users`` users (10 s at most),
    records and summary into ``out``: the finished run and its records, checked complete."""
    r = locust(
        "--host", model.url, "-u", str(users), "-r", str(users), "-s", "10",
        "--prompt-mix", f"azure-trace:{trace}",
        "--records-out", str(out / "records.parquet"), "--summary-out", str(out / "summary.json"),
        *args,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r, check_complete(out, model)


def done_events(proc: Proc) -> dict[str, dict[str, Any]]:
    return {str(e["request_id"]): e for e in proc.log_events() if e.get("event") == "request_done"}


def wait_done_count(proc: Proc, n: int) -> dict[str, dict[str, Any]]:
    wait_for(lambda: len(done_events(proc)) >= n, timeout=10, what=f"{n} request_done lines")
    return done_events(proc)


def check_complete(out: Path, proc: Proc) -> pd.DataFrame:
    records = pd.read_parquet(out / "records.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert len(records) > 0
    assert summary["requests_sent"] == summary["records"] == len(records)
    assert records.request_id.is_unique
    server = wait_done_count(proc, len(records))
    # the same set of requests on both sides: none lost, none invented
    assert set(records.request_id) == set(server)
    assert records.run_id.nunique() == 1
    return records


@pytest.fixture
def model(spawn: Spawner) -> Proc:
    return spawn("canarystack.model", "--version", "v1")


def test_one_process_records_every_request_and_ttft_bias_is_small(
    model: Proc, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    r = locust(
        "--host", model.url, "-u", "4", "-r", "4", "-t", "3s", "-s", "10",
        "--max-tokens", "16", "--records-out", str(out / "records.parquet"),
        "--summary-out", str(out / "summary.json"), "--run-id", "bias-run",
        "--csv", str(out / "locust"), "--html", str(out / "report.html"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    records = check_complete(out, model)
    assert records.ok.all() and records.error_kind.isna().all()
    assert (records.run_id == "bias-run").all()
    # the simulator counts one token per word: the mix's lengths arrive exactly
    assert (records.prompt_tokens == records.planned_prompt_tokens).all()
    assert (records.completion_tokens == 16).all()
    assert (records.model_version == "v1").all() and (records.served_by == "").all()
    assert records.bucket.nunique() >= 3  # the synthetic mix spans buckets
    server = done_events(model)
    bias = records.ttft_s - records.request_id.map(lambda i: server[i]["ttft_s"])
    # Not earlier than the server's first write (header time would be): a few requests may
    # read slightly negative because the server stamps after its write returns, and a busy
    # CPU can delay that stamp past the client's read.
    assert bias.quantile(0.05) >= -0.002, bias.describe()
    assert bias.median() <= TTFT_BIAS_P50_BOUND_S, bias.describe()
    # Locust's own outputs keep working and carry the TTFT per variant
    stats = pd.read_csv(out / "locust_stats.csv")
    row = stats[stats.Name == "ttft[unknown]"]
    assert int(row["Request Count"].iloc[0]) == len(records)
    assert (out / "report.html").stat().st_size > 10_000


def test_processes_2_workers_ship_every_record_to_the_master(model: Proc, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = locust(
        "--host", model.url, "-u", "4", "-r", "4", "-t", "3s", "-s", "10", "--processes", "2",
        "--max-tokens", "16", "--records-out", str(out / "records.parquet"),
        "--summary-out", str(out / "summary.json"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers_reported"] == 2
    records = check_complete(out, model)
    assert records.ok.all()


def write_trace(path: Path, offsets_s: list[float], generated: int = 8) -> Path:
    base = pd.Timestamp("2023-11-16 18:15:46.6805900")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i, off in enumerate(offsets_s):
        ts = (base + pd.Timedelta(seconds=off)).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{ts}0,{100 + i},{generated}")  # unique lengths identify each row
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("processes", [1, 2])
def test_trace_replay_follows_scaled_offsets_open_loop(
    model: Proc, tmp_path: Path, processes: int
) -> None:
    # bursts and gaps: 30 requests over 4 s of trace time, replayed at scale 0.5 (2 s)
    gaps = [0.0, 0.0, 0.0, 0.05, 0.3, 0.0, 0.1, 0.2, 0.02, 0.0] * 3
    offsets = [round(sum(gaps[: i + 1]), 3) for i in range(len(gaps))]
    trace = write_trace(tmp_path / "trace.csv", offsets)
    out = tmp_path / "run"
    more = ["--processes", str(processes)] if processes > 1 else []
    _, records = replay_trace(model, trace, out, 8, "--trace-time-scale", "0.5", *more)
    assert len(records) == len(offsets)
    due = records.planned_prompt_tokens.map(lambda n: offsets[n - 100] * 0.5)
    # start = t0 + offset × scale: the difference is one constant for every request
    skew = records.start_time - due
    dev = (skew - skew.min()).abs()
    assert dev.quantile(0.95) <= PACING_P95_BOUND_S and dev.max() <= PACING_MAX_BOUND_S, (
        dev.describe()
    )
    assert (records.completion_tokens == 8).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace_requests"] == len(offsets) and summary["trace_abandoned"] == 0


def test_trace_replay_counts_and_warns_when_users_cannot_keep_up(
    model: Proc, tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "burst.csv", [0.0] * 6, generated=32)
    out = tmp_path / "run"
    r, records = replay_trace(model, trace, out, 1, "--trace-late-tolerance-s", "0.02")
    summary = json.loads((out / "summary.json").read_text())
    assert len(records) == 6  # late, but every request of the trace was sent
    assert summary["trace_late_starts"] >= 4 and summary["max_trace_lag_s"] > 0.1
    assert "trace replay is behind" in r.stderr


@pytest.mark.parametrize(
    ("mix", "content", "expected"),
    [
        (
            "jsonl",
            '{"prompt": "ok"}\n{"prompt": "x", "max_tokens": "ten"}\n',
            "line 2, field 'max_tokens'",
        ),
        (
            "azure-trace",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n1,five,5\n",
            "line 3, field 'ContextTokens'",
        ),
    ],
)
def test_bad_prompt_file_stops_locust_naming_file_line_and_field(
    model: Proc, tmp_path: Path, mix: str, content: str, expected: str
) -> None:
    f = tmp_path / f"bad.{mix}"
    f.write_text(content)
    r = locust("--host", model.url, "-u", "1", "-t", "2s", "--prompt-mix", f"{mix}:{f}", timeout=60)
    assert r.returncode == 2
    assert f"gameday.load: error: {f}, {expected}" in r.stderr
    assert done_events(model) == {}  # nothing was sent
