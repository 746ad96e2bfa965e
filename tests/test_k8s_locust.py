"""Distributed Locust as deploy/k8s runs it, on loopback: a master and two separate
``--worker`` processes against a bare model server, bounded to a few seconds.

- plain Locust processes (master ``--expect-workers 2``, two ``--worker``), each started
  and stopped by PID: the master's records hold every request the model server logged,
  shipped by both workers;
- the image's entry-point roles the Deployments use (``locust-master``,
  ``locust-worker``): the master writes its run folder (records, summary, exit code,
  ``latest``) and idles for ``kubectl cp``; SIGTERM ends master and workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tests.procs import Proc, Spawner, free_port, stopping, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "locustfiles" / "llm.py"
ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"
LOAD = ["-u", "4", "-r", "4", "-t", "3s", "-s", "10", "--max-tokens", "16"]


class Group:
    """Processes of one test, each a ``Proc`` stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, Proc] = {}

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log_path = self.tmp / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed below
        full = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full)
        log.close()
        self.procs[name] = Proc(popen=popen, port=0, log_path=log_path)  # no port it serves

    def log(self, name: str) -> str:
        return self.procs[name].log_path.read_text(errors="replace")

    def stop(self, name: str, timeout: float = 20) -> int:
        proc = self.procs[name]
        proc.stop(timeout)
        return int(proc.popen.returncode)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name, timeout=5)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    with stopping(Group(tmp_path)) as g:
        yield g


@pytest.fixture
def model(spawn: Spawner) -> Proc:
    return spawn("canarystack.model", "--version", "v1")


def server_request_ids(model: Proc) -> set[str]:
    return {str(e["request_id"]) for e in model.log_events() if e.get("event") == "request_done"}


def check_complete(run: Path, model: Proc) -> pd.DataFrame:
    records = pd.read_parquet(run / "records.parquet")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers_reported"] == 2, summary
    assert len(records) > 0 and records.request_id.is_unique
    assert summary["requests_sent"] == summary["records"] == len(records), summary
    # the same requests on both sides: none lost on the way to the master, none invented
    wait_for(lambda: len(server_request_ids(model)) >= len(records), timeout=10,
             what="the server's request_done lines")  # fmt: skip
    assert set(records.request_id) == server_request_ids(model)
    assert records.ok.all() and (records.model_version == "v1").all()
    return records


def test_master_and_two_worker_processes_collect_every_record(
    model: Proc, group: Group, tmp_path: Path
) -> None:
    port = free_port()
    run = tmp_path / "run"
    locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    group.start("master", [
        *locust, "--master", "--headless", "--expect-workers", "2",
        "--expect-workers-max-wait", "60", "--master-bind-host", "127.0.0.1",
        "--master-bind-port", str(port), "--host", model.url, *LOAD,
        "--records-out", str(run / "records.parquet"), "--summary-out", str(run / "summary.json"),
    ])  # fmt: skip
    for i in (1, 2):
        group.start(f"worker-{i}", [*locust, "--worker", "--master-host", "127.0.0.1",
                                    "--master-port", str(port)])  # fmt: skip
    master = group.procs["master"].popen
    try:
        code = master.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the master did not finish in time:\n{group.log('master')[-3000:]}")
    assert code == 0, group.log("master")[-3000:]
    check_complete(run, model)
    # the workers end with their master ("quit"); stopping them by PID is a no-op then
    for i in (1, 2):
        assert group.stop(f"worker-{i}") in (0, -signal.SIGTERM)


def test_the_images_locust_roles_write_a_run_folder_and_stop_on_sigterm(
    model: Proc, group: Group, tmp_path: Path
) -> None:
    port = free_port()
    records_dir = tmp_path / "records"
    env = {"PYTHON": sys.executable, "APP_DIR": str(REPO), "LOCUST_RECORDS_DIR": str(records_dir),
           "LOCUST_EXPECT_WORKERS": "2", "LOCUST_MASTER_HOST": "127.0.0.1"}  # fmt: skip
    group.start("master", ["sh", str(ENTRYPOINT), "locust-master", "--host", model.url,
                           "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                           "--expect-workers-max-wait", "60", *LOAD], env)  # fmt: skip
    for i in (1, 2):
        group.start(f"worker-{i}", ["sh", str(ENTRYPOINT), "locust-worker",
                                    "--master-port", str(port)], env)  # fmt: skip
    latest = records_dir / "latest"
    wait_for(lambda: (latest / "exit-code").exists(), timeout=90,
             what=f"the master's run folder\n{group.log('master')[-2000:]}")  # fmt: skip
    assert (latest / "exit-code").read_text().strip() == "0", (latest / "locust.log").read_text()
    check_complete(latest, model)
    assert (latest / "locust_stats.csv").exists()
    # the master idles (so the records can be copied out) until the pod is stopped
    assert group.procs["master"].alive()
    assert group.stop("master") == 0
    # a worker reconnects for the next run until SIGTERM, then ends cleanly
    for i in (1, 2):
        assert group.procs[f"worker-{i}"].alive()
        assert group.stop(f"worker-{i}") == 0, group.log(f"worker-{i}")[-2000:]
