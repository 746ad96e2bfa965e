"""What the two hop-overhead benchmarks share (``router_overhead``, ``fault_proxy_overhead``):
their load flags, the model server they start, and the side-by-side drive that measures
one hop (the router, the fault proxy) against going direct to the model.

Imported as ``_overhead`` (``bench/`` is first on ``sys.path`` when a benchmark runs as a
script). Like ``_procs`` it must never import the system under test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Mapping

import aiohttp
from _procs import cpu_seconds, pct

from canary_contract.json import JsonObject, JsonValue

QUANTILES = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def add_load_args(p: argparse.ArgumentParser) -> None:
    """The client load and the model server's speed, the same in both benchmarks."""
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--max-requests", type=int, default=50_000)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per streamed answer")
    p.add_argument("--prompt-tokens", type=int, default=100)
    p.add_argument("--ttft-base-ms", type=float, default=20.0, help="model server TTFT floor")
    p.add_argument("--itl-ms", type=float, default=2.0, help="model server decode time/token")


def model_args(args: argparse.Namespace, version: str = "v1") -> list[str]:
    """The model server's flags: ``version``, the load's TTFT floor and decode time, no
    jitter, room for every stream."""
    return [
        "--version", version,
        "--ttft-base-ms", str(args.ttft_base_ms),
        "--itl-ms", str(args.itl_ms),
        "--itl-jitter", "0",
        "--slots", "256",
    ]  # fmt: skip


def load_figures(args: argparse.Namespace, mix: str, **more: JsonValue) -> JsonObject:
    """The load a run drove (its ``"load"`` in the results file): the flags of
    ``add_load_args``, how requests were split (``mix``), then ``more``."""
    return {
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "max_tokens": args.max_tokens,
        "prompt_tokens": args.prompt_tokens,
        "mix": mix,
        **more,
        "model_ttft_base_ms": args.ttft_base_ms,
        "model_itl_ms": args.itl_ms,
    }


def install_uvloop() -> None:
    """The client's event loop: uvloop where it is installed."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass


async def drive(
    targets: Mapping[str, str],
    args: argparse.Namespace,
    hop_pid: int,
    *,
    hop: str,
    via: str,
    headers: Mapping[str, str] | None = None,
) -> JsonObject:
    """Every request of each of ``--concurrency`` workers goes to ``targets["direct"]`` or
    ``targets[via]`` by a coin flip, for ``--warmup-s`` and then the measured
    ``--duration-s`` (or ``--max-requests``): TTFT and end-to-end p50/p99 per path, what
    the hop added, and the hop's CPU (``hop_pid``) over the measured window, its keys
    named after ``hop`` ("router") and ``via`` ("routed")."""
    body = {
        "model": "default",
        "prompt": " ".join(f"w{i % 97}" for i in range(args.prompt_tokens)),
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    payload = json.dumps(body).encode()
    send_headers = {"content-type": "application/json", **(headers or {})}
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
                async with session.post(targets[path], data=payload, headers=send_headers) as resp:
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
            cpu["start"], cpu["t_start"] = cpu_seconds(hop_pid), time.monotonic()
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            cpu["end"], cpu["t_end"] = cpu_seconds(hop_pid), time.monotonic()

        marks = asyncio.create_task(cpu_marks())
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        if "end" not in cpu:  # stopped early by --max-requests
            marks.cancel()
            cpu["end"], cpu["t_end"] = cpu_seconds(hop_pid), time.monotonic()
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

    direct, hopped = summary("direct"), summary(via)
    added: JsonObject = {}
    for k in QUANTILES:
        a, b = hopped[k], direct[k]
        added[k] = round(a - b, 3) if isinstance(a, float) and isinstance(b, float) else None
    n = len(results[via]) + errors[via]
    cpu_s = cpu["end"] - cpu["start"]
    window_s = cpu["t_end"] - cpu["t_start"]
    return {
        "direct": direct,
        via: hopped,
        f"added_by_{hop}": added,
        f"{hop}_cpu_s": round(cpu_s, 3),
        f"{hop}_cpu_s_per_1000_streams": round(1000 * cpu_s / n, 3) if n else None,
        f"{hop}_cpu_share_of_one_core": round(cpu_s / window_s, 3) if window_s > 0 else None,
        f"{via}_streams_per_s": round(n / window_s, 1) if window_s > 0 else None,
    }
