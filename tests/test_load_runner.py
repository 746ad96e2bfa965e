"""gameday.load.runner: start Locust as a subprocess, stop it cleanly, read its records.

Real Locust, real model servers; also the oracle (pinned pairs to two servers of
different versions) and what a stop timeout does to streams still in flight.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import requests

from gameday.load.runner import LoadConfig, LoadRun, LoadStartError
from tests.load_support import SHORT_PROMPTS, short_load
from tests.procs import Proc, Spawner, wait_for

pytestmark = pytest.mark.slow


def running(proc: Proc) -> float:
    text = requests.get(proc.url + "/metrics", timeout=5).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running")]
    return float(line.rsplit(" ", 1)[1])


def request_done(proc: Proc) -> list[dict[str, object]]:
    return [e for e in proc.log_events() if e.get("event") == "request_done"]


def test_start_stop_records_chat_and_oracle_pairs(spawn: Spawner, tmp_path: Path) -> None:
    baseline = spawn("canarystack.model", "--version", "v1")
    canary = spawn("canarystack.model", "--version", "v2")
    config = short_load(
        baseline.url,
        tmp_path,
        users=3,
        spawn_rate=3,
        duration_s=None,
        stop_timeout_s=10,
        api_path="/v1/chat/completions",
        oracle=True,
        run_id="runner-test",
        extra_args=(
            *SHORT_PROMPTS,
            "--oracle-canary-host",
            canary.url,
            "--oracle-interval-s",
            "0.05",
        ),
    )
    with LoadRun(config) as run:
        assert run.running and run.pid is not None
        wait_for(lambda: len(request_done(canary)) >= 5, timeout=30, what="oracle pairs")
    result = run.result
    assert result is not None and result.exit_code == 0 and not run.running
    records = pd.read_parquet(result.records_path)
    # the baseline server saw the load users' requests plus the oracle's baseline side
    load_ids = {str(e["request_id"]) for e in request_done(baseline)} - {
        str(e["request_id"])
        for e in request_done(baseline)
        if str(e["request_id"]).endswith("-baseline")
    }
    assert set(records.request_id) == load_ids and len(records) == result.summary["requests_sent"]
    assert (records.endpoint == "/v1/chat/completions").all() and records.ok.all()
    assert (records.run_id == "runner-test").all()
    assert (records.prompt_tokens == records.planned_prompt_tokens).all()
    assert result.oracle_path is not None
    oracle = pd.read_parquet(result.oracle_path)
    assert len(oracle) == result.summary["oracle_pairs"] >= 5
    assert oracle.error.isna().all(), oracle.error.dropna().tolist()
    assert (oracle.baseline_version == "v1").all() and (oracle.canary_version == "v2").all()
    assert (oracle.positions >= 1).all() and oracle.top1_agree.between(0, 1).all()
    assert oracle.kl_mean.mean() > 0.001  # two versions drift (the simulator's default 0.01)
    assert (run.output_dir / "locust_stats.csv").exists() and run.log_path.exists()


@pytest.mark.parametrize("processes", [None, 2])
def test_stop_timeout_cuts_streams_but_keeps_their_rows(
    spawn: Spawner, tmp_path: Path, processes: int | None
) -> None:
    model = spawn("canarystack.model", "--version", "v1", "--itl-ms", "20")  # ~4 s streams
    config = short_load(
        model.url,
        tmp_path,
        users=4,
        spawn_rate=4,
        duration_s=None,
        stop_timeout_s=0,
        max_tokens=200,
        processes=processes,
    )
    run = LoadRun(config).start()
    wait_for(lambda: running(model) >= 4, timeout=15, what="4 streams in flight")
    result = run.stop()
    records = pd.read_parquet(result.records_path)
    sent = result.summary["requests_sent"]
    assert isinstance(sent, int) and len(records) == sent >= 4
    cut = records[records.error_kind == "timeout"]
    assert len(cut) >= 4 and not cut.ok.any()
    assert cut.ttft_s.notna().all()  # streams had started: what was measured is kept
    # the server logged every one of them too (as client_disconnected)
    wait_for(lambda: len(request_done(model)) >= len(records), timeout=10)
    assert {str(e["request_id"]) for e in request_done(model)} == set(records.request_id)


def test_a_run_with_a_duration_ends_by_itself(spawn: Spawner, tmp_path: Path) -> None:
    model = spawn("canarystack.model", "--version", "v1")
    config = short_load(model.url, tmp_path, duration_s=2, stop_timeout_s=10)
    run = LoadRun(config).start()
    result = run.wait(60)
    assert result.exit_code == 0 and result.summary["records"] == len(
        pd.read_parquet(result.records_path)
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--bogus-flag",), "unrecognized arguments: --bogus-flag"),
        (("--max-tokens", "0"), "--max-tokens must be >= 1"),
    ],
)
def test_a_failed_start_raises_with_locusts_message(
    tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    config = LoadConfig(host="http://127.0.0.1:9", output_dir=tmp_path / "run", extra_args=extra)
    run = LoadRun(config)
    with pytest.raises(LoadStartError, match="before the test started") as info:
        run.start(timeout_s=60)
    assert expected in str(info.value)
    assert not run.running


def test_a_bad_trace_file_fails_the_start_naming_file_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,10,-5\n")
    config = LoadConfig(
        host="http://127.0.0.1:9", output_dir=tmp_path / "run", prompt_mix=f"azure-trace:{trace}"
    )
    with pytest.raises(LoadStartError) as info:
        LoadRun(config).start(timeout_s=60)
    assert f"{trace}, line 3, field 'GeneratedTokens': must be >= 1, got -5" in str(info.value)


def test_config_is_checked_before_starting(tmp_path: Path) -> None:
    for bad, words in [
        ({"users": 0}, "users must be >= 1"),
        ({"duration_s": 0}, "duration_s must be > 0"),
        ({"locustfile": tmp_path / "none.py"}, "does not exist"),
    ]:
        with pytest.raises(ValueError, match=words):
            LoadRun(LoadConfig(host="http://x", output_dir=tmp_path, **bad))  # type: ignore[arg-type]


def test_a_run_with_worker_pods_is_their_master_on_loopback(tmp_path: Path) -> None:
    from gameday.load.runner import LoadConfig, LoadRun

    config = LoadConfig(
        host="http://127.0.0.1:1", output_dir=tmp_path, external_workers=2, master_port=18030
    )
    config.validate()
    argv = LoadRun(config).command()
    at = argv.index("--master")
    assert argv[at : at + 9] == [
        "--master",
        "--expect-workers",
        "2",
        "--expect-workers-max-wait",
        "120",
        "--master-bind-host",
        "127.0.0.1",
        "--master-bind-port",
        "18030",
    ]
    for bad in (
        LoadConfig(host="h", output_dir=tmp_path, external_workers=2),  # no port
        LoadConfig(host="h", output_dir=tmp_path, external_workers=2, master_port=1, processes=2),
    ):
        with pytest.raises(ValueError, match="LoadConfig"):
            bad.validate()
