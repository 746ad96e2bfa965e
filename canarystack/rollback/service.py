"""The rollback executor's service: the runners of the watched releases and the loops
that keep them going (docs/ARCHITECTURE.md §5). Over 400 lines because it is one
process's supervision (loops, credential, health) around the runners of ``executor``.

This module must never keep rollback progress only in memory: the broker's history is
the record, and a restart reads it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from canary_contract.phases import Phase
from canarystack.broker.client import (
    BrokerClient,
    BrokerError,
    BrokerNotFound,
    BrokerRequestError,
    BrokerUnavailable,
    FollowKind,
)
from canarystack.common.app import Component
from canarystack.common.errors import Conflict, NotFound, Unavailable, release_not_served
from canarystack.common.faults import FaultParams, LatencyMs
from canarystack.common.logs import get_logger
from canarystack.common.metrics import Metrics
from canarystack.rollback.executor import (
    STEP_NAMES,
    ExecutorConfig,
    Observed,
    RollbackError,
    RollbackRunner,
    RollbackStatus,
    Step,
    StepHooks,
    auth_state,
)

# Module-level so tests can shorten them.
RECHECK_S = 2.0
WATCH_TIMEOUT_S = 30.0
MANUAL_WAIT_S = 10.0
CRASH_EXIT_CODE = 70
CREDENTIAL_CHECK_S = 30.0
# A loop whose iteration failed waits this long before the next (doubling up to the max).
LOOP_BACKOFF_S = 0.2
LOOP_MAX_BACKOFF_S = 5.0

_log = get_logger("rollback")


# ``latency`` (``ms`` before each step), ``crash_after_step`` (``step`` 1|2|3: the process
# exits right after that step's write, as a SIGKILL would).
class CrashAfterStep(FaultParams):
    step: Literal[1, 2, 3]


FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyMs,
    "crash_after_step": CrashAfterStep,
}


class ManualRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=4000)


class LoopJson(TypedDict):
    """One loop as ``/health`` shows it (``loops``)."""

    running: bool
    errors: int
    failing: bool
    last_error: str | None
    last_error_kind: str | None
    ended: str | None


class RollbackHealth(TypedDict):
    """The executor's fields of ``/health``; ``status`` only while degraded."""

    releases: list[str]
    broker_auth: str
    loops: dict[str, LoopJson]
    degraded_reasons: list[str]
    status: NotRequired[str]


class LoopState:
    """How one background loop is doing, for /health."""

    def __init__(self) -> None:
        self.errors = 0
        self.consecutive = 0
        self.last_error: str | None = None
        self.last_kind: str | None = None
        self.ended: str | None = None  # why it ended, once it has

    def ok(self) -> None:
        self.consecutive = 0
        self.last_kind = None

    def failed(self, kind: str, error: str) -> None:
        self.errors += 1
        self.consecutive += 1
        self.last_kind = kind
        self.last_error = error

    def to_json(self) -> LoopJson:
        return {
            "running": self.ended is None,
            "errors": self.errors,
            "failing": self.consecutive > 0,
            "last_error": self.last_error,
            "last_error_kind": self.last_kind,
            "ended": self.ended,
        }


# Kinds of loop errors that do not make the executor degraded: a broker outage is
# waited out, and a release that does not exist yet may be created later.
TRANSIENT_KINDS = frozenset({"unavailable", "not_found"})


