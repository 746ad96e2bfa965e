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
import subprocess
import tempfile
from pathlib import Path

import aiohttp
from _overhead import add_load_args, drive, install_uvloop, load_figures, model_args
from _procs import ADMIN, command, launch, pct, stop, wait_healthy, wait_port
from _results import Run


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


# Every benchmark request is one user's (the router keys sessions and pins on it).
BENCH_USER = {"x-user-id": "bench"}


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
    add_load_args(p)
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
            model_port, model_pid = procs.start("model", "canarystack.model", *model_args(args))
            canary_port, _ = procs.start("canary", "canarystack.model", *model_args(args, "v2"))
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
            install_uvloop()
            targets = {
                "direct": model_url + "/v1/completions",
                "routed": router_url + "/v1/completions",
            }
            figures = asyncio.run(
                drive(targets, args, router_pid, hop="router", via="routed", headers=BENCH_USER)
            )
            figures["router_work"] = asyncio.run(router_work(router_url))
        finally:
            procs.stop_all()
        figures["router_pre_forward_ms"] = pre_forward_ms(tmp / "router.log")
    out = {
        "benchmark": "router_overhead",
        "load": load_figures(
            args,
            "each request direct or routed by coin flip, same model server",
            path=args.path,
            canary_weight_pct=args.canary_weight if args.path == "real" else 0.0,
            shadow=args.path == "real",
            gate=args.path == "real",
        ),
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
