"""One run of each kind, on a stack that keeps running between runs (a new canary version
per run: the canary server restarted under that name, a new progressing release through
the broker client).

- faulty: ``--warmup-s`` of traffic, then the ``kernel`` fault (fp8-kv-scale,
  min_prompt_tokens 2048, magnitude 1) on the canary. Measured from the injection: the
  gate's trip decision (``trip.tripped_at``), the moment every live router reports
  ``applied_revision >=`` the trip's revision (``GET /v1/routers``, polled every 20 ms),
  ``rolled_back``; canary-served requests started after the injection.
- healthy: ``--warmup-s`` of traffic, then one condition (``conditions``) for
  ``--healthy-s``; any trip is a false trip.
- open: the gate blind (absurd tolerances), ``--open-warmup-s`` healthy then
  ``--open-window-s`` faulty, replayed by all three rules on the uncut stream.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

from canary_contract import strictjson
from canary_contract.json import JsonObject
from canarystack.broker.client import BrokerError
from canarystack.broker.client_errors import IllegalTransition, RevisionConflict
from detection import conditions, rules
from detection.stack import RELEASE, Batches, Stack, model_args
from detection.traffic import Record

POLL_S = 0.02
APPLY_TIMEOUT_S = 15.0
ROLLED_BACK_TIMEOUT_S = 30.0
SETTLE_S = 1.0  # traffic after a faulty run, so late records are in
T = TypeVar("T")
UNREACHABLE = (BrokerError, aiohttp.ClientError, TimeoutError)


async def wait_until(pred: Callable[[], Awaitable[T | None]], timeout_s: float) -> T | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await pred()
        if value:
            return value
        await asyncio.sleep(POLL_S)
    return None


# The fault acts on prompts of at least this many tokens (``faulty_kernel``).
FAULT_MIN_PROMPT_TOKENS = 2048


def affected_comparisons(
    batches: Batches, version: str, start: float, fault: float, until: float
) -> JsonObject:
    """Baseline-canary comparisons the fault acts on (this canary, a prompt of at least
    ``FAULT_MIN_PROMPT_TOKENS``), by the time they reached the gate: how many arrived per
    second before the fault (the rate the traffic gives the gate) and how many between the
    fault and ``until`` (the trip, or the run's end)."""

    def count(t0: float, t1: float) -> int:
        return sum(
            1
            for t, batch in batches
            if t0 <= t <= t1
            for c in batch.get("comparisons", ())
            if c.get("pair") == "baseline-canary"
            and c.get("version_b") == version
            and int(c.get("prompt_tokens", 0)) >= FAULT_MIN_PROMPT_TOKENS
        )

    before_s = max(fault - start, 1e-9)
    return {
        "affected_per_s_before_fault": round(count(start, fault) / before_s, 3),
        "affected_to_trip": count(fault, until),
    }


def faulty_kernel(ttl_s: float) -> JsonObject:
    return conditions.kernel_fault("fp8-kv-scale", 1.0, ttl_s)


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Stack
    session: aiohttp.ClientSession
    records: Callable[[], list[Record]]
    version_n: int = 2

    # -- the broker, through its client (None / [] while it cannot be reached) -----------
    async def release(self) -> JsonObject | None:
        """The release in its wire form (the bench reads it by key), None while the
        broker cannot be reached."""
        try:
            return (await self.stack.broker.get_release(RELEASE)).to_wire()
        except UNREACHABLE:
            return None

    async def all_applied(self, revision: int) -> float | None:
        try:
            routers = (await self.stack.broker.router_records(RELEASE)).routers
        except UNREACHABLE:
            return None
        if routers and all((r.applied_revision or 0) >= revision for r in routers):
            return time.time()
        return None

    async def not_progressing(self) -> JsonObject | None:
        rel = await self.release()
        return rel if rel is not None and rel["phase"] != "progressing" else None

    async def rolled_back(self) -> float | None:
        rel = await self.release()
        return time.time() if rel is not None and rel["phase"] == "rolled_back" else None

    async def trip_revision(self) -> int:
        try:
            events = await self.stack.broker.events(RELEASE)
        except UNREACHABLE:
            events = []
        for ev in reversed(events):
            phase = ev.change.get("phase") or {}
            if phase.get("new") == "tripped":
                return ev.revision
        rel = await self.release()
        return int(rel["revision"]) if rel else 0

    async def new_canary(self) -> tuple[str, float]:
        """A new canary version, progressing at ``--canary-weight``, applied at every router."""
        self.version_n += 1
        version = f"v{self.version_n}"
        procs = self.stack.procs
        await procs.restart("canary", *model_args(version, 2000 + self.version_n))
        broker = self.stack.broker
        await broker.register_version(version, {"image": f"model:{version}"})
        revision = None
        for _ in range(100):
            rel = await self.release()
            if rel is None or rel["phase"] in ("tripped", "rolling_back"):
                await asyncio.sleep(0.2)  # the executor is finishing a rollback
                continue
            try:
                done = await broker.patch_release(
                    RELEASE,
                    rel["revision"],
                    canary_weight=self.args.canary_weight,
                    phase="progressing",
                    canary=version,
                    reason=f"bench: canary {version}",
                )
            except (RevisionConflict, IllegalTransition):
                await asyncio.sleep(0.1)
                continue
            revision = done.revision
            break
        if revision is None:
            raise SystemExit(f"could not make {version} the progressing canary")
        await wait_until(lambda: self.all_applied(revision), APPLY_TIMEOUT_S)
        return version, time.time()

    async def noise_floor(self) -> JsonObject | None:
        """The gate's ``all`` noise floor (``GET /v1/gate/<release>``), None if unreadable."""
        url = self.stack.procs.url("gate") + f"/v1/gate/{RELEASE}"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(5)) as r:
                doc = strictjson.loads(await r.read()) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        floor = (doc or {}).get("noise_floor") if isinstance(doc, dict) else None
        return floor.get("all") if isinstance(floor, dict) else None

    async def floor_measured(self) -> JsonObject | None:
        floor = await self.noise_floor()
        return floor if floor is not None and floor.get("source") not in (None, "none") else None

    def canary_served_after(self, t: float) -> list[Record]:
        return [r for r in self.records() if r.served_by == "canary" and r.start > t]

    # -- the runs ---------------------------------------------------------------------------
    async def faulty_run(self, i: int) -> JsonObject:
        args = self.args
        version, start = await self.new_canary()
        await asyncio.sleep(args.warmup_s)
        floor = await self.noise_floor()  # what the gate calibrates against at the fault
        fault = time.time()
        await conditions.inject(self.session, self.stack.procs.url("canary"), faulty_kernel(120))
        tripped = await wait_until(self.not_progressing, args.max_detect_s)
        result: JsonObject = {
            "run": i,
            "canary": version,
            "tripped": tripped is not None,
            "noise_floor_at_fault": floor,
        }
        if tripped is not None:
            trip_rev = await self.trip_revision()
            applied_at = await wait_until(lambda: self.all_applied(trip_rev), APPLY_TIMEOUT_S)
            rolled = await wait_until(self.rolled_back, ROLLED_BACK_TIMEOUT_S)
            trip = (await self.release() or {}).get("trip") or {}
            result.update(
                trip_test=trip.get("test"),
                trip_bucket=trip.get("bucket"),
                trip_samples=trip.get("samples"),
                detect_s=round(float(trip.get("tripped_at", fault)) - fault, 4),
                applied_s=round(applied_at - fault, 4) if applied_at else None,
                rolled_back_s=round(rolled - fault, 4) if rolled else None,
            )
        await asyncio.sleep(SETTLE_S)
        end = time.time()
        after = self.canary_served_after(fault)
        result["canary_served_after_fault"] = len(after)
        result["canary_served_long_after_fault"] = sum(1 for r in after if r.prompt_tokens >= 2048)
        batches = self.stack.tap.between(start, end)
        until = fault + float(result.get("detect_s") or args.max_detect_s)
        result.update(affected_comparisons(batches, version, start, fault, until))
        result["reference"] = rules.replay(batches, version, start, fault, args)
        result["wall_s"] = round(end - start, 1)
        return result

    async def healthy_run(self, i: int, condition: str) -> JsonObject:
        args = self.args
        version, start = await self.new_canary()
        await asyncio.sleep(args.warmup_s)
        restore = await conditions.apply(
            condition, self.stack.procs, self.session, args.healthy_s + 10
        )
        false_trip = await wait_until(self.not_progressing, args.healthy_s)
        if restore is not None:
            await restore()
        end = time.time()
        batches = self.stack.tap.between(start, end)
        return {
            "run": i,
            "condition": condition,
            "canary": version,
            "false_trip": None if false_trip is None else false_trip.get("trip") or {},
            "reference_trip_s": rules.replay(batches, version, start, None, args),
            # what the gate had to judge by: a run it saw nothing of proves nothing
            "baseline_canary_comparisons": len(rules.run_stream(batches, version)[0]),
            "wall_s": round(end - start, 1),
        }

    async def open_run(self, i: int) -> JsonObject:
        args = self.args
        version, start = await self.new_canary()
        await asyncio.sleep(args.open_warmup_s)
        fault = time.time()
        await conditions.inject(self.session, self.stack.procs.url("canary"), faulty_kernel(300))
        await asyncio.sleep(args.open_window_s)
        batches = self.stack.tap.between(start, time.time())
        ours = rules.our_rule_offline(batches, version)
        out = rules.replay(batches, version, start, fault, args)
        out["ours_offline"] = None if ours is None else round(ours - fault, 4)
        healthy_before = rules.our_rule_offline(self.stack.tap.between(start, fault), version)
        return {
            "run": i,
            "canary": version,
            "detect_s": out,
            "ours_tripped_before_fault": healthy_before is not None,
        }
