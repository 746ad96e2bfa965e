"""Benchmark: what the router adds to TTFT and end-to-end latency, and what it costs in CPU.

Starts a model server per variant, a broker and one router, each as its own process,
stopped by PID at the end. ``--path real`` (the default) is the path users take in a
release: canary v2 at 5 %, shadow copies on, a gate receiving the router's samples — so the
figure includes shadow planning, logprob rewriting and outcome records. ``--path bare``
sets the canary to weight 0 and starts no gate (every unpinned request is relayed to the
one baseline replica): the router's hop alone. Then drives both paths *side by side in the same
run*: every request of each of ``--concurrency`` client workers picks direct-to-model or
through-router by a coin flip, so both see the same model load at the same moments.

Writes ``bench/results/router_overhead.json`` (``--out``; ``_results``): TTFT and
end-to-end p50/p99 direct vs routed and the differences
(routed - direct), streamed requests per path, errors, and router CPU seconds per 1,000
streamed requests (``/proc/PID/stat``, over the measured window). DESIGN.md §4 target:
<= 1 ms p50 and <= 5 ms p99 added TTFT.

    .venv/bin/python bench/router_overhead.py                      # c=16, 64 tokens, 20 s
    .venv/bin/python bench/router_overhead.py --concurrency 64 --duration-s 10

TTFT is the client's time from sending the request to the first SSE event with text.
Loopback only; bounded by ``--duration-s`` (plus warm-up) and ``--max-requests``. This
script must never assert on timings; it reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from _procs import ADMIN, command, cpu_seconds, launch, pct, stop, wait_healthy, wait_port
from _results import Run

from canary_contract.json import JsonObject


class Procs:
    """Component processes of this run, each stopped by its PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.commands: dict[str, str] = {}

    def start(self, name: str, module: str, *args: str) -> tuple[int, int]:
        ready, log = self.tmp / f"{name}.ready.json", self.tmp / f"{name}.log"
        proc = launch(module, args, ready=ready, log=log)
        self.procs.append(proc)
        self.commands[name] = " ".join(command(module, args, ready=ready)[1:])
        return wait_port(proc, ready, log, name), proc.pid

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


async def setup_release(broker_url: str, canary_weight: float) -> None:
    async with aiohttp.ClientSession() as s:
        for version in ("v1", "v2"):
            manifest = {"image": f"model:{version}"}
            raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            body = {"version": version, "manifest": manifest, "digest": digest}
            async with s.post(broker_url + "/v1/versions", json=body, headers=ADMIN) as r:
                assert r.status in (200, 201), await r.text()
        body2 = {
            "name": "default",
            "stable": "v1",
            "canary": "v2",
            "weights": {"canary": canary_weight},
            "actor": "bench",
            "reason": "router overhead bench",
        }
        async with s.post(broker_url + "/v1/releases", json=body2, headers=ADMIN) as r:
            assert r.status == 201, await r.text()


# What the router did besides relaying (its own /metrics): the proof that --path real
# exercised shadow copies, comparisons and gate pushes.
WORK_METRICS = (
    "router_shadow_requests_total",
    "router_shadow_comparisons_total",
    "router_gate_pushes_total",
    "router_samples_dropped_total",
)