class RollbackService:
    """The executor's releases and loops.

    One watch task per release follows the broker (``BrokerClient.follow``); every change
    (and a periodic re-check) runs the release's ``RollbackRunner``, which does nothing
    unless the broker shows a rollback to do. On start it resumes whatever the broker
    shows half done. A manual rollback (``manual``) answers once step 1 is in the broker.
    """

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
        self.loops: dict[str, LoopState] = {}
        # The broker's verdict on our credential: "ok", "unauthorized" or "forbidden".
        self.credential = "ok"
        self.credential_error: str | None = None
        self.stopping = False
        m = Metrics(component.registry)
        self.loop_errors = m.counter(
            "canarystack_rollback_loop_errors",
            "Errors in the executor's background loops, by loop and kind",
            "loop",
            "kind",
        )
        self.broker_errors = m.counter(
            "canarystack_rollback_broker_errors",
            "Broker failures and refusals met by rollback steps, by kind",
            "release",
            "kind",
        )
        m.gauge(
            "canarystack_rollback_degraded", "1 while /health says degraded (see degraded_reasons)"
        ).set_function(lambda: 1.0 if self.degraded_reasons() else 0.0)
        self.steps_total = m.counter(
            "canarystack_rollback_steps", "Rollback steps done by this process", "release", "step"
        )
        self.completed_total = m.counter(
            "canarystack_rollback_completed",
            "Rollbacks this process saw reach rolled_back",
            "release",
        )

    def hooks(self, release: str) -> StepHooks:
        faults = self.component.faults

        async def before(step: Step) -> None:
            fault = faults.get("latency")
            if isinstance(fault, LatencyMs) and fault.ms > 0:
                await faults.delay("latency", fault.ms / 1000.0)

        async def after(step: Step) -> None:
            self.steps_total.labels(release=release, step=STEP_NAMES[step]).inc()
            if step is Step.QUARANTINE:
                self.completed_total.labels(release=release).inc()
            crash = faults.get("crash_after_step")
            if isinstance(crash, CrashAfterStep) and crash.step == int(step):
                _log.warning("crash_after_step", release=release, step=int(step))
                sys.stderr.flush()
                os._exit(CRASH_EXIT_CODE)  # no cleanup, as a SIGKILL would leave it

        def on_error(kind: str) -> None:
            self.broker_errors.labels(release=release, kind=kind).inc()

        return StepHooks(before_step=before, after_step=after, on_error=on_error)

    # -- health -------------------------------------------------------------------------
    def broker_auth(self) -> str:
        """The worst of the credential check and what the runners' writes met."""
        states = [self.credential, *(r.broker_auth for r in self.runners.values())]
        for bad in ("forbidden", "unauthorized"):
            if bad in states:
                return bad
        return "ok"

    def degraded_reasons(self) -> list[str]:
        """Why ``/health`` says degraded (empty: ok).

        Loops never die silently: the watch, drive and credential loops catch every
        exception, log it, count it (``canarystack_rollback_loop_errors_total{loop,kind}``)
        and retry with backoff. Degraded names the broker refusing this process's
        credential (``broker_auth``: ``unauthorized``/``forbidden``, checked at start and
        every ``CREDENTIAL_CHECK_S``, and on every refused step), a loop that keeps failing
        with anything but a broker outage, a loop that ended, and a refused step. A broker
        outage alone is not degraded (it is waited out, and shown in ``loops``).
        """
        reasons: list[str] = []
        auth = self.broker_auth()
        if auth != "ok":
            detail = self.credential_error or next(
                (r.last_error for r in self.runners.values() if r.broker_auth != "ok"), None
            )
            reasons.append(
                f"broker_auth: the broker answers {auth} to this executor's rollback "
                f"credential, so no rollback step can be written ({detail}); fix "
                "--broker-token-file (or the admin token in single-credential mode) and "
                "restart"
            )
        for release, runner in sorted(self.runners.items()):
            refused = runner.refused_step
            if refused is not None:
                reasons.append(
                    f"refused_step: the broker refused rollback step {refused['step']} "
                    f"({refused['name']}) of release {release!r} at revision "
                    f"{refused['revision']} with HTTP {refused['status']} "
                    f"({refused['error']}); it is not written again until the release "
                    "changes or a new manual rollback is asked for"
                )
        for name, state in sorted(self.loops.items()):
            if state.ended is not None:
                reasons.append(f"loop {name} ended: {state.ended}")
            elif state.consecutive and state.last_kind not in TRANSIENT_KINDS:
                reasons.append(f"loop {name} failing ({state.last_kind}): {state.last_error}")
        return reasons

    def health(self) -> RollbackHealth:
        reasons = self.degraded_reasons()
        body: RollbackHealth = {
            "releases": self.releases,
            "broker_auth": self.broker_auth(),
            "loops": {name: state.to_json() for name, state in sorted(self.loops.items())},
            "degraded_reasons": reasons,
        }
        if reasons:
            body["status"] = "degraded"
        return body

    def _loop_failed(self, loop: str, kind: str, error: str, *, exc_info: bool = False) -> None:
        self.loops[loop].failed(kind, error)
        self.loop_errors.labels(loop=loop, kind=kind).inc()
        if kind in TRANSIENT_KINDS:
            _log.warning("loop_error", loop=loop, kind=kind, error=error)
        else:
            _log.error("loop_error", exc_info=exc_info, loop=loop, kind=kind, error=error)

    def supervise(self, loop: str, coro: Any) -> asyncio.Task[None]:
        """Run a loop as a task; should it ever end, /health says so."""
        self.loops.setdefault(loop, LoopState())
        task: asyncio.Task[None] = asyncio.create_task(coro, name=loop)

        def ended(done: asyncio.Task[None]) -> None:
            if self.stopping:
                return
            if done.cancelled():
                why = "cancelled"
            elif done.exception() is not None:
                exc = done.exception()
                why = f"{type(exc).__name__}: {exc}"
            else:
                why = "returned"
            self.loops[loop].ended = why
            self.loop_errors.labels(loop=loop, kind="ended").inc()
            _log.error("loop_ended", loop=loop, why=why)

        task.add_done_callback(ended)
        return task

    def runner(self, name: str) -> RollbackRunner:
        runner = self.runners.get(name)
        if runner is None:
            raise release_not_served(
                name, self.releases, "handled by this executor", f"start it with --release {name}."
            )
        return runner

    def kick(self, name: str) -> None:
        self._kicks[name].set()

    async def drive(self, name: str) -> None:
        """Run the release's rollback whenever kicked (watch change, manual, re-check)."""
        runner = self.runners[name]
        kick = self._kicks[name]
        loop = f"drive:{name}"
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(kick.wait(), RECHECK_S)
            kick.clear()
            try:
                sit = await runner.run()
            except BrokerNotFound as exc:
                self._loop_failed(loop, "not_found", exc.message)
                continue
            except RollbackError as exc:
                _log.error("rollback_failed", release=name, error=str(exc))
                self._loop_failed(loop, "refused", str(exc))
                continue
            except Exception as exc:  # keep the loop alive; the next kick decides again
                self._loop_failed(loop, "error", f"{type(exc).__name__}: {exc}", exc_info=True)
                await asyncio.sleep(self.config.max_backoff_s)
                continue
            self.loops[loop].ok()
            if sit.observed is Observed.DONE:
                _log.debug("rollback_done", release=name, revision=sit.release.revision)

    async def watch(self, name: str, client: BrokerClient) -> None:
        loop = f"watch:{name}"
        follower = client.follow(
            name,
            WATCH_TIMEOUT_S,
            backoff_s=LOOP_BACKOFF_S,
            max_backoff_s=LOOP_MAX_BACKOFF_S,
            missing_retry_s=1.0,
        )
        async for event in follower:
            try:
                if event.kind is FollowKind.RELEASE:
                    self.loops[loop].ok()
                    if event.changed:
                        self.kick(name)
                    continue
                error = event.error
                message = error.message if isinstance(error, BrokerError) else str(error)
                if event.kind is FollowKind.REFUSED and isinstance(error, BrokerRequestError):
                    status = error.status
                    kind = auth_state(status) if status in (401, 403) else "refused"
                else:  # not_found, unavailable, bad_answer, error
                    kind = event.kind.value
                if event.kind is FollowKind.ERROR:
                    message = f"{type(error).__name__}: {error}"
                self._loop_failed(loop, kind, message)
            except Exception as exc:  # a bug: never let the watch die
                self._loop_failed(loop, "error", f"{type(exc).__name__}: {exc}", exc_info=True)
                follower.retry()

    async def check_credential(self, client: BrokerClient) -> None:
        """At start and every CREDENTIAL_CHECK_S: does the broker accept our token?"""
        loop = "credential"
        while True:
            try:
                await client.check_credential()
                self.credential, self.credential_error = "ok", None
                self.loops[loop].ok()
            except BrokerRequestError as exc:
                if exc.status in (401, 403):
                    self.credential, self.credential_error = auth_state(exc.status), exc.message
                    self._loop_failed(loop, self.credential, exc.message)
                else:
                    self._loop_failed(loop, "refused", exc.message)
            except BrokerUnavailable as exc:
                self._loop_failed(loop, "unavailable", exc.message)
            except Exception as exc:
                self._loop_failed(loop, "error", f"{type(exc).__name__}: {exc}", exc_info=True)
            await asyncio.sleep(CREDENTIAL_CHECK_S)

    async def manual(self, name: str, reason: str) -> tuple[int, RollbackStatus]:
        runner = self.runner(name)
        try:
            sit = await runner.situation()
        except BrokerNotFound:
            raise NotFound(f"The broker has no release {name!r}.", param="release") from None
        except BrokerUnavailable as exc:
            raise Unavailable(
                f"The broker is unavailable ({exc.message}); retry the rollback shortly."
            ) from None
        phase = sit.release.phase
        if sit.observed is Observed.DONE:
            return 200, runner.status(sit)
        if sit.observed is Observed.IDLE:
            if phase is not Phase.PROGRESSING:
                raise Conflict(
                    f"Release {name!r} is {phase}: there is nothing to roll back "
                    "(only a progressing, tripped or rolling-back release can be).",
                    param="release",
                )
            if sit.release.canary is None or not sit.release.canary.version:
                raise Conflict(
                    f"Release {name!r} has no canary version to roll back.", param="release"
                )
            runner.refused_step = None  # a new request: its step may be written again
            runner.manual_reason = reason or "manual rollback"
        self.kick(name)
        # Answer once step 1 is in the broker, so the caller knows it will complete.
        deadline = time.monotonic() + MANUAL_WAIT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            last = runner.last_situation
            if runner.refused_step is not None and runner.manual_reason is None:
                refused = runner.refused_step
                raise Conflict(
                    f"The broker refused rollback step {refused['step']} "
                    f"({refused['name']}) of release {name!r} with HTTP "
                    f"{refused['status']}: {refused['error']}. Nothing was rolled back; "
                    "GET /health names the refusal.",
                    param="release",
                    code="step_refused",
                )
            if runner.manual_reason is None and last is not None and last.steps:
                break
        try:
            sit = await runner.situation()
        except BrokerError:
            return 202, runner.status()
        return 202, runner.status(sit)
