"""Benchmark: how fast the stack takes a faulty-kernel canary off every router, how often
it trips on a healthy one, and how two reference rules do on the same sample streams.

The stack, each part its own process (stopped by PID at the end): a broker, two baseline
model servers (v1), one canary model server, two routers sharing one port
(SO_REUSEPORT) with shadow sampling at their defaults, the gate and the rollback executor
at their defaults. The routers push their samples through a *tap* in this process (a
real HTTP hop that records every batch and forwards it to the gate), so the exact stream
the gate saw can be replayed. Open-loop load: ``--rate`` completions/s (``max_tokens``
8, greedy), ``--long-share`` of prompts 2048-6000 tokens, the rest 16-1500, random users,
a new connection per request; canary weight ``--canary-weight`` %.

Phase A, faulty runs (``--runs``): a new canary version (canary server restarted under
that name), ``--warmup-s`` of traffic, then the ``kernel`` fault (fp8-kv-scale,
min_prompt_tokens 2048, magnitude 1) on the canary. Measured from the injection: the
gate's trip decision (``trip.tripped_at``), the moment every live router reports
``applied_revision >= `` the trip's revision (``GET /v1/routers``, polled every 20 ms),
and ``rolled_back``; canary-served requests started after the injection (all, and with
prompts >= 2048 tokens: the ones the fault corrupts).

Phase A, healthy runs (``--healthy-runs``): a new canary version with only the version
drift, ``--healthy-s`` of traffic; scenarios cycle through none, router latency (200 ms on
router-0), a SIGKILLed baseline replica, a SIGKILLed broker (restarted after 2 s), a
SIGKILLed rollback executor (restarted after 2 s). Any trip is a false trip.

Reference rules, replayed on the recorded stream of every phase-A run:

- seed article: trip when the mean KL of the last 100 baseline-canary comparisons (all
  buckets; evaluated once 100 exist) exceeds 0.05, or when more than 5 % of the canary's
  TTFTs (outcomes since the run began, once 20 exist) exceed 1.15 x the baseline's P99;
- Flagger-style: every ``--flagger-interval-s`` (default 10 s) one check — failed when
  that interval's mean KL > 0.05 or its canary TTFT P99 > 1.15 x baseline P99 (intervals
  without comparisons are skipped, the charitable reading); trip after
  ``--flagger-threshold`` (default 3) failed checks. (Flagger's defaults, interval 1m and
  threshold 5, cannot trip in under 5 minutes.)

A phase-A stream ends when our gate trips (the canary is taken off, so shadows stop):
a reference that had not tripped by then is reported as "not before ours". Phase B
(``--open-runs``) therefore restarts the gate blind (absurd tolerances) and records
``--open-warmup-s`` + ``--open-window-s`` of a faulty canary, then replays all three
rules — ours offline with the gate's own code and default parameters — on the same
uncut streams.

Prints one JSON object. Bounded by the run counts, each run's time limits and
``--max-total-s``. Loopback only. This script must never assert on timings.

    .venv/bin/python bench/gate_detection.py                       # 10 + 10 runs + 3 open
    .venv/bin/python bench/gate_detection.py --runs 10 --healthy-runs 20 --open-runs 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _procs import ADMIN, ROOT, launch, port_if_ready, stop, wait_healthy
from _results import Run, percentile
from aiohttp import web

sys.path.insert(0, str(ROOT))

from canarystack.gate.state import GateConfig, ReleaseGate, SampleBatch
from canarystack.tokenizer import make_prompt

POLL_S = 0.02
SEED_KL_WINDOW = 100
SEED_KL_THRESHOLD = 0.05
SEED_TTFT_FACTOR = 1.15
SEED_TTFT_SHARE = 0.05
SEED_MIN_CANARY_TTFTS = 20
BLIND_GATE = (
    "--drift-kl-tolerance",
    "1000",
    "--drift-top1-tolerance",
    "1000",
    "--latency-ratio",
    "1000",
    "--error-tolerance",
    "1",
)


def pct(values: list[float], q: float) -> float | None:
    """THE benchmark percentile (``_results.percentile``), rounded to 0.1 ms."""
    v = percentile(values, q)
    return None if v is None else round(v, 4)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p95": pct(values, 0.95),
        "max": round(max(values), 4) if values else None,
    }


# ------------------------------------------------------------------------- processes
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
        deadline = time.monotonic() + 30
        while (bound := port_if_ready(proc, ready, log, name, deadline)) is None:
            await asyncio.sleep(0.05)  # the event loop keeps serving the tap meanwhile
        self.ports[name] = bound
        await wait_healthy(self.url(name), name)
        return bound

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    async def restart(self, name: str, *new_args: str) -> None:
        """SIGTERM (then SIGKILL) by PID, and start again on the same port."""
        self.stop(name)
        module, args = self.args[name]
        await self.start(name, module, *(new_args or args), port=self.ports[name])

    def stop(self, name: str) -> None:
        stop(self.procs[name])

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)


# -------------------------------------------------------------------------- the tap
@dataclass
class Tap:
    """Records every sample batch (arrival time, body) and forwards it to the gate."""

    gate_url: str = ""
    batches: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        arrived = time.time()
        with contextlib.suppress(json.JSONDecodeError):
            self.batches.append((arrived, json.loads(raw)))
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

    def between(self, t0: float, t1: float) -> list[tuple[float, dict[str, Any]]]:
        return [(t, b) for t, b in self.batches if t0 <= t <= t1]


# --------------------------------------------------------------------------- broker
# The broker's history pages (its MAX_EVENTS_PER_PAGE) and a bound on how many are read.
EVENT_PAGE = 10_000
EVENT_PAGES_MAX = 1_000


class BrokerApi:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.s = session
        self.url = url

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            async with self.s.request(
                method, self.url + path, json=body, headers=ADMIN, timeout=aiohttp.ClientTimeout(5)
            ) as r:
                return r.status, await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError):
            return 0, None

    async def register(self, version: str) -> None:
        manifest = {"image": f"model:{version}"}
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        body = {
            "version": version,
            "manifest": manifest,
            "digest": "sha256:" + hashlib.sha256(raw).hexdigest(),
        }
        status, data = await self.call("POST", "/v1/versions", body)
        assert status in (200, 201), data

    async def release(self) -> dict[str, Any] | None:
        status, data = await self.call("GET", "/v1/releases/default")
        return data if status == 200 else None

    async def routers(self) -> list[dict[str, Any]] | None:
        status, data = await self.call("GET", "/v1/routers?release=default")
        return list(data["routers"]) if status == 200 else None

    async def events(self) -> list[dict[str, Any]]:
        """The whole event history, oldest first, read page by page (the broker answers
        at most ``limit`` events after ``after_seq``); [] when any page cannot be read,
        so a caller never takes an old page for the newest events."""
        out: list[dict[str, Any]] = []
        after = 0
        for _ in range(EVENT_PAGES_MAX):
            status, data = await self.call(
                "GET", f"/v1/releases/default/events?after_seq={after}&limit={EVENT_PAGE}"
            )
            if status != 200 or not isinstance(data, dict):
                return []
            page = list(data["events"])
            out.extend(page)
            nxt = int(data.get("next_after_seq", page[-1]["seq"] if page else after))
            if len(page) < EVENT_PAGE or nxt <= after:
                return out
            after = nxt
        return []  # more than EVENT_PAGES_MAX pages: not a history this benchmark makes

    async def new_canary(self, version: str, weight: float) -> dict[str, Any]:
        """Put ``version`` in as the progressing canary, from whatever phase we are in."""
        await self.register(version)
        for _ in range(100):
            rel = await self.release()
            if rel is None:
                await asyncio.sleep(0.2)
                continue
            phase = rel["phase"]
            if phase in ("tripped", "rolling_back"):
                await asyncio.sleep(0.2)  # the executor is finishing a rollback
                continue
            body = {
                "expected_revision": rel["revision"],
                "phase": "progressing",
                "canary": version,
                "weights": {"canary": weight},
                "actor": "bench",
                "reason": f"bench: canary {version}",
            }
            status, data = await self.call("PATCH", "/v1/releases/default", body)
            if status == 200:
                return dict(data)
            await asyncio.sleep(0.1)
        raise SystemExit(f"could not set canary {version}")


async def wait_until(pred: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await pred()
        if value:
            return value
        await asyncio.sleep(POLL_S)
    return None


# ---------------------------------------------------------------------------- load
class Load:
    """Open-loop completions through the routers' shared port."""

    def __init__(self, url: str, rate: float, long_share: float, seed: int, max_requests: int):
        self.url = url
        self.rate = rate
        self.long_share = long_share
        self.rng = random.Random(seed)
        self.max_requests = max_requests
        self.records: list[dict[str, Any]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def one(self, session: aiohttp.ClientSession, n: int, tokens: int) -> None:
        rec: dict[str, Any] = {"start": time.time(), "prompt_tokens": tokens, "served_by": ""}
        body = {
            "model": "default",
            "prompt": make_prompt(tokens, seed=n),
            "max_tokens": 8,
            "temperature": 0,
        }
        try:
            async with session.post(
                self.url + "/v1/completions",
                json=body,
                headers={"x-user-id": f"u{self.rng.getrandbits(40)}"},
            ) as r:
                await r.read()
                rec["status"] = r.status
                rec["served_by"] = r.headers.get("x-served-by", "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            rec["status"] = 0
            rec["error"] = type(exc).__name__
        rec["end"] = time.time()
        self.records.append(rec)

    async def run(self, stop: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            t0 = time.monotonic()
            for n in range(self.max_requests):
                delay = t0 + n / self.rate - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
                if self.rng.random() < self.long_share:
                    tokens = self.rng.randint(2048, 6000)
                else:
                    tokens = self.rng.randint(16, 1500)
                task = asyncio.create_task(self.one(session, n, tokens))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=30)


# ------------------------------------------------------------------ reference rules
def run_stream(
    batches: list[tuple[float, dict[str, Any]]], version: str
) -> tuple[list[tuple[float, dict[str, Any]]], list[tuple[float, dict[str, Any]]]]:
    """(arrival, comparison) for this canary version and (arrival, outcome) lists."""
    comps: list[tuple[float, dict[str, Any]]] = []
    outs: list[tuple[float, dict[str, Any]]] = []
    for t, b in batches:
        for c in b.get("comparisons", []):
            if c.get("pair") == "baseline-canary" and c.get("version_b") == version:
                comps.append((t, c))
        for o in b.get("outcomes", []):
            outs.append((t, o))
    return comps, outs


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def seed_rule(batches: list[tuple[float, dict[str, Any]]], version: str) -> float | None:
    """Arrival time of the batch at which the seed article's rule trips, or None."""
    kls: list[float] = []
    canary: list[float] = []
    baseline: list[float] = []
    for t, b in batches:
        comps, outs = run_stream([(t, b)], version)
        kls += [c["kl_mean"] for _, c in comps]
        for _, o in outs:
            if o.get("ttft_s") is None or o.get("error"):
                continue
            (canary if o["variant"] == "canary" else baseline).append(o["ttft_s"])
        if len(kls) >= SEED_KL_WINDOW:
            window = kls[-SEED_KL_WINDOW:]
            if sum(window) / len(window) > SEED_KL_THRESHOLD:
                return t
        if len(canary) >= SEED_MIN_CANARY_TTFTS and baseline:
            limit = SEED_TTFT_FACTOR * p99(baseline)
            if sum(1 for x in canary if x > limit) > SEED_TTFT_SHARE * len(canary):
                return t
    return None


def flagger_rule(
    batches: list[tuple[float, dict[str, Any]]],
    version: str,
    start: float,
    interval_s: float,
    threshold: int,
) -> float | None:
    """Time of the check at which the Flagger-style rule trips, or None."""
    if not batches:
        return None
    failed = 0
    end = batches[-1][0]
    k = 1
    while start + k * interval_s <= end + interval_s:
        t0, t1 = start + (k - 1) * interval_s, start + k * interval_s
        comps, outs = run_stream([(t, b) for t, b in batches if t0 <= t < t1], version)
        k += 1
        if t1 > end + 1e-9 and not comps:
            break
        if not comps:
            continue  # no data this interval: skipped, not failed
        kl = sum(c["kl_mean"] for _, c in comps) / len(comps)
        can = [o["ttft_s"] for _, o in outs if o["variant"] == "canary" and o.get("ttft_s")]
        base = [o["ttft_s"] for _, o in outs if o["variant"] == "baseline" and o.get("ttft_s")]
        slow = bool(can and base and p99(can) > SEED_TTFT_FACTOR * p99(base))
        if kl > SEED_KL_THRESHOLD or slow:
            failed += 1
            if failed >= threshold:
                return t1
    return None


def our_rule_offline(batches: list[tuple[float, dict[str, Any]]], version: str) -> float | None:
    """Our gate's decision on a recorded stream (the gate's own code, default config)."""
    gate = ReleaseGate("default", GateConfig())
    gate.on_release(
        {
            "phase": "progressing",
            "revision": 1,
            "stable": {"version": "v1"},
            "canary": {"version": version},
            "weights": {"canary": 5},
        },
        0.0,
    )
    for t, b in batches:
        try:
            batch = SampleBatch.model_validate(b)
        except ValueError:
            continue
        gate.ingest(batch, t, t)
        if gate.trip is not None:
            return t
    return None


def replay(
    batches: list[tuple[float, dict[str, Any]]],
    version: str,
    start: float,
    fault: float | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    ref = fault if fault is not None else start
    out: dict[str, Any] = {}
    for name, t in (
        ("seed_article", seed_rule(batches, version)),
        (
            "flagger",
            flagger_rule(batches, version, start, args.flagger_interval_s, args.flagger_threshold),
        ),
    ):
        out[name] = None if t is None else round(t - ref, 4)
    return out


# ---------------------------------------------------------------------------- runs
@dataclass
class Bench:
    args: argparse.Namespace
    procs: Procs
    tap: Tap
    broker: BrokerApi
    load: Load
    version_n: int = 2

    async def next_canary(self) -> tuple[str, float]:
        self.version_n += 1
        version = f"v{self.version_n}"
        await self.procs.restart("canary", "--version", version)
        rel = await self.broker.new_canary(version, self.args.canary_weight)
        revision = rel["revision"]

        async def applied() -> bool:
            routers = await self.broker.routers()
            if not routers:
                return False
            return all((r.get("applied_revision") or 0) >= revision for r in routers)

        await wait_until(applied, 15)
        return version, time.time()

    async def inject(self, url: str, body: dict[str, Any]) -> None:
        async with self.broker.s.post(url + "/admin/faults", json=body, headers=ADMIN) as r:
            assert r.status == 201, await r.text()

    async def faulty_run(self, i: int) -> dict[str, Any]:
        args = self.args
        version, start = await self.next_canary()
        await asyncio.sleep(args.warmup_s)
        fault = time.time()
        await self.inject(
            self.procs.url("canary"),
            {"kind": "kernel", "ttl_s": 120, "mode": "fp8-kv-scale", "min_prompt_tokens": 2048},
        )
        tripped = await wait_until(self._phase_not_progressing, args.max_detect_s)
        result: dict[str, Any] = {"run": i, "canary": version, "tripped": bool(tripped)}
        if tripped:
            trip_rev = await self._trip_revision()
            applied_at = await wait_until(lambda: self._all_applied(trip_rev), 15)
            rolled = await wait_until(self._rolled_back, 30)
            rel = await self.broker.release() or {}
            trip = rel.get("trip") or {}
            result.update(
                trip_test=trip.get("test"),
                trip_bucket=trip.get("bucket"),
                trip_samples=trip.get("samples"),
                detect_s=round(trip.get("tripped_at", fault) - fault, 4),
                applied_s=round(applied_at - fault, 4) if applied_at else None,
                rolled_back_s=round(rolled - fault, 4) if rolled else None,
            )
        await asyncio.sleep(1.0)
        end = time.time()
        after = [r for r in self.load.records if r["served_by"] == "canary" and r["start"] > fault]
        result["canary_served_after_fault"] = len(after)
        result["canary_served_long_after_fault"] = sum(
            1 for r in after if r["prompt_tokens"] >= 2048
        )
        result["reference"] = replay(self.tap.between(start, end), version, start, fault, args)
        return result

    async def healthy_run(self, i: int, scenario: str) -> dict[str, Any]:
        args = self.args
        version, start = await self.next_canary()
        await asyncio.sleep(min(args.warmup_s, args.healthy_s))
        restore = await self._component_fault(scenario)
        deadline = time.monotonic() + args.healthy_s
        false_trip = None
        while time.monotonic() < deadline:
            rel = await self.broker.release()
            if rel is not None and rel["phase"] != "progressing":
                false_trip = rel.get("trip")
                break
            await asyncio.sleep(0.2)
        if restore is not None:
            await restore()
        end = time.time()
        return {
            "run": i,
            "scenario": scenario,
            "canary": version,
            "false_trip": false_trip,
            "reference_trip_s": replay(self.tap.between(start, end), version, start, None, args),
        }

    async def _component_fault(self, scenario: str) -> Any:
        procs = self.procs
        if scenario == "router_latency":
            url = procs.url("router-0-instance")
            await self.inject(url, {"kind": "latency", "ttl_s": self.args.healthy_s + 5, "ms": 200})

            async def clear_latency() -> None:
                async with self.broker.s.delete(url + "/admin/faults", headers=ADMIN) as r:
                    await r.read()

            return clear_latency
        if scenario == "baseline_kill":
            procs.kill("baseline-1")

            async def restore_baseline() -> None:
                await procs.restart("baseline-1")

            return restore_baseline
        if scenario in ("broker_kill", "rollback_kill"):
            name = "broker" if scenario == "broker_kill" else "rollback"
            procs.kill(name)
            await asyncio.sleep(2.0)
            await procs.restart(name)
        return None

    async def _phase_not_progressing(self) -> bool:
        rel = await self.broker.release()
        return rel is not None and rel["phase"] != "progressing"

    async def _rolled_back(self) -> float | None:
        rel = await self.broker.release()
        return time.time() if rel is not None and rel["phase"] == "rolled_back" else None

    async def _trip_revision(self) -> int:
        for ev in reversed(await self.broker.events()):
            phase = (ev.get("change") or {}).get("phase") or {}
            if phase.get("new") == "tripped":
                return int(ev["revision"])
        rel = await self.broker.release()
        return int(rel["revision"]) if rel else 0

    async def _all_applied(self, revision: int) -> float | None:
        routers = await self.broker.routers()
        if routers and all((r.get("applied_revision") or 0) >= revision for r in routers):
            return time.time()
        return None

    async def open_run(self, i: int) -> dict[str, Any]:
        args = self.args
        version, start = await self.next_canary()
        await asyncio.sleep(args.open_warmup_s)
        fault = time.time()
        await self.inject(
            self.procs.url("canary"),
            {"kind": "kernel", "ttl_s": 300, "mode": "fp8-kv-scale", "min_prompt_tokens": 2048},
        )
        await asyncio.sleep(args.open_window_s)
        batches = self.tap.between(start, time.time())
        ours = our_rule_offline(batches, version)
        out = replay(batches, version, start, fault, args)
        out["ours_offline"] = None if ours is None else round(ours - fault, 4)
        healthy_before = our_rule_offline(self.tap.between(start, fault), version)
        return {
            "run": i,
            "canary": version,
            "detect_s": out,
            "ours_tripped_before_fault": healthy_before is not None,
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    t_begin = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    procs = Procs(tmp)
    tap = Tap()
    stop = asyncio.Event()
    runner: web.AppRunner | None = None
    try:
        await procs.start("broker", "canarystack.broker", "--state-dir", str(tmp / "broker"))
        broker_url = procs.url("broker")
        async with aiohttp.ClientSession() as session:
            broker = BrokerApi(session, broker_url)
            for v in ("v1", "v2"):
                await broker.register(v)
            status, data = await broker.call(
                "POST",
                "/v1/releases",
                {
                    "name": "default",
                    "stable": "v1",
                    "canary": "v2",
                    "weights": {"canary": args.canary_weight},
                    "actor": "bench",
                },
            )
            assert status == 201, data
            for name in ("baseline-0", "baseline-1"):
                await procs.start(name, "canarystack.model", "--version", "v1")
            await procs.start("canary", "canarystack.model", "--version", "v2")
            await procs.start("gate", "canarystack.gate", "--broker", broker_url)
            await procs.start("rollback", "canarystack.rollback", "--broker", broker_url)
            tap.session = session
            tap.gate_url = procs.url("gate")
            app = web.Application(client_max_size=64 * 1024**2)
            app.router.add_post("/v1/samples", tap.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            tap_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            router_port = _free_port()
            baselines = ",".join(procs.url(n) for n in ("baseline-0", "baseline-1"))
            for i in range(2):
                instance = _free_port()
                await procs.start(
                    f"router-{i}",
                    "canarystack.router",
                    "--reuse-port",
                    "--router-id",
                    f"router-{i}",
                    "--broker",
                    broker_url,
                    "--baseline",
                    baselines,
                    "--canary",
                    procs.url("canary"),
                    "--gate",
                    f"http://127.0.0.1:{tap_port}",
                    "--state-dir",
                    str(tmp / "routers"),
                    "--instance-port",
                    str(instance),
                    port=router_port,
                )
                procs.ports[f"router-{i}-instance"] = instance
            planned_s = (
                args.runs * (args.warmup_s + 10)
                + args.healthy_runs * (args.warmup_s + args.healthy_s + 4)
                + args.open_runs * (args.open_warmup_s + args.open_window_s + 4)
            )
            load = Load(
                f"http://127.0.0.1:{router_port}",
                args.rate,
                args.long_share,
                args.seed,
                max_requests=int(args.rate * (planned_s + 120)),
            )
            load_task = asyncio.create_task(load.run(stop))
            bench = Bench(args, procs, tap, broker, load)
            faulty: list[dict[str, Any]] = []
            healthy: list[dict[str, Any]] = []
            open_runs: list[dict[str, Any]] = []
            scenarios = ["none", "router_latency", "baseline_kill", "broker_kill", "rollback_kill"]

            def time_left() -> bool:
                return time.monotonic() - t_begin < args.max_total_s

            for i in range(args.runs):
                if time_left():
                    faulty.append(await bench.faulty_run(i))
                    print(json.dumps({"faulty_run": faulty[-1]}), file=sys.stderr)
            for i in range(args.healthy_runs):
                if time_left():
                    healthy.append(await bench.healthy_run(i, scenarios[i % len(scenarios)]))
                    print(json.dumps({"healthy_run": healthy[-1]}), file=sys.stderr)
            if args.open_runs and time_left():
                await procs.restart("gate", "--broker", broker_url, *BLIND_GATE)
                for i in range(args.open_runs):
                    if time_left():
                        open_runs.append(await bench.open_run(i))
                        print(json.dumps({"open_run": open_runs[-1]}), file=sys.stderr)
            stop.set()
            await load_task
            if args.dump_streams:
                with open(args.dump_streams, "w") as fh:
                    for t, b in tap.batches:
                        fh.write(json.dumps({"arrival": t, "batch": b}) + "\n")
            return report(args, faulty, healthy, open_runs, load, time.monotonic() - t_begin)
    finally:
        stop.set()
        if runner is not None:
            await runner.cleanup()
        procs.stop_all()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report(
    args: argparse.Namespace,
    faulty: list[dict[str, Any]],
    healthy: list[dict[str, Any]],
    open_runs: list[dict[str, Any]],
    load: Load,
    elapsed_s: float,
) -> dict[str, Any]:
    tripped = [r for r in faulty if r["tripped"]]

    def ref_stats(name: str) -> dict[str, Any]:
        times = [r["reference"][name] for r in faulty if r["reference"][name] is not None]
        ours = {r["run"]: r.get("detect_s") for r in faulty}
        before = sum(
            1
            for r in faulty
            if r["reference"][name] is not None
            and (ours[r["run"]] is None or r["reference"][name] < ours[r["run"]])
        )
        return {
            "tripped_in_stream": len(times),
            "tripped_before_ours": before,
            "detect_s": summary(times),
            "false_trips_healthy": sum(
                1 for r in healthy if r["reference_trip_s"][name] is not None
            ),
        }

    def open_stats(name: str) -> dict[str, Any]:
        times = [r["detect_s"][name] for r in open_runs if r["detect_s"][name] is not None]
        return {"detected": len(times), "of": len(open_runs), "detect_s": summary(times)}

    statuses = [r.get("status") for r in load.records]
    return {
        "bench": "gate_detection",
        "load": {
            "rate_per_s": args.rate,
            "long_share": args.long_share,
            "long_prompt_tokens": [2048, 6000],
            "short_prompt_tokens": [16, 1500],
            "max_tokens": 8,
            "canary_weight_pct": args.canary_weight,
            "requests": len(load.records),
            "non_200": sum(1 for s in statuses if s != 200),
        },
        "stack": "2 routers (SO_REUSEPORT, default shadow rates), 2 baseline + 1 canary "
        "simulated model servers (default capacity), gate and rollback at their defaults",
        "faulty_runs": {
            "n": len(faulty),
            "tripped": len(tripped),
            "evidence_buckets": sorted({str(r.get("trip_bucket")) for r in tripped}),
            "fault_to_trip_decision_s": summary([r["detect_s"] for r in tripped]),
            "fault_to_weight0_at_every_router_s": summary(
                [r["applied_s"] for r in tripped if r.get("applied_s") is not None]
            ),
            "fault_to_rolled_back_s": summary(
                [r["rolled_back_s"] for r in tripped if r.get("rolled_back_s") is not None]
            ),
            "canary_served_after_fault": summary(
                [float(r["canary_served_after_fault"]) for r in faulty]
            ),
            "canary_served_long_prompt_after_fault": summary(
                [float(r["canary_served_long_after_fault"]) for r in faulty]
            ),
            "runs": faulty,
        },
        "healthy_runs": {
            "n": len(healthy),
            "seconds_each": args.healthy_s,
            "false_trips": sum(1 for r in healthy if r["false_trip"] is not None),
            "by_scenario": {
                s: {
                    "runs": sum(1 for r in healthy if r["scenario"] == s),
                    "false_trips": sum(
                        1 for r in healthy if r["scenario"] == s and r["false_trip"] is not None
                    ),
                }
                for s in sorted({r["scenario"] for r in healthy})
            },
            "runs": healthy,
        },
        "reference_rules_same_streams": {
            "note": "a phase-A stream ends when our gate trips; 'tripped_before_ours' is the "
            "comparison that stream allows",
            "seed_article": {
                "rule": "mean KL of the last 100 comparisons > 0.05, or > 5% of canary TTFTs "
                "> 1.15 x baseline P99",
                **ref_stats("seed_article"),
            },
            "flagger": {
                "rule": f"one check every {args.flagger_interval_s:g} s (interval mean KL > "
                f"0.05 or canary P99 TTFT > 1.15 x baseline P99), trip after "
                f"{args.flagger_threshold} failed checks",
                **ref_stats("flagger"),
            },
        },
        "open_streams": {
            "note": "gate blind while recording; all three rules replayed on the same uncut "
            f"streams ({args.open_warmup_s:g} s healthy, then {args.open_window_s:g} s faulty); "
            "ours = the gate's own code at default parameters (decision time only)",
            "n": len(open_runs),
            "ours": open_stats("ours_offline"),
            "seed_article": open_stats("seed_article"),
            "flagger": open_stats("flagger"),
            "ours_false_trips_in_warmup": sum(
                1 for r in open_runs if r["ours_tripped_before_fault"]
            ),
            "runs": open_runs,
        },
        "elapsed_s": round(elapsed_s, 1),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="faulty-kernel runs (default 10)")
    p.add_argument("--healthy-runs", type=int, default=10, help="healthy runs (default 10)")
    p.add_argument("--healthy-s", type=float, default=20.0, help="length of a healthy run")
    p.add_argument("--warmup-s", type=float, default=8.0, help="traffic before the fault")
    p.add_argument("--max-detect-s", type=float, default=30.0, help="give up a run after this")
    p.add_argument("--rate", type=float, default=15.0, help="requests per second")
    p.add_argument("--long-share", type=float, default=0.14, help="share of prompts >= 2048")
    p.add_argument("--canary-weight", type=float, default=5.0, help="canary weight, percent")
    p.add_argument("--open-runs", type=int, default=3, help="uncut faulty streams (blind gate)")
    p.add_argument("--open-warmup-s", type=float, default=35.0)
    p.add_argument("--open-window-s", type=float, default=45.0)
    p.add_argument("--flagger-interval-s", type=float, default=10.0)
    p.add_argument("--flagger-threshold", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-total-s", type=float, default=1800.0, help="bound on the whole bench")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument(
        "--dump-streams",
        default=None,
        help="write every recorded sample batch here (JSON lines: arrival time, batch)",
    )
    args = p.parse_args()
    if args.runs < 0 or args.healthy_runs < 0 or args.open_runs < 0:
        p.error("run counts must be >= 0")
    if args.rate <= 0 or not 0 <= args.long_share <= 1:
        p.error("--rate must be > 0 and --long-share in [0, 1]")
    return args


def main() -> None:
    args = parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    run = Run("gate_detection")
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    run.write(result, Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
