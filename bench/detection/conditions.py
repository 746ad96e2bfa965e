"""The healthy conditions the gate is held under (issue #14 item 7). In each, the canary is
healthy (its version differs from the baseline's, so its simulator drifts by the usual
``--drift``), and any trip is a false trip.

- ``none``: nothing else.
- ``router_latency`` / ``broker_latency`` / ``rollback_latency``: the latency fault of the
  game day's latency experiments (200 ms at every router, 300 ms at the broker, 1000 ms at
  the rollback executor: ``experiments/*/latency.yaml``).
- ``router_kill`` / ``broker_kill`` / ``rollback_kill``: SIGKILL one router (router-1),
  the broker or the rollback executor, restarted after ``RESTART_AFTER_S``.
- ``benign_noise``: the canary's numerics differ as a batch-size or tensor-parallel change
  gives (kernel fault ``numerics``, magnitude 2: ``experiments/control/benign-noise.yaml``).
- ``small_drift``: a small acceptable drift, q8_0-like (kernel fault ``quantized``,
  magnitude 1: ``experiments/control/small-drift.yaml``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from _procs import ADMIN

from detection.stack import ROUTERS, Procs

RESTART_AFTER_S = 2.0
LATENCY_MS = {"router": 200.0, "broker": 300.0, "rollback": 1000.0}
CANARY_FAULT = {"benign_noise": ("numerics", 2.0), "small_drift": ("quantized", 1.0)}
CONDITIONS = (
    "none",
    "router_latency",
    "broker_latency",
    "rollback_latency",
    "router_kill",
    "broker_kill",
    "rollback_kill",
    "benign_noise",
    "small_drift",
)

Restore = Callable[[], Awaitable[None]]


async def inject(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> None:
    async with session.post(url + "/admin/faults", json=body, headers=ADMIN) as r:
        if r.status != 201:
            raise SystemExit(f"fault {body} at {url} refused ({r.status}): {await r.text()}")


async def clear(session: aiohttp.ClientSession, url: str) -> None:
    async with session.delete(url + "/admin/faults", headers=ADMIN) as r:
        await r.read()


def kernel_fault(mode: str, magnitude: float, ttl_s: float) -> dict[str, object]:
    return {
        "kind": "kernel",
        "ttl_s": ttl_s,
        "mode": mode,
        "min_prompt_tokens": 0 if mode != "fp8-kv-scale" else 2048,
        "magnitude": magnitude,
    }


async def apply(
    condition: str, procs: Procs, session: aiohttp.ClientSession, ttl_s: float
) -> Restore | None:
    """Start ``condition``; the coroutine that ends it (None: nothing to end)."""
    if condition == "none":
        return None
    what, _, kind = condition.rpartition("_")
    if kind == "latency":
        names = [f"{r}-instance" for r in ROUTERS] if what == "router" else [what]
        urls = [procs.url(n) for n in names]
        for url in urls:
            await inject(session, url, {"kind": "latency", "ttl_s": ttl_s, "ms": LATENCY_MS[what]})

        async def clear_latency() -> None:
            for url in urls:
                await clear(session, url)

        return clear_latency
    if kind == "kill":
        name = ROUTERS[1] if what == "router" else what
        procs.kill(name)
        await asyncio.sleep(RESTART_AFTER_S)
        await procs.restart(name)
        return None
    if condition in CANARY_FAULT:
        mode, magnitude = CANARY_FAULT[condition]
        url = procs.url("canary")
        await inject(session, url, kernel_fault(mode, magnitude, ttl_s))

        async def clear_canary() -> None:
            await clear(session, url)

        return clear_canary
    raise SystemExit(f"unknown condition {condition!r}: pick from {', '.join(CONDITIONS)}")
