"""Benchmark: what one Locust process (locustfiles/llm.py) sustains, next to plain asyncio.

Starts one bare model server (``python -m canarystack.model``, fast settings so that the
client is the bottleneck; stopped by its PID at the end). Then, for each concurrency
level, in the same run and against the same server, it drives:

- ``locust``: one Locust process through ``gameday.load.runner`` (the real users, the
  real records), ``users = concurrency``, closed loop;
- ``aiohttp``: a plain aiohttp (+ uvloop when installed) client in its own process, the
  same prompts, the same concurrency, measuring TTFT the same way (first content event).

For each it prints the streamed requests/s and content chunks/s it sustained, the
client's CPU seconds (``RUSAGE_CHILDREN`` of the reaped client process), and its TTFT
bias: client TTFT minus the server's own ``request_done`` ``ttft_s``, joined on
``x-request-id``. One JSON object on stdout; bounded by ``--duration-s`` per phase.

    .venv/bin/python bench/load_capacity.py                      # levels 16,32,64, 6 s each
    .venv/bin/python bench/load_capacity.py --levels 16 --duration-s 10

Loopback only. This script never asserts on timings; it reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _procs import ROOT, cpu_seconds, launch, pct, stop, wait_port
from _results import Run

from canary_contract.json import JsonObject

sys.path.insert(0, str(ROOT))

from gameday.load.prompts import SyntheticMix
from gameday.load.runner import LoadConfig, LoadRun
from gameday.load.sse import SSEDecoder, StreamMeasurement

SERVER_ARGS = ("--ttft-base-ms", "5", "--prefill-ms-per-1k", "2", "--itl-ms", "2", "--slots", "256")
MAX_TOKENS = 64


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    ready, log = tmp / "model.ready.json", tmp / "model.log"
    proc = launch("canarystack.model", ["--version", "v1", *SERVER_ARGS], ready=ready, log=log)
    return proc, f"http://127.0.0.1:{wait_port(proc, ready, log, 'model server')}", log


def server_ttfts(log: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            e = json.loads(line)
            if e.get("event") == "request_done" and e.get("ttft_s") is not None:
                out[str(e["request_id"])] = float(e["ttft_s"])
    return out


def summarize(rows: list[JsonObject], server: dict[str, float], cpu_s: float) -> JsonObject:
    ok = [r for r in rows if r["ok"]]
    if not ok:
        return {"requests": len(rows), "errors": len(rows)}
    t0 = min(r["start_time"] for r in ok)
    t1 = max(r["start_time"] + r["e2e_s"] for r in ok)
    wall = max(t1 - t0, 1e-9)
    bias = [(r["ttft_s"] - server[r["request_id"]]) * 1000 for r in ok if r["request_id"] in server]
    ttft = [r["ttft_s"] * 1000 for r in ok]
    chunks = sum(int(r["completion_tokens"] or 0) for r in ok)
    return {
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(ok) / wall, 1),
        "chunks_per_s": round(chunks / wall, 0),
        "ttft_ms": {"p50": _r(pct(ttft, 0.5)), "p99": _r(pct(ttft, 0.99))},
        "ttft_bias_ms": {
            "matched": len(bias),
            "p50": _r(pct(bias, 0.5)),
            "p90": _r(pct(bias, 0.9)),
            "p99": _r(pct(bias, 0.99)),
        },
        "client_cpu_s": round(cpu_s, 2),
        "client_cpu_share": round(cpu_s / wall, 2),
        "client_cpu_ms_per_request": round(cpu_s * 1000 / max(1, len(rows)), 2),
        # what one core could drive if the server kept up (CPU per request only)
        "est_requests_per_s_per_client_core": round(len(rows) / cpu_s, 0) if cpu_s > 0 else None,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def run_locust(url: str, users: int, duration_s: float, out: Path, log: Path) -> JsonObject:
    import pandas as pd

    cpu0 = children_cpu_s()
    config = LoadConfig(
        host=url, output_dir=out, users=users, spawn_rate=users, duration_s=duration_s,
        stop_timeout_s=10, max_tokens=MAX_TOKENS, csv=False,
    )  # fmt: skip
    run = LoadRun(config).start()
    assert run.pid is not None
    startup_cpu = cpu_seconds(run.pid)  # imports and set-up are not load-generation cost
    run.wait(duration_s + 60)
    cpu = children_cpu_s() - cpu0 - startup_cpu
    df = pd.read_parquet(out / "records.parquet")
    rows = df.to_dict(orient="records")
    return summarize(rows, server_ttfts(log), cpu)


# --- the plain asyncio client (runs in its own process) ------------------------------


async def _aiohttp_client(url: str, users: int, duration_s: float, out: str) -> None:
    import aiohttp

    mix = SyntheticMix(max_tokens_cap=MAX_TOKENS)
    rows: list[JsonObject] = []
    deadline = time.monotonic() + duration_s
    counter = iter(range(10**9))

    async def one(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            req = mix.request(next(counter))
            rid = uuid.uuid4().hex
            body = {
                "model": "default", "prompt": req.completion_prompt(), "max_tokens": req.max_tokens,
                "stream": True, "stream_options": {"include_usage": True},
            }  # fmt: skip
            start = time.time()
            t_sent = time.perf_counter()
            m = StreamMeasurement(t_sent=t_sent)
            dec = SSEDecoder()
            ok = False
            try:
                async with session.post(url + "/v1/completions", json=body,
                                        headers={"x-request-id": rid}) as resp:  # fmt: skip
                    async for line in resp.content:
                        payload = dec.feed_line(line)
                        if payload is not None:
                            m.on_payload(payload, time.perf_counter())
                    ok = resp.status == 200 and m.error_kind()[0] is None
            except aiohttp.ClientError:
                ok = False
            e2e = time.perf_counter() - t_sent
            rows.append({"request_id": rid, "start_time": start, "e2e_s": e2e, "ok": ok,
                         "ttft_s": m.ttft_s, "completion_tokens": m.completion_tokens})  # fmt: skip

    def self_cpu_s() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    cpu0 = self_cpu_s()  # imports and set-up are not load-generation cost
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await asyncio.gather(*(one(session) for _ in range(users)))
    Path(out).write_text(json.dumps({"rows": rows, "cpu_s": self_cpu_s() - cpu0}))


def aiohttp_main(argv: list[str]) -> None:
    url, users, duration_s, out = argv[0], int(argv[1]), float(argv[2]), argv[3]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_aiohttp_client(url, users, duration_s, out))


def run_aiohttp(url: str, users: int, duration_s: float, out: Path, log: Path) -> JsonObject:
    out.mkdir(parents=True, exist_ok=True)
    result = out / "rows.json"
    cmd = [sys.executable, __file__, "--aiohttp-client", url, str(users), str(duration_s)]
    subprocess.run([*cmd, str(result)], check=True, timeout=duration_s + 60)
    data = json.loads(result.read_text())
    return summarize(data["rows"], server_ttfts(log), data["cpu_s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--aiohttp-client":
        aiohttp_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="16,32,64", help="concurrency levels (users)")
    p.add_argument("--duration-s", type=float, default=6.0, help="seconds per phase")
    args = p.parse_args()
    run = Run("load_capacity")
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="load-capacity-") as tmp_name:
        tmp = Path(tmp_name)
        server, url, log = start_server(tmp)
        try:
            results = []
            for users in levels:
                level: JsonObject = {"users": users}
                level["locust"] = run_locust(
                    url, users, args.duration_s, tmp / f"locust-{users}", log
                )
                level["aiohttp"] = run_aiohttp(
                    url, users, args.duration_s, tmp / f"aio-{users}", log
                )
                results.append(level)
        finally:
            stop(server, grace_s=10)
    figures = {
        "bench": "load_capacity",
        "cpus": os.cpu_count(),
        "server_args": list(SERVER_ARGS),
        "max_tokens": MAX_TOKENS,
        "prompt_mix": "synthetic (defaults)",
        "duration_s_per_phase": args.duration_s,
        "levels": results,
        "best_requests_per_s": {
            c: max(lv[c].get("requests_per_s", 0) for lv in results) for c in ("locust", "aiohttp")
        },
    }
    print(json.dumps(figures, indent=2))
    run.write(figures)


if __name__ == "__main__":
    main()