async def router_work(router_url: str) -> dict[str, float]:
    totals = dict.fromkeys(WORK_METRICS, 0.0)
    async with aiohttp.ClientSession() as s, s.get(router_url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


async def drive(
    targets: dict[str, str],
    args: argparse.Namespace,
    router_pid: int,
) -> JsonObject:
    body = {
        "model": "default",
        "prompt": " ".join(f"w{i % 97}" for i in range(args.prompt_tokens)),
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    payload = json.dumps(body).encode()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in targets}
    errors = dict.fromkeys(targets, 0)
    rng = random.Random(1)
    t_start = time.monotonic()
    t_measure = t_start + args.warmup_s
    t_end = t_measure + args.duration_s
    cpu: dict[str, float] = {}
    sent = 0

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(path: str, url: str, measured: bool) -> None:
            t0 = time.perf_counter()
            ttft = -1.0
            ok = False
            try:
                async with session.post(
                    url,
                    data=payload,
                    headers={"content-type": "application/json", "x-user-id": "bench"},
                ) as resp:
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
            e2e = time.perf_counter() - t0
            if measured:
                if ok and ttft >= 0:
                    results[path].append((ttft, e2e))
                else:
                    errors[path] += 1

        async def worker() -> None:
            nonlocal sent
            while time.monotonic() < t_end and sent < args.max_requests:
                sent += 1
                path = rng.choice(list(targets))
                measured = time.monotonic() >= t_measure
                await one(path, targets[path], measured)

        async def cpu_marks() -> None:
            await asyncio.sleep(max(0.0, t_measure - time.monotonic()))
            cpu["start"] = cpu_seconds(router_pid)
            cpu["t_start"] = time.monotonic()
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            cpu["end"] = cpu_seconds(router_pid)
            cpu["t_end"] = time.monotonic()

        marks = asyncio.create_task(cpu_marks())
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        if "end" not in cpu:  # stopped early by --max-requests
            marks.cancel()
            cpu["end"] = cpu_seconds(router_pid)
            cpu["t_end"] = time.monotonic()
            cpu.setdefault("start", cpu["end"])

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

    direct, routed = summary("direct"), summary("routed")
    added = {
        k: (
            round(routed[k] - direct[k], 3)
            if routed[k] is not None and direct[k] is not None
            else None
        )
        for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    }
    routed_n = routed["requests"] + routed["errors"]
    cpu_s = cpu["end"] - cpu["start"]
    window_s = cpu["t_end"] - cpu["t_start"]
    return {
        "direct": direct,
        "routed": routed,
        "added_by_router": added,
        "router_cpu_s": round(cpu_s, 3),
        "router_cpu_s_per_1000_streams": round(1000 * cpu_s / routed_n, 3) if routed_n else None,
        "router_cpu_share_of_one_core": round(cpu_s / window_s, 3) if window_s > 0 else None,
        "routed_streams_per_s": round(routed_n / window_s, 1) if window_s > 0 else None,
    }


def pre_forward_ms(log_path: Path) -> dict[str, float | None]:
    """The router's own time from a request's arrival to its first byte relayed, minus the
    upstream's time to first byte (from its per-request log lines): the work the router
    does before forwarding plus its event-loop wait, without the network hop."""
    gaps: list[float] = []
    with contextlib.suppress(OSError):
        for line in log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if ev.get("event") == "request_done" and ev.get("upstream_ttft_s") is not None:
                    gaps.append(float(ev["ttft_s"]) - float(ev["upstream_ttft_s"]))
    return {
        "p50": None if not gaps else round(1000 * (pct(gaps, 0.5) or 0.0), 3),
        "p99": None if not gaps else round(1000 * (pct(gaps, 0.99) or 0.0), 3),
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
    p.add_argument("--router-arg", action="append", default=[], help="extra router flag(s)")
    p.add_argument(
        "--path",
        choices=("real", "bare"),
        default="real",
        help="real: 5%% canary, shadow on, gate on (default); bare: canary 0, no gate",
    )
    p.add_argument("--canary-weight", type=float, default=5.0, help="percent, --path real")
    p.add_argument("--out", type=Path, default=None, help="results file")
    args = p.parse_args()
    run = Run("router_overhead")
    if args.concurrency < 1 or args.duration_s <= 0 or args.max_requests < 1:
        raise SystemExit("--concurrency, --duration-s and --max-requests must be positive")

    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp_s:
        tmp = Path(tmp_s)
        procs = Procs(tmp)
        try:
            model_args = [
                "--version", "v1",
                "--ttft-base-ms", str(args.ttft_base_ms),
                "--itl-ms", str(args.itl_ms),
                "--itl-jitter", "0",
                "--slots", "256",
            ]  # fmt: skip
            model_port, model_pid = procs.start("model", "canarystack.model", *model_args)
            canary_port, _ = procs.start(
                "canary", "canarystack.model", *model_args[:1], "v2", *model_args[2:]
            )
            broker_port, broker_pid = procs.start(
                "broker", "canarystack.broker", "--state-dir", str(tmp / "broker")
            )
            broker_url = f"http://127.0.0.1:{broker_port}"
            asyncio.run(wait_healthy(broker_url, "broker"))
            real = args.path == "real"
            asyncio.run(setup_release(broker_url, args.canary_weight if real else 0.0))
            gate_args: list[str] = []
            if real:
                gate_port, _ = procs.start("gate", "canarystack.gate", "--broker", broker_url)
                asyncio.run(wait_healthy(f"http://127.0.0.1:{gate_port}", "gate"))
                gate_args = ["--gate", f"http://127.0.0.1:{gate_port}"]
            else:
                gate_args = ["--no-shadow"]
            router_port, router_pid = procs.start(
                "router",
                "canarystack.router",
                "--router-id", "bench-router",
                "--broker", broker_url,
                "--baseline", f"http://127.0.0.1:{model_port}",
                "--canary", f"http://127.0.0.1:{canary_port}",
                "--state-dir", str(tmp),
                *gate_args,
                *args.router_arg,
            )  # fmt: skip
            model_url = f"http://127.0.0.1:{model_port}"
            router_url = f"http://127.0.0.1:{router_port}"
            for url, name in ((model_url, "model"), (router_url, "router")):
                asyncio.run(wait_healthy(url, name))
            try:
                import uvloop

                uvloop.install()
            except ImportError:  # pragma: no cover
                pass
            targets = {
                "direct": model_url + "/v1/completions",
                "routed": router_url + "/v1/completions",
            }
            figures = asyncio.run(drive(targets, args, router_pid))
            figures["router_work"] = asyncio.run(router_work(router_url))
        finally:
            procs.stop_all()
        figures["router_pre_forward_ms"] = pre_forward_ms(tmp / "router.log")
    out = {
        "benchmark": "router_overhead",
        "load": {
            "concurrency": args.concurrency,
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "max_tokens": args.max_tokens,
            "prompt_tokens": args.prompt_tokens,
            "mix": "each request direct or routed by coin flip, same model server",
            "path": args.path,
            "canary_weight_pct": args.canary_weight if args.path == "real" else 0.0,
            "shadow": args.path == "real",
            "gate": args.path == "real",
            "model_ttft_base_ms": args.ttft_base_ms,
            "model_itl_ms": args.itl_ms,
        },
        **figures,
        "target": {"added_ttft_p50_ms": 1.0, "added_ttft_p99_ms": 5.0},
        "cpu_count": os.cpu_count(),
        "commands": procs.commands,
        "pids": {"model": model_pid, "broker": broker_pid, "router": router_pid},
    }
    print(json.dumps(out, indent=2))
    run.write(out, args.out)


if __name__ == "__main__":
    main()
