"""The engine pod's children and the reconcile loop that rolls between KV-cache types.

This module must never kill a process it did not start, and never leave requests
without a serving child longer than a start takes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import aiohttp

from canarystack.common.faults import FaultRegistry
from canarystack.common.logs import JsonLogger
from canarystack.engine.child import EngineChild, EngineSettings, log_tail
from canarystack.engine.faults import EngineKernelParams
from canarystack.engine.vllm import VllmKernelParams

RECONCILE_S = 0.1
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_DRAIN_TIMEOUT_S = 60.0
DEFAULT_RETRY_S = 2.0
STANDBY_RETRY_S = 300.0  # after a standby child failed to start


@dataclass(eq=False)
class Rollouts:
    """The serving child, the children still draining, and the loop that keeps the
    serving child's KV-cache type what the faults ask for.

    The kernel fault is a rollout. The loop compares the KV-cache type the faults ask for
    (the newest active ``kernel`` fault's ``cache_type``, else ``f16``) with the serving
    child's; on a difference it starts a new child with the asked-for cache, waits until
    it answers and has served a warm-up request, switches new requests to it, then lets
    the old child finish its in-flight requests (bounded) and stops it by PID — a surge
    rollout, as a Deployment does it, so a rollout costs no failed request. When the fault
    is cleared or its TTL ends (enforced by ``FaultRegistry``), the same loop rolls back
    to f16. A rollout takes a few seconds (a Python server start); ``rollout_started`` /
    ``rollout_done`` log lines carry the times. A child that died is restarted at once.

    ``standby`` names variants kept started and warm beside the serving child (with the
    healthy one, once the pod serves another): a vLLM takes about a minute to start here,
    longer than a fault's detection SLO, so a canary pod can hold its bad build ready, as
    a node holds an image already pulled, and a rollout to it is a switch of new requests
    (``rollout_done`` with ``from_standby``). The child it leaves stays warm, for the way
    back. Until each standby build has been warm once (or failed to start), the pod is
    not ready (``standby_pending``; ``/health`` says ``starting``): a fault injected before
    would meet a cold start instead of the switch, as a pod whose image is still pulling.
    """

    settings: EngineSettings
    faults: FaultRegistry
    log: JsonLogger
    _: KW_ONLY
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    retry_s: float = DEFAULT_RETRY_S
    standby: tuple[str, ...] = ()
    active: EngineChild | None = field(default=None, init=False)
    warm: dict[str, EngineChild] = field(default_factory=dict, init=False)
    _warming: set[str] = field(default_factory=set, init=False)
    _standby_retry_at: dict[str, float] = field(default_factory=dict, init=False)
    _standby_settled: set[str] = field(default_factory=set, init=False)  # warm once, or failed
    rolling_to: str | None = field(default=None, init=False)
    retiring: set[EngineChild] = field(default_factory=set, init=False)
    rollouts: int = field(default=0, init=False)
    # When the first serving child took over (monotonic): the pod could serve from then.
    serving_since_mono: float | None = field(default=None, init=False)
    last_error: str | None = field(default=None, init=False)
    session: aiohttp.ClientSession | None = field(default=None, init=False)
    _retry_at: float = field(default=0.0, init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def desired_cache_type(self) -> str:
        params = self.faults.get("kernel")
        if isinstance(params, EngineKernelParams):
            return params.cache_type
        if isinstance(params, VllmKernelParams):
            return params.variant
        return self.settings.own_build

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Reconcile every ``RECONCILE_S`` until cancelled (then call ``stop_all``)."""
        self.session = session
        while True:
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must outlive any one failure
                self.log.error("reconcile_error", exc_info=True, error=str(exc))
            await asyncio.sleep(RECONCILE_S)

    async def stop_all(self) -> None:
        """Stop every child this pod started (by PID) and the drains in progress."""
        for task in list(self._tasks):
            task.cancel()
        children = [c for c in (self.active, *self.retiring, *self.warm.values()) if c]
        self.warm.clear()
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        for c in children:
            self.log.info("engine_stopped", engine_pid=c.pid, kv_cache_type=c.cache_type)

    async def reconcile_once(self) -> None:
        active = self.active
        if active is not None and not active.alive():
            self.log.error(
                "engine_exited",
                engine_pid=active.pid,
                exit_code=active.exit_code(),
                kv_cache_type=active.cache_type,
                log_tail=log_tail(self.settings.log_path),
            )
            self.active = None
            await active.stop()
        desired = self.desired_cache_type()
        if self.active is not None and self.active.cache_type == desired:
            self._keep_warm()
            return
        ready = self.warm.pop(desired, None)
        if ready is not None and ready.alive():
            self._switch(ready, time.monotonic(), from_standby=True)
            return
        if time.monotonic() < self._retry_at:
            return
        await self._rollout(desired)

    # --- the standby children ------------------------------------------------------------
    def standby_pending(self) -> list[str]:
        """The standby builds that have not yet been warm once nor failed to start."""
        return sorted(set(self.standby) - self._standby_settled)

    def _kept_warm(self) -> set[str]:
        return {*self.standby, self.settings.own_build} if self.standby else set()

    def _keep_warm(self) -> None:
        """Start (in the background) each kept-warm variant that has no live child."""
        serving = self.active.cache_type if self.active is not None else None
        for variant in sorted(self._kept_warm() - {serving} - self._warming):
            if time.monotonic() < self._standby_retry_at.get(variant, 0.0):
                continue
            child = self.warm.get(variant)
            if child is not None and child.alive():
                continue
            if child is not None:  # it died: replaced below
                self.warm.pop(variant, None)
                self._spawn(child.stop())
            self._warming.add(variant)
            self._spawn(self._start_standby(variant))

    async def _start_standby(self, variant: str) -> None:
        assert self.session is not None
        child = EngineChild(self.settings, variant)
        try:
            child.start()
            await child.wait_ready(self.session, self.start_timeout_s)
            await child.warm_up(self.session)
        except Exception as exc:
            self.log.error("standby_failed", variant=variant, error=str(exc))
            await child.stop()
            # Not started again at once: a build that cannot start costs a core for a
            # minute each try.
            self._standby_retry_at[variant] = time.monotonic() + STANDBY_RETRY_S
            self.last_error = f"standby {variant}: {exc}"
            return
        finally:
            self._warming.discard(variant)
            self._standby_settled.add(variant)
        if variant in self.warm or (self.active is not None and self.active.cache_type == variant):
            await child.stop()  # another start got there first
            return
        self.warm[variant] = child
        self.log.info("standby_ready", variant=variant, engine_pid=child.pid)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rollout(self, cache_type: str) -> None:
        assert self.session is not None
        old = self.active
        t0 = time.monotonic()
        fault = self.faults.active("kernel")
        self.rolling_to = cache_type
        self.log.info(
            "rollout_started",
            from_kv_cache_type=old.cache_type if old else None,
            to_kv_cache_type=cache_type,
            fault_id=fault[-1].id if fault else None,
        )
        new = EngineChild(self.settings, cache_type)
        try:
            new.start()
            await new.wait_ready(self.session, self.start_timeout_s)
            await new.warm_up(self.session)
        except Exception as exc:
            name = self.settings.engine_name
            self.last_error = f"starting {name} ({cache_type}) failed: {exc}"
            self.log.error(
                "rollout_failed",
                to_kv_cache_type=cache_type,
                error=str(exc),
                retry_in_s=self.retry_s,
                log_tail=log_tail(self.settings.log_path),
            )
            await new.stop()
            self._retry_at = time.monotonic() + self.retry_s
            return
        finally:
            self.rolling_to = None
        self._switch(new, t0, from_standby=False)

    def _switch(self, new: EngineChild, t0: float, *, from_standby: bool) -> None:
        """New requests go to ``new``; the old child stays warm (a kept variant) or
        finishes its requests and stops."""
        old = self.active
        self.active = new
        self.rollouts += 1
        if self.serving_since_mono is None:
            self.serving_since_mono = time.monotonic()
        self.last_error = None
        self.log.info(
            "rollout_done",
            from_kv_cache_type=old.cache_type if old else None,
            to_kv_cache_type=new.cache_type,
            engine_pid=new.pid,
            engine_port=new.port,
            rollout_s=round(time.monotonic() - t0, 3),
            from_standby=from_standby,
        )
        if old is None:
            return
        if old.cache_type in self._kept_warm() and old.alive():
            self.warm[old.cache_type] = old
            return
        self.retiring.add(old)
        self._spawn(self._drain_and_stop(old))

    async def _drain_and_stop(self, child: EngineChild) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while child.inflight > 0 and child.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = child.inflight
        await child.stop()
        self.retiring.discard(child)
        self.log.info(
            "engine_retired",
            engine_pid=child.pid,
            kv_cache_type=child.cache_type,
            cut_requests=left,
        )
