"""Benchmark: how many streamed requests/s one model-server process sustains, and what
they cost it in CPU.

Starts one ``python -m canarystack.model`` process (stopped by its PID at the end),
drives it with a plain aiohttp + uvloop client at a fixed concurrency for a bounded time,
and prints one JSON object: streamed requests/s, server CPU seconds per 1,000 streamed
requests (from ``/proc/PID/stat``), TTFT percentiles seen by the client, and the exact
command lines. Loopback only.

    .venv/bin/python bench/model_server.py --concurrency 16 --duration-s 20
    .venv/bin/python bench/model_server.py --concurrency 64 -- --slots 256 --itl-ms 1

Arguments after ``--`` go to the model server. This script must never assert on
timings; it reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _procs import cpu_seconds, launch, pct, stop, wait_port
from _results import Run

from canary_contract.json import JsonObject


def make_prompt(n_tokens: int) -> str:
    # Mirrors canarystack.tokenizer.make_prompt's contract (n words = n tokens) without
    # importing the system under test into the client.
    return " ".join(f"w{i % 97}" for i in range(n_tokens))


async def drive(
    url: str, concurrency: int, warmup_s: float, duration_s: float, body: JsonObject, pid: int
) -> JsonObject:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    done: list[tuple[float, float, int, float]] = []  # (finish time, ttft_s, events, e2e_s)
    errors = 0
    t_start = time.monotonic()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal errors
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                ttft = -1.0
                events = 0
                ok = False
                try:
                    async with session.post(url, json=body) as resp:
                        if resp.status != 200:
                            errors += 1
                            await resp.read()
                            continue
                        buf = b""
                        async for chunk in resp.content.iter_any():
                            buf += chunk
                            while b"\n\n" in buf:
                                event, buf = buf.split(b"\n\n", 1)
                                if event == b"data: [DONE]":
                                    ok = True
                                elif b'"text":"' in event:
                                    if ttft < 0:
                                        ttft = time.monotonic() - t0
                                    events += 1
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if ok:
                    now = time.monotonic()
                    done.append((now, ttft, events, now - t0))
                else:
                    errors += 1

        cpu_at: dict[str, float] = {}

        async def sample_cpu() -> None:
            await asyncio.sleep(max(0.0, t_measure - time.monotonic()))
            cpu_at["start"] = cpu_seconds(pid)
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            cpu_at["end"] = cpu_seconds(pid)

        client_cpu0 = time.process_time()
        await asyncio.gather(sample_cpu(), *(worker() for _ in range(concurrency)))
        client_cpu = time.process_time() - client_cpu0

    measured = [d for d in done if t_measure <= d[0] < t_end]
    server_cpu = cpu_at["end"] - cpu_at["start"]
    n = len(measured)
    ttfts = [d[1] for d in measured]
    return {
        "streamed_requests_per_s": round(n / duration_s, 1),
        "server_cpu_s_per_1000_requests": round(1000 * server_cpu / n, 3) if n else None,
        "server_cpu_util_cores": round(server_cpu / duration_s, 3),
        "client_cpu_util_cores": round(client_cpu / (time.monotonic() - t_start), 3),
        "requests_measured": n,
        "errors": errors,
        "content_events_per_request": round(sum(d[2] for d in measured) / n, 2) if n else None,
        "client_ttft_ms_p50": round(1000 * (pct(ttfts, 0.5) or 0), 2),
        "client_ttft_ms_p99": round(1000 * (pct(ttfts, 0.99) or 0), 2),
        "client_e2e_ms_p50": round(1000 * (pct([d[3] for d in measured], 0.5) or 0), 1),
    }


def start_server(server_args: list[str], tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    ready, log = tmp / "ready.json", tmp / "model.log"
    proc = launch("canarystack.model", server_args, ready=ready, log=log)
    return proc, wait_port(proc, ready, log, "model server", timeout_s=20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=20.0, help="measured window (max 120)")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--endpoint", choices=["completions"], default="completions")
    p.add_argument("server_args", nargs="*", help="after --: options for the model server")
    args = p.parse_args()
    if not (0 < args.duration_s <= 120) or not (1 <= args.concurrency <= 512):
        p.error("--duration-s must be in (0, 120] and --concurrency in [1, 512]")
    run = Run("model_server")

    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmpdir:
        proc, port = start_server(args.server_args, Path(tmpdir))
        try:
            body = {
                "prompt": make_prompt(args.prompt_tokens),
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
            }
            with contextlib.suppress(ImportError):
                import uvloop

                asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            result = asyncio.run(
                asyncio.wait_for(
                    drive(
                        f"http://127.0.0.1:{port}/v1/completions",
                        args.concurrency,
                        args.warmup_s,
                        args.duration_s,
                        body,
                        proc.pid,
                    ),
                    timeout=args.warmup_s + args.duration_s + 90,
                )
            )
        finally:
            stop(proc)
    figures = {
        "benchmark": "model_server",
        "command": shlex.join([sys.executable, *sys.argv]),
        "server_command": shlex.join(["python", "-m", "canarystack.model", *args.server_args]),
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "max_tokens": args.max_tokens,
        "prompt_tokens": args.prompt_tokens,
        "cpus": os.cpu_count(),
        **result,
    }
    print(json.dumps(figures, indent=2))
    run.write(figures)


if __name__ == "__main__":
    main()
