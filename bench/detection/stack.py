"""The stack the detection benchmark measures, each part its own process (stopped by PID):
a broker, two baseline model servers (v1), one canary model server, two routers sharing
one port (SO_REUSEPORT) with shadow sampling at their defaults, the gate and the rollback
executor at their defaults. Every model server runs with the calibrated batch noise and a
seed of its own, as every game-day stack does (``canarystack.cluster.spec``), so the gate
calibrates against a noise floor > 0 exactly as in a game day.

The routers push their samples through a *tap* in this process (a real HTTP hop that
records every batch and forwards it to the gate), so the stream the gate saw can be
replayed by the reference rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from _procs import TOKEN, launch, port_if_ready, stop, wait_healthy
from aiohttp import web

from canary_contract import strictjson
from canary_contract.json import JsonObject
from canarystack.broker.client import BrokerClient
from canarystack.model.engine import BATCH_NOISE_KL

RELEASE = "default"
ROUTERS = ("router-0", "router-1")
BASELINES = ("baseline-0", "baseline-1")
START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """Component processes of this run, each stopped by its PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.args: dict[str, tuple[str, tuple[str, ...]]] = {}

    async def start(self, name: str, module: str, *args: str, port: int = 0) -> int:
        ready, log = self.tmp / f"{name}.ready.json", self.tmp / f"{name}.log"
        proc = launch(module, args, ready=ready, log=log, port=port, append=True)
        self.procs[name] = proc
        self.args[name] = (module, tuple(args))
        deadline = time.monotonic() + START_TIMEOUT_S
        while (bound := port_if_ready(proc, ready, log, name, deadline)) is None:
            await asyncio.sleep(0.05)  # the event loop keeps serving the tap meanwhile
        self.ports[name] = bound
        await wait_healthy(self.url(name), name)
        return bound

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def kill(self, name: str) -> None:
        """SIGKILL by PID (a crash, not a shutdown)."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    async def restart(self, name: str, *new_args: str) -> None:
        """SIGTERM (then SIGKILL) by PID, and start again on the same port."""
        stop(self.procs[name])
        module, args = self.args[name]
        await self.start(name, module, *(new_args or args), port=self.ports[name])

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            stop(self.procs[name])


Batches = list[tuple[float, JsonObject]]


@dataclass
class Tap:
    """Records every sample batch (arrival time, body) and forwards it to the gate."""

    gate_url: str = ""
    batches: Batches = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        arrived = time.time()
        with contextlib.suppress(ValueError):
            doc = strictjson.loads(raw)
            if isinstance(doc, dict):
                self.batches.append((arrived, doc))
        assert self.session is not None
        headers = {
            "Authorization": request.headers.get("Authorization", ""),
            "content-type": "application/json",
        }
        try:
            async with self.session.post(
                self.gate_url + "/v1/samples", data=raw, headers=headers
            ) as resp:
                return web.Response(body=await resp.read(), status=resp.status)
        except aiohttp.ClientError as exc:
            return web.Response(text=str(exc), status=502)

    def between(self, t0: float, t1: float) -> Batches:
        return [(t, b) for t, b in self.batches if t0 <= t <= t1]


@dataclass
class Stack:
    procs: Procs
    tap: Tap
    broker: BrokerClient
    router_url: str
    runner: web.AppRunner

    async def close(self) -> None:
        await self.runner.cleanup()
        self.procs.stop_all()


def model_args(version: str, seed: int) -> tuple[str, ...]:
    return ("--version", version, "--batch-noise", f"{BATCH_NOISE_KL:g}", "--noise-seed", str(seed))


async def start_stack(
    tmp: Path,
    session: aiohttp.ClientSession,
    canary_weight: float,
    procs: Procs,
    gate_args: tuple[str, ...] = (),
) -> Stack:
    """Start every part (into ``procs``, so the caller stops them whatever happens);
    ``gate_args``: the gate's flags beyond its broker (e.g. ``--test release-eprocess``)."""
    await procs.start("broker", "canarystack.broker", "--state-dir", str(tmp / "broker"))
    broker_url = procs.url("broker")
    broker = BrokerClient(session, broker_url, TOKEN, actor="bench")
    for v in ("v1", "v2"):
        await broker.register_version(v, {"image": f"model:{v}"})
    await broker.create_release(RELEASE, "v1", "v2", canary_weight, reason="bench")
    for i, name in enumerate(BASELINES):
        await procs.start(name, "canarystack.model", *model_args("v1", 1000 + i))
    await procs.start("canary", "canarystack.model", *model_args("v2", 2000))
    await procs.start("gate", "canarystack.gate", "--broker", broker_url, *gate_args)
    await procs.start("rollback", "canarystack.rollback", "--broker", broker_url)
    tap = Tap(gate_url=procs.url("gate"), session=session)
    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/samples", tap.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    tap_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    router_port = free_port()
    baselines = ",".join(procs.url(n) for n in BASELINES)
    for name in ROUTERS:
        instance = free_port()
        await procs.start(
            name,
            "canarystack.router",
            *("--reuse-port", "--router-id", name, "--broker", broker_url),
            *("--baseline", baselines, "--canary", procs.url("canary")),
            *("--gate", f"http://127.0.0.1:{tap_port}", "--state-dir", str(tmp / "routers")),
            *("--instance-port", str(instance)),
            port=router_port,
        )
        procs.ports[f"{name}-instance"] = instance
    return Stack(procs, tap, broker, f"http://127.0.0.1:{router_port}", runner)
