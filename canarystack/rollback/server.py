"""The rollback executor's service: broker watch, manual rollbacks, status, faults.

- One watch task per release long-polls the broker; every change (and a periodic
  re-check) runs the release's ``RollbackRunner``, which does nothing unless the broker
  shows a rollback to do. On start it resumes whatever the broker shows half done.
- ``POST /v1/rollbacks/{release}`` (admin, ``{"reason"}``): a manual rollback. Answers
  202 once step 1 is in the broker (so a crash after the answer still resumes), 200 when
  the release is already rolled back, 409 when there is nothing to roll back.
- ``GET /v1/rollbacks/{release}``: the steps done, with times, read from the broker's
  history (so they survive a restart of this process).
- Faults: ``latency`` (``ms`` before each step), ``crash_after_step`` (``step`` 1|2|3:
  the process exits right after that step's write, as a SIGKILL would).

This module must never keep rollback progress only in memory: the broker's history is
the record, and a restart reads it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import aiohttp
from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from canarystack.broker.client import BrokerClient, BrokerError, BrokerNotFound, BrokerUnavailable
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.errors import (
    ApiError,
    Conflict,
    NotFound,
    Unavailable,
    parse_model,
    read_json_object,
)
from canarystack.common.faults import FaultParams, FaultRegistry, LatencyMs
from canarystack.common.logs import get_logger
from canarystack.rollback.executor import (
    STEP_NAMES,
    ExecutorConfig,
    Observed,
    RollbackError,
    RollbackRunner,
    Step,
    StepHooks,
)

Json = dict[str, Any]

# Module-level so tests can shorten them.
RECHECK_S = 2.0
WATCH_TIMEOUT_S = 30.0
MANUAL_WAIT_S = 10.0
CRASH_EXIT_CODE = 70

_log = get_logger("rollback")


class CrashAfterStep(FaultParams):
    step: Literal[1, 2, 3]


FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyMs,
    "crash_after_step": CrashAfterStep,
}


class ManualRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=4000)


class RollbackService:
    def __init__(
        self,
        component: Component,
        broker_url: str,
        releases: Sequence[str],
        config: ExecutorConfig,
    ) -> None:
        self.component = component
        self.broker_url = broker_url
        self.releases = list(releases)
        self.config = config
        self.runners: dict[str, RollbackRunner] = {}
        self._kicks: dict[str, asyncio.Event] = {}
        reg = component.registry
        self.steps_total = Counter(
            "canarystack_rollback_steps",
            "Rollback steps done by this process",
            ["release", "step"],
            registry=reg,
        )
        self.completed_total = Counter(
            "canarystack_rollback_completed",
            "Rollbacks this process saw reach rolled_back",
            ["release"],
            registry=reg,
        )

    def hooks(self, release: str) -> StepHooks:
        faults = self.component.faults

        async def before(step: Step) -> None:
            fault = faults.get("latency")
            if isinstance(fault, LatencyMs) and fault.ms > 0:
                await asyncio.sleep(fault.ms / 1000.0)

        async def after(step: Step) -> None:
            self.steps_total.labels(release=release, step=STEP_NAMES[step]).inc()
            if step is Step.QUARANTINE:
                self.completed_total.labels(release=release).inc()
            crash = faults.get("crash_after_step")
            if isinstance(crash, CrashAfterStep) and crash.step == int(step):
                _log.warning("crash_after_step", release=release, step=int(step))
                sys.stderr.flush()
                os._exit(CRASH_EXIT_CODE)  # no cleanup, as a SIGKILL would leave it

        return StepHooks(before_step=before, after_step=after)

    def runner(self, name: str) -> RollbackRunner:
        runner = self.runners.get(name)
        if runner is None:
            raise NotFound(
                f"Release {name!r} is not handled by this executor (it handles "
                f"{', '.join(self.releases)}); start it with --release {name}.",
                param="release",
            )
        return runner

    def kick(self, name: str) -> None:
        self._kicks[name].set()

    async def drive(self, name: str) -> None:
        """Run the release's rollback whenever kicked (watch change, manual, re-check)."""
        runner = self.runners[name]
        kick = self._kicks[name]
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(kick.wait(), RECHECK_S)
            kick.clear()
            try:
                sit = await runner.run()
            except BrokerNotFound:
                continue
            except RollbackError as exc:
                _log.error("rollback_failed", release=name, error=str(exc))
                continue
            except Exception:  # keep the loop alive; the next kick decides again
                _log.error("rollback_loop_error", release=name, exc_info=True)
                await asyncio.sleep(self.config.max_backoff_s)
                continue
            if sit.observed is Observed.DONE:
                _log.debug("rollback_done", release=name, revision=sit.release["revision"])

    async def watch(self, name: str, client: BrokerClient) -> None:
        revision = -1
        backoff = self.config.backoff_s
        while True:
            try:
                if revision < 0:
                    release = await client.get_release(name)
                else:
                    release = await client.watch(name, after=revision, timeout_s=WATCH_TIMEOUT_S)
                backoff = self.config.backoff_s
                if int(release["revision"]) != revision:
                    revision = int(release["revision"])
                    self.kick(name)
            except BrokerNotFound:
                revision = -1
                await asyncio.sleep(1.0)
            except BrokerUnavailable:
                revision = -1
                await asyncio.sleep(backoff)
                backoff = min(self.config.max_backoff_s, backoff * 2)

    async def manual(self, name: str, reason: str) -> tuple[int, Json]:
        runner = self.runner(name)
        try:
            sit = await runner.situation()
        except BrokerNotFound:
            raise NotFound(f"The broker has no release {name!r}.", param="release") from None
        except BrokerUnavailable as exc:
            raise Unavailable(
                f"The broker is unavailable ({exc.message}); retry the rollback shortly."
            ) from None
        phase = sit.release.get("phase")
        if sit.observed is Observed.DONE:
            return 200, runner.status(sit)
        if sit.observed is Observed.IDLE:
            if phase != "progressing":
                raise Conflict(
                    f"Release {name!r} is {phase}: there is nothing to roll back "
                    "(only a progressing, tripped or rolling-back release can be).",
                    param="release",
                )
            if not (sit.release.get("canary") or {}).get("version"):
                raise Conflict(
                    f"Release {name!r} has no canary version to roll back.", param="release"
                )
            runner.manual_reason = reason or "manual rollback"
        self.kick(name)
        # Answer once step 1 is in the broker, so the caller knows it will complete.
        deadline = time.monotonic() + MANUAL_WAIT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            last = runner.last_situation
            if runner.manual_reason is None and last is not None and last.steps:
                break
        try:
            sit = await runner.situation()
        except BrokerError:
            return 202, runner.status()
        return 202, runner.status(sit)


