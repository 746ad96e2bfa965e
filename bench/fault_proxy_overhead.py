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
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _procs import ROOT, cpu_seconds, launch, pct, stop, wait_healthy, wait_port
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


async def drive(targets: dict[str, str], args: argparse.Namespace, proxy_pid: int) -> JsonObject:
    body = {
        "model": "default",
        "prompt": " ".join(f"w{i % 97}" for i in range(args.prompt_tokens)),
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in targets}
    errors = dict.fromkeys(targets, 0)
    rng = random.Random(1)
    t_measure = time.monotonic() + args.warmup_s
    t_end = t_measure + args.duration_s
    cpu: dict[str, float] = {}
    sent = 0

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(path: str, measured: bool) -> None:
            t0 = time.perf_counter()
            ttft = -1.0
            ok = False
            try:
                async with session.post(targets[path], json=body) as resp:
                    if resp.status == 200:
                        tail = b""
                        async for chunk in resp.content.iter_any():
                            if ttft < 0 and b'"text"' in chunk:
                                ttft = time.perf_counter() - t0
                            tail = (tail + chunk)[-32:]
                        ok = tail.rstrip().endswith(b"[DONE]")
                    else:
                        await resp.read()
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            if measured:
                if ok and ttft >= 0:
                    results[path].append((ttft, time.perf_counter() - t0))
                else:
                    errors[path] += 1

        async def worker() -> None:
            nonlocal sent
            while time.monotonic() < t_end and sent < args.max_requests:
                sent += 1
                await one(rng.choice(list(targets)), time.monotonic() >= t_measure)

        async def cpu_marks() -> None:
            await asyncio.sleep(max(0.0, t_measure - time.monotonic()))
            cpu["start"], cpu["t_start"] = cpu_seconds(proxy_pid), time.monotonic()
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            cpu["end"], cpu["t_end"] = cpu_seconds(proxy_pid), time.monotonic()

        marks = asyncio.create_task(cpu_marks())
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        if "end" not in cpu:  # stopped early by --max-requests
            marks.cancel()
            cpu["end"], cpu["t_end"] = cpu_seconds(proxy_pid), time.monotonic()
            cpu.setdefault("start", cpu["end"])
            cpu.setdefault("t_start", cpu["t_end"])

    def ms(values: list[float], q: float) -> float | None:
        v = pct(values, q)
        return None if v is None else round(v * 1000.0, 3)

    def summary(path: str) -> JsonObject:
        ttfts = [t for t, _ in results[path]]
        e2es = [e for _, e in results[path]]
        return {
            "requests": len(results[path]),
            "errors": errors[path],
            "ttft_p50_ms": ms(ttfts, 0.5),
            "ttft_p99_ms": ms(ttfts, 0.99),
            "e2e_p50_ms": ms(e2es, 0.5),
            "e2e_p99_ms": ms(e2es, 0.99),
        }

    direct, proxied = summary("direct"), summary("proxied")
    added: JsonObject = {}
    for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
        a, b = proxied[k], direct[k]
        added[k] = round(a - b, 3) if isinstance(a, float) and isinstance(b, float) else None
    n = int(proxied["requests"] or 0) + int(proxied["errors"] or 0)
    cpu_s = cpu["end"] - cpu["start"]
    window_s = cpu["t_end"] - cpu["t_start"]
    return {
        "direct": direct,
        "proxied": proxied,
        "added_by_proxy": added,
        "proxy_cpu_s": round(cpu_s, 3),
        "proxy_cpu_s_per_1000_streams": round(1000 * cpu_s / n, 3) if n else None,
        "proxy_cpu_share_of_one_core": round(cpu_s / window_s, 3) if window_s > 0 else None,
        "proxied_streams_per_s": round(n / window_s, 1) if window_s > 0 else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--max-requests", type=int, default=50_000)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per streamed answer")
    p.add_argument("--prompt-tokens", type=int, default=100)
    p.add_argument("--ttft-base-ms", type=float, default=20.0, help="model server TTFT floor")
    p.add_argument("--itl-ms", type=float, default=2.0, help="model server decode time/token")
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
            model_args = [
                "--version", "v1",
                "--ttft-base-ms", str(args.ttft_base_ms),
                "--itl-ms", str(args.itl_ms),
                "--itl-jitter", "0",
                "--slots", "256",
            ]  # fmt: skip
            ready, log = tmp / "model.ready.json", tmp / "model.log"
            model = launch("canarystack.model", model_args, ready=ready, log=log)
            procs.append(model)
            model_url = f"http://127.0.0.1:{wait_port(model, ready, log, 'model')}"
            asyncio.run(wait_healthy(model_url, "model"))
            proxy, proxy_port, proxy_cmd = start_proxy(tmp, model_url)
            procs.append(proxy)
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            asyncio.run(wait_healthy(proxy_url, "proxy (its upstream's /health)"))
            try:
                import uvloop

                uvloop.install()
            except ImportError:  # pragma: no cover
                pass
            targets = {
                "direct": model_url + "/v1/completions",
                "proxied": proxy_url + "/v1/completions",
            }
            figures = asyncio.run(drive(targets, args, proxy.pid))
        finally:
            for proc in reversed(procs):
                stop(proc)
    out: JsonObject = {
        "benchmark": "fault_proxy_overhead",
        "load": {
            "concurrency": args.concurrency,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "max_tokens": args.max_tokens,
            "prompt_tokens": args.prompt_tokens,
            "mix": "each request direct or through the proxy by coin flip, same model server",
            "faults_active": 0,
            "model_ttft_base_ms": args.ttft_base_ms,
            "model_itl_ms": args.itl_ms,
        },
        **figures,
        "cpu_count": os.cpu_count(),
        "proxy_command": " ".join(proxy_cmd),
    }
    print(json.dumps(out, indent=2))
    run.write(out, args.out)


if __name__ == "__main__":
    main()
