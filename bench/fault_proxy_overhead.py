"""Benchmark: what the fault proxy (``python -m gameday.faultproxy``) adds to TTFT and
end-to-end latency with no fault active, and what it costs in CPU.

Starts a model server (the simulator) and the proxy in front of it, each its own process,
stopped by PID at the end. Then drives both paths *side by side in the same run*: every
request of each of ``--concurrency`` client workers goes direct to the model or through
the proxy by a coin flip, so both see the same model load at the same moments.

Writes ``bench/results/fault_proxy_overhead.json`` (``--out``; ``_results``): TTFT and
end-to-end p50/p99 direct vs proxied and the differences (proxied - direct), requests per
path, errors, and proxy CPU seconds per 1,000 streams (``/proc/PID/stat``, over the
measured window).

    .venv/bin/python bench/fault_proxy_overhead.py                  # c=16, 64 tokens, 20 s

TTFT is the client's time from sending the request to the first SSE event with text.
Loopback only; bounded by ``--duration-s`` plus ``--warmup-s`` (at most 30 s together) and
``--max-requests``. This script must never assert on timings; it reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _overhead import add_load_args, drive, install_uvloop, load_figures, model_args
from _procs import ROOT, launch, stop, wait_healthy, wait_port
from _results import Run

from canary_contract.json import JsonObject

MAX_WALL_S = 30.0
PROXY_TOKEN = "bench-proxy-token"


def start_proxy(tmp: Path, upstream: str) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    token, ready, log = tmp / "proxy.token", tmp / "proxy.ready.json", tmp / "proxy.log"
    token.write_text(PROXY_TOKEN)
    cmd = [
        sys.executable, "-m", "gameday.faultproxy",
        "--upstream", upstream,
        "--listen", "127.0.0.1:0",
        "--token-file", str(token),
        "--ready-file", str(ready),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, wait_port(proc, ready, log, "fault proxy"), cmd[1:]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_load_args(p)
    p.add_argument("--out", type=Path, default=None, help="results file")
    args = p.parse_args()
    if args.concurrency < 1 or args.duration_s <= 0 or args.max_requests < 1:
        raise SystemExit("--concurrency, --duration-s and --max-requests must be positive")
    if args.duration_s + args.warmup_s > MAX_WALL_S:
        raise SystemExit(
            f"--duration-s {args.duration_s:g} + --warmup-s {args.warmup_s:g} is over "
            f"{MAX_WALL_S:g} s: this benchmark is bounded; shorten one of them."
        )
    run = Run("fault_proxy_overhead")
    with tempfile.TemporaryDirectory(prefix="fault-proxy-bench-") as tmp_s:
        tmp = Path(tmp_s)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ready, log = tmp / "model.ready.json", tmp / "model.log"
            model = launch("canarystack.model", model_args(args), ready=ready, log=log)
            procs.append(model)
            model_url = f"http://127.0.0.1:{wait_port(model, ready, log, 'model')}"
            asyncio.run(wait_healthy(model_url, "model"))
            proxy, proxy_port, proxy_cmd = start_proxy(tmp, model_url)
            procs.append(proxy)
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            asyncio.run(wait_healthy(proxy_url, "proxy (its upstream's /health)"))
            install_uvloop()
            targets = {
                "direct": model_url + "/v1/completions",
                "proxied": proxy_url + "/v1/completions",
            }
            figures = asyncio.run(drive(targets, args, proxy.pid, hop="proxy", via="proxied"))
        finally:
            for proc in reversed(procs):
                stop(proc)
    out: JsonObject = {
        "benchmark": "fault_proxy_overhead",
        "load": load_figures(
            args,
            "each request direct or through the proxy by coin flip, same model server",
            faults_active=0,
        ),
        **figures,
        "cpu_count": os.cpu_count(),
        "proxy_command": " ".join(proxy_cmd),
    }
    print(json.dumps(out, indent=2))
    run.write(out, args.out)


if __name__ == "__main__":
    main()