SERVICE: web.AppKey[RollbackService] = web.AppKey("rollback_service", RollbackService)


async def _post_rollback(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    request.app[COMPONENT].require_admin(request)
    name = request.match_info["release"]
    service.runner(name)  # 404 before reading the body
    raw = await request.read()
    body = parse_model(ManualRollback, await read_json_object(request)) if raw.strip() else None
    status, result = await service.manual(name, body.reason if body else "")
    return web.json_response(result, status=status)


async def _get_rollback(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["release"]
    runner = service.runner(name)
    try:
        sit = await runner.situation()
    except BrokerNotFound:
        raise NotFound(f"The broker has no release {name!r}.", param="release") from None
    except BrokerUnavailable:
        body = runner.status()
        body["broker"] = "unavailable"
        return web.json_response(body)
    except ApiError:
        raise
    return web.json_response(runner.status(sit))


async def _background(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    comp = app[COMPONENT]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = BrokerClient(session, service.broker_url, comp.admin_token, actor="rollback")
        for name in service.releases:
            service.runners[name] = RollbackRunner(
                client, name, service.config, hooks=service.hooks(name), log=_log
            )
            service._kicks[name] = asyncio.Event()
        tasks = []
        for name in service.releases:
            tasks.append(asyncio.create_task(service.drive(name)))
            tasks.append(asyncio.create_task(service.watch(name, client)))
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def build_app(
    broker_url: str,
    releases: Sequence[str],
    config: ExecutorConfig,
    *,
    admin_token: str | None,
    max_fault_ttl_s: float,
) -> web.Application:
    faults = FaultRegistry("rollback", FAULT_KINDS, max_ttl_s=max_fault_ttl_s)
    comp = Component(name="rollback", version="0.1.0", admin_token=admin_token, faults=faults)
    service = RollbackService(comp, broker_url, releases, config)
    comp.health_extra = lambda: {"releases": service.releases}
    app = create_app(comp)
    app[SERVICE] = service
    app.router.add_post("/v1/rollbacks/{release}", _post_rollback)
    app.router.add_get("/v1/rollbacks/{release}", _get_rollback)
    app.cleanup_ctx.append(_background)
    return app
