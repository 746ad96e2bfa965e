"""Benchmark: the CPU an experiment's default load costs on this machine, and what is left.

Starts a local stack (``gameday stack up`` in a temporary state folder, a free base port;
stopped by its supervisord PID at the end) and, for each user count, runs the load the
experiments run (``probes.load`` defaults: synthetic mixed-length prompts, spawn rate =
users, ``max_tokens`` 48, oracle pairs straight to one model server of each variant) for
``--duration-s``. Meanwhile it reads the CPU seconds of every stack process and of Locust
(``psutil``, by PID) and the machine's idle time.

For each user count it prints: requests/s, baseline TTFT p50/p99 (from the records),
cores used by the stack, by Locust, in all, the machine's cores and its idle share, and
the share of long (>= 2048-token) prompts. One JSON object on stdout.

    .venv/bin/python bench/gameday_load.py                    # 8,12,16 users, 20 s each
    .venv/bin/python bench/gameday_load.py --users 12 --duration-s 30

Loopback only; bounded in time. It never asserts on timings; it reports them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import psutil

from canary_contract.json import JsonObject

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import Run  # noqa: E402

from gameday.load.runner import LoadConfig, LoadRun  # noqa: E402
from gameday.stack import stack_down, stack_status, stack_up  # noqa: E402

STACK_OFFSETS = (0, 1, 2, 3, 11, 12, 20, 21, 30)


def free_base_port() -> int:
    for base in range(21000, 60000, 50):
        ok = True
        for off in STACK_OFFSETS:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + off))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free base port")


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def one_level(status: JsonObject, users: int, duration_s: float, out: Path) -> JsonObject:
    stack_pids = [int(c["pid"]) for c in status["components"] if c.get("pid")]
    comps = {c["name"]: c for c in status["components"]}
    oracle = [
        "--oracle-baseline-host",
        comps["model-baseline-0"]["url"],
        "--oracle-canary-host",
        comps["model-canary-0"]["url"],
    ]
    config = LoadConfig(
        host=status["router_url"],
        output_dir=out,
        users=users,
        spawn_rate=float(users),
        max_tokens=48,
        duration_s=duration_s + 60,
        stop_timeout_s=10,
        oracle=True,
        extra_args=oracle,
    )
    run = LoadRun(config).start()
    assert run.pid is not None
    time.sleep(2.0)  # past the spawn
    idle0, t0 = psutil.cpu_times().idle, time.monotonic()
    stack0, locust0 = cpu_s(stack_pids), cpu_s([run.pid])
    time.sleep(duration_s)
    wall = time.monotonic() - t0
    stack1, locust1 = cpu_s(stack_pids), cpu_s([run.pid])
    idle1 = psutil.cpu_times().idle
    t_end = time.time()
    result = run.stop()
    import pyarrow.parquet as pq

    rec = pq.read_table(result.records_path).to_pandas()
    window = rec[rec["start_time"] <= t_end]
    base = window[(window["served_by"] == "baseline") & window["ok"]]
    ncpu = psutil.cpu_count() or 1
    stack_cores = (stack1 - stack0) / wall
    locust_cores = (locust1 - locust0) / wall
    return {
        "users": users,
        "requests_per_s": round(len(window) / (wall + 2.0), 1),
        "failed": int((~rec["ok"]).sum()),
        "long_prompt_share": round(float((rec["prompt_tokens"] >= 2048).mean()), 3),
        "baseline_ttft_p50_s": round(float(base["ttft_s"].quantile(0.5)), 4),
        "baseline_ttft_p99_s": round(float(base["ttft_s"].quantile(0.99)), 4),
        "stack_cores": round(stack_cores, 2),
        "locust_cores": round(locust_cores, 2),
        "total_cores": round(stack_cores + locust_cores, 2),
        "machine_cores": ncpu,
        "machine_idle_share": round((idle1 - idle0) / wall / ncpu, 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", default="8,12,16", help="user counts, comma-separated")
    p.add_argument("--duration-s", type=float, default=20.0)
    args = p.parse_args()
    run = Run("gameday_load")
    levels = [int(x) for x in args.users.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="gameday-bench-"))
    state_dir = work / "stack"
    results = []
    try:
        stack_up(state_dir, ["--base-port", str(free_base_port())])
        status: JsonObject = dict(stack_status(state_dir) or {})
        for users in levels:
            results.append(one_level(status, users, args.duration_s, work / f"u{users}"))
    finally:
        stack_down(state_dir)
        shutil.rmtree(work, ignore_errors=True)
    figures = {"duration_s": args.duration_s, "levels": results}
    print(json.dumps(figures, indent=2))
    run.write(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
