"""The rollback of one release: ``RollbackRunner`` reads where the rollback stands
(``canarystack.rollback.situation``: the table, ``classify``) before every step and runs
the step the table gives. Over 400 lines because the runner is one machine whose three
steps share its reads of the broker, its backoff and its refused-step record.

This module must never write to the broker without first reading the state that makes
the write necessary, never retry a write blindly (compare-and-set decides), and never
touch a release that is not the one it was asked about.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from canary_contract.bounds import bounded, check_bounds
from canary_contract.broker import Event, Release, RouterBeat, RouterList, TripRecord, trip_json
from canary_contract.phases import Phase
from canarystack.broker import client as broker_client
from canarystack.common.error_fields import CanaryStackError
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.rollback.situation import (
    BROKER_MAX_CHANGE_BYTES,
    BROKER_MAX_REASON_CHARS,
    STEP_NAMES,
    TRANSITIONS,
    Observed,
    RouterState,
    Situation,
    Step,
    StepRecord,
    canary_off_at,
    classify,
    fit_change,
    fit_reason,
    phase_moved_to,
    router_state,
)

# Names other modules read here (the table and the classification live in ``situation``).
__all__ = [
    "BROKER_MAX_CHANGE_BYTES",
    "BROKER_MAX_REASON_CHARS",
    "STEP_NAMES",
    "TRANSITIONS",
    "ExecutorConfig",
    "Observed",
    "RollbackError",
    "RollbackRunner",
    "Situation",
    "Step",
    "StepHooks",
    "auth_state",
    "canary_off_at",
    "classify",
    "fit_change",
    "fit_reason",
]


class RollbackError(CanaryStackError):
    """The rollback cannot go on (e.g. the broker refused a step); carries the reason."""


@dataclass(frozen=True)
class ExecutorConfig:
    poll_s: float = bounded(0.05, gt=0)
    apply_timeout_s: float = bounded(5.0, gt=0)
    apply_retries: int = bounded(6, ge=0)
    empty_routers_grace_s: float = bounded(3.0, ge=0)
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass
class StepHooks:
    """What the process around the machine does between steps (faults, metrics)."""

    before_step: Callable[[Step], Awaitable[None]] | None = None
    after_step: Callable[[Step], Awaitable[None]] | None = None
    # Called with an error kind ("unavailable", "unauthorized", "forbidden", "refused")
    # each time the broker fails or refuses the runner.
    on_error: Callable[[str], None] | None = None


class RefusedStep(TypedDict):
    """A step the broker refused as a bad request (``RollbackRunner.refused_step``)."""

    step: int
    name: str
    revision: int
    status: int
    error: str


class ApplyProgress(TypedDict):
    """How far step 2's wait got at its last poll (``RollbackRunner.apply_progress``)."""

    revision: int
    routers: int
    lagging: list[str]
    quiet: list[str]
    retries: int
    waited_s: float
    reason: str | None


def auth_state(status: int) -> str:
    return "forbidden" if status == 403 else "unauthorized"


def _routers_seen(
    listing: RouterList, seen: dict[str, RouterBeat], target: int
) -> tuple[list[RouterBeat], list[RouterBeat], list[RouterBeat]]:
    """One poll of step 2: the live routers of ``listing``, those of them below ``target``
    (lagging), and the quiet ones: listed as ``recent`` by the broker, or in ``seen`` (the
    routers the step saw live so far, which gains this poll's), and not live now."""
    routers = list(listing.routers)
    for r in routers:
        seen[r.router_id] = r
    live_ids = {r.router_id for r in routers}
    quiet_by_id = {r.router_id: r for r in listing.recent}
    for rid, r in seen.items():
        quiet_by_id.setdefault(rid, r)
    quiet = [r for rid, r in sorted(quiet_by_id.items()) if rid not in live_ids]
    lagging = [r for r in routers if r.applied_revision is None or r.applied_revision < target]
    return routers, lagging, quiet


class LaggingRouter(TypedDict):
    router_id: str
    applied_revision: int | None
    stopped_heartbeating: NotRequired[bool]  # only quiet routers listed when none is live


class RoutersApplied(TypedDict):
    """Step 2's ``routers_applied`` annotation (``_routers_applied_change``): ``quiet``
    when some routers went silent, ``timed_out`` and ``lagging`` when the wait timed out,
    ``cut`` when ``fit_change`` shortened its lists."""

    annotation: str
    revision: int
    routers: list[str]
    waited_s: float
    retries: int
    canary_off_at: float | None
    router_states: list[RouterState]
    quiet: NotRequired[list[RouterState]]
    timed_out: NotRequired[bool]
    lagging: NotRequired[list[LaggingRouter]]
    cut: NotRequired[dict[str, int]]


def _routers_applied_change(
    target: int,
    routers: list[RouterBeat],
    lagging: list[RouterBeat],
    quiet: list[RouterBeat],
    waited_s: float,
    retries: int,
    timed_out: bool,
) -> RoutersApplied:
    """Step 2's ``routers_applied`` annotation: every router at ``target`` after
    ``waited_s`` and ``retries``, or (``timed_out``) the routers still lagging.

    The annotation's own time is when the executor saw every router at ``target``, its own
    and the broker's latency included. What users feel is earlier: a router sends no
    canary traffic from the moment it applies a fail-safe phase. So the annotation also
    carries ``canary_off_at``, the latest ``canary_off_since`` the live routers reported
    (each router's own clock), and per router its ``applied_at``/``canary_off_since``
    (``router_states``). ``canary_off_at`` is null when a router reports no
    ``canary_off_since`` (it still sends canary traffic, or is an older router), or when
    there is no live router: readers then fall back to the annotation's time. Quiet
    routers are listed with what they last reported; when no router is live, a timed-out
    wait lists them as lagging too (``stopped_heartbeating``).
    """
    change: RoutersApplied = {
        "annotation": "routers_applied",
        "revision": target,
        "routers": [r.router_id for r in routers],
        "waited_s": waited_s,
        "retries": retries,
        "canary_off_at": canary_off_at(routers),
        "router_states": [router_state(r) for r in routers],
    }
    if quiet:
        # Seen recently, silent now: what they last reported.
        change["quiet"] = [router_state(r) for r in quiet]
    if timed_out:
        change["timed_out"] = True
        change["lagging"] = [
            {"router_id": r.router_id, "applied_revision": r.applied_revision} for r in lagging
        ]
        if not routers:
            change["lagging"] += [
                {
                    "router_id": r.router_id,
                    "applied_revision": r.applied_revision,
                    "stopped_heartbeating": True,
                }
                for r in quiet
            ]
    return change


class RollbackStatus(TypedDict):
    """One release's rollback as ``GET /v1/rollback/{release}`` answers it
    (``RollbackRunner.status``); ``trip`` and ``rollback_revision`` once the release was
    read, ``broker`` only while the broker is unavailable (the server adds it)."""

    release: str
    state: str
    phase: str | None
    revision: int | None
    canary_live: bool | None
    steps: list[StepRecord]
    manual_requested: bool
    last_error: str | None
    waiting: ApplyProgress | None
    refused_step: RefusedStep | None
    running: bool
    trip: NotRequired[TripRecord | None]
    rollback_revision: NotRequired[int | None]
    broker: NotRequired[str]


class RollbackRunner:
    """Drives one release's rollback to DONE, one table step at a time.

    Every step leaves an event with a timestamp in the broker's history: the PATCH of
    step 1, the ``routers_applied`` annotation of step 2, the quarantine and the PATCH of
    step 3. Every write fits the broker's limits (``BROKER_MAX_REASON_CHARS`` for a
    reason, ``BROKER_MAX_CHANGE_BYTES`` for an annotation's change): a long manual reason
    is cut (``fit_reason``, saying how long it was) and a change with many routers keeps
    its first entries (``fit_change``, recording how many there were).
    """

    def __init__(
        self,
        client: broker_client.BrokerClient,
        release: str,
        config: ExecutorConfig,
        *,
        hooks: StepHooks | None = None,
        log: JsonLogger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.name = release
        self.config = config
        self.hooks = hooks or StepHooks()
        self.log = log or get_logger("rollback")
        self.clock = clock
        self.manual_reason: str | None = None
        self.last_error: str | None = None
        self.last_situation: Situation | None = None
        self.apply_progress: ApplyProgress | None = None
        self.lock = asyncio.Lock()
        # The last step the broker refused as a bad request (not retried until the release
        # changes or a new manual rollback is asked for), else None.
        self.refused_step: RefusedStep | None = None
        # "ok" until the broker refuses this process's credential; then why.
        self.broker_auth = "ok"
        # The event history read so far: events from the latest move to rolling_back on
        # (all classify needs), the last seq read and the highest revision seen.
        self._events: list[Event] = []
        self._events_after = 0
        self._events_revision = 0
        self._events_lock = asyncio.Lock()

    async def situation(self) -> Situation:
        release = await self.client.get_release(self.name)
        events = await self._history(release)
        sit = classify(release, events, manual=self.manual_reason is not None)
        self.last_situation = sit
        return sit

    async def _history(self, release: Release) -> list[Event]:
        """The events classify needs, reading only the pages after the last seq read.

        The history is append-only, so each read fetches every page after the last
        ``seq`` seen (``BrokerClient.iter_events``): a long-lived broker's 10,000-event
        pages never hide the newest events. Only the events from the latest move to
        ``rolling_back`` on are kept. A history that does not match the release (a wiped
        broker database) is read again from the start.
        """
        async with self._events_lock:
            await self._read_new_events()
            # Every revision has its event, written in the same transaction, so the history
            # ends at the release's revision. When it does not, the broker's database was
            # replaced (a wiped state folder) or a write landed between the two reads:
            # read the history again from the start (once per call).
            if self._events_revision != release.revision:
                self._events, self._events_after, self._events_revision = [], 0, 0
                await self._read_new_events()
            return list(self._events)

    async def _read_new_events(self) -> None:
        async for page in self.client.iter_event_records(self.name, self._events_after):
            for ev in page:
                self._events_after = max(self._events_after, ev.seq)
                self._events_revision = max(self._events_revision, ev.revision)
                if phase_moved_to(ev, "rolling_back"):
                    self._events = []  # an older rollback: history classify does not need
                self._events.append(ev)
        # Before any rollback nothing is needed at all.
        if self._events and not phase_moved_to(self._events[0], "rolling_back"):
            self._events = []

    def _error(self, kind: str) -> None:
        if self.hooks.on_error is not None:
            self.hooks.on_error(kind)

    async def run(self) -> Situation:
        """Run steps until the table has none for the observed state (DONE or IDLE).

        Broker outages are waited out with backoff; a refused step re-reads the broker and
        decides again (someone else may have moved the release). Refusals of the
        executor's credential (401/403) are retried with backoff like an outage, never
        taken for a bad step; ``broker_auth`` says ``unauthorized``/``forbidden`` and the
        ``on_error`` hook counts them.

        A step the broker still refuses as a bad request (a 4xx that is not 401/403, 404
        or a revision/phase conflict) is not retried for ever: the runner records it
        (``refused_step``: step, release revision, status, message), drops the manual
        request that asked for it, raises ``RollbackError`` once, and does not write that
        step again until the release's revision changes or a new manual rollback is asked
        for; the service's ``/health`` says ``degraded`` naming the step meanwhile.
        """
        async with self.lock:
            backoff = self.config.backoff_s
            while True:
                step: Step | None = None
                revision: int | None = None
                try:
                    sit = await self.situation()
                    revision = sit.release.revision
                    refused = self.refused_step
                    if refused is not None and refused["revision"] != revision:
                        self.refused_step = refused = None  # the release moved: decide again
                    entry = TRANSITIONS[sit.observed]
                    if entry is None:
                        # A manual request is moot unless the release is progressing (a
                        # request made while this read was in flight must survive it).
                        if sit.release.phase is not Phase.PROGRESSING:
                            self.manual_reason = None
                        return sit
                    step, _ = entry
                    if refused is not None and refused["step"] == int(step):
                        return sit  # the same write would be refused again: reported
                    if self.hooks.before_step is not None:
                        await self.hooks.before_step(step)
                    await self._run_step(step, sit)
                    self.last_error = None
                    self.refused_step = None
                    self.broker_auth = "ok"
                    backoff = self.config.backoff_s
                    if self.hooks.after_step is not None:
                        await self.hooks.after_step(step)
                except (broker_client.RevisionConflict, broker_client.IllegalTransition) as exc:
                    self.log.info("rollback_step_refused", release=self.name, error=exc.message)
                    continue  # decide again from what the broker shows now
                except broker_client.BrokerNotFound:
                    self.last_error = f"release {self.name!r} not found"
                    raise
                except broker_client.BrokerUnavailable as exc:
                    self.last_error = exc.message
                    self._error("unavailable")
                    self.log.warning("broker_unavailable", release=self.name, error=exc.message)
                    await asyncio.sleep(backoff)
                    backoff = min(self.config.max_backoff_s, backoff * 2)
                except broker_client.BrokerRequestError as exc:
                    self.last_error = exc.message
                    if exc.status in (401, 403):
                        # Our credential, not the step, is wrong: retry (an operator can fix
                        # the token) and say so loudly; never give the step up as bad.
                        self.broker_auth = auth_state(exc.status)
                        self._error(self.broker_auth)
                        self.log.error(
                            "broker_auth_refused",
                            release=self.name,
                            status=exc.status,
                            broker_auth=self.broker_auth,
                            error=exc.message,
                        )
                        await asyncio.sleep(backoff)
                        backoff = min(self.config.max_backoff_s, backoff * 2)
                        continue
                    self._error("refused")
                    if step is not None and revision is not None:
                        # A write the broker refuses as a bad request: writing it again
                        # would be refused again. Record it, drop the manual request that
                        # asked for it, and say so once.
                        self.refused_step = {
                            "step": int(step),
                            "name": STEP_NAMES[step],
                            "revision": revision,
                            "status": exc.status,
                            "error": exc.message,
                        }
                        self.manual_reason = None
                        self.log.error(
                            "rollback_step_refused_bad_request",
                            release=self.name,
                            step=int(step),
                            name=STEP_NAMES[step],
                            status=exc.status,
                            error=exc.message,
                        )
                        raise RollbackError(
                            f"the broker refused rollback step {int(step)} "
                            f"({STEP_NAMES[step]}) with HTTP {exc.status}: {exc.message}"
                        ) from exc
                    raise RollbackError(exc.message) from exc

    async def _run_step(self, step: Step, sit: Situation) -> None:
        if step is Step.WEIGHTS_ZERO:
            await self._weights_zero(sit)
        elif step is Step.ROUTERS_APPLIED:
            await self._routers_applied(sit)
        else:
            await self._quarantine(sit)

    async def _weights_zero(self, sit: Situation) -> None:
        rel = sit.release
        if rel.phase is Phase.TRIPPED:
            test, bucket = (None, None) if rel.trip is None else (rel.trip.test, rel.trip.bucket)
            reason = f"rollback step 1: canary weight 0 after a {test} trip in bucket {bucket}"
        else:
            reason = f"rollback step 1 (manual): {self.manual_reason or 'no reason given'}"
        new = await self.client.patch_release(
            self.name,
            rel.revision,
            canary_weight=0,
            phase="rolling_back",
            reason=fit_reason(reason),
        )
        self.manual_reason = None
        self.log.info(
            "rollback_step",
            release=self.name,
            step=1,
            name="weights_zero",
            revision=new.revision,
        )

    async def _routers_applied(self, sit: Situation) -> None:
        """Step 2: wait until every live router applied ``R``, then annotate it.

        ``R`` is the revision of the event that moved the release to ``rolling_back``. The
        wait is ``_wait_for_routers``; the annotation (``_routers_applied_change``) records
        what it ended on, and the routers still lagging when it timed out.
        """
        target = sit.rollback_revision
        assert target is not None
        started = self.clock()
        routers, lagging, quiet, retries, timed_out = await self._wait_for_routers(target, started)
        waited_s = round(self.clock() - started, 4)
        # The annotation is step 2's only side effect: re-check that no earlier run of this
        # step (killed after writing it) already recorded it, then write it.
        again = await self.situation()
        if again.observed is not Observed.WAITING_ROUTERS or again.rollback_revision != target:
            return
        change = fit_change(
            _routers_applied_change(target, routers, lagging, quiet, waited_s, retries, timed_out)
        )
        await self.client.annotate(
            self.name,
            change,
            reason=fit_reason(
                f"rollback step 2: routers at revision >= {target}"
                + (" (timed out; lagging routers listed)" if timed_out else "")
            ),
        )
        self.apply_progress = None
        self.log.info("rollback_step", release=self.name, step=2, name="routers_applied", **change)

    async def _wait_for_routers(
        self, target: int, started: float
    ) -> tuple[list[RouterBeat], list[RouterBeat], list[RouterBeat], int, bool]:
        """Step 2's wait, from ``started``: the live routers, those lagging below
        ``target``, the quiet ones, the retries and whether it timed out.

        This polls ``GET /v1/routers?release=`` every ``poll_s``; an attempt that does not see
        every live router at ``target`` within ``apply_timeout_s`` is retried (counted); after
        ``apply_retries`` retries the wait times out and the rollback goes on (waiting longer
        would not move a stuck router, and the canary weight is already 0 in the broker).
        ``apply_progress`` says, at each poll, how far it got.

        An empty router list is accepted only after ``empty_routers_grace_s`` (a restarted
        broker learns its routers from heartbeats), and only while no router of the release
        was seen recently: when routers heartbeated a moment ago (the broker's ``recent``
        list, or this step saw them live) and then went quiet, "no router listed" does not
        mean "every router applied" (a router cut off from the broker may still serve the
        canary). The step then keeps waiting, says why in ``waiting.reason``, and after the
        same ``apply_timeout_s`` x (1 + ``apply_retries``) budget times out with the quiet
        routers as lagging.
        """
        cfg = self.config
        retries = 0
        attempt_start = started
        timed_out = False
        # Routers this step saw live, by id (their last entry): one that goes quiet later
        # has not applied anything we know of.
        seen: dict[str, RouterBeat] = {}
        while True:
            listing = await self.client.router_records(self.name)
            routers, lagging, quiet = _routers_seen(listing, seen, target)
            now = self.clock()
            reason = None
            if not routers and quiet:
                reason = (
                    "no live router, but router(s) "
                    + ", ".join(r.router_id for r in quiet)
                    + " heartbeated recently and went quiet: they may still serve the "
                    "canary, so this step waits for them (or its timeout)"
                )
            self.apply_progress = {
                "revision": target,
                "routers": len(routers),
                "lagging": [r.router_id for r in lagging],
                "quiet": [r.router_id for r in quiet],
                "retries": retries,
                "waited_s": round(now - started, 3),
                "reason": reason,
            }
            if routers and not lagging:
                break
            if not routers and not quiet and now - started >= cfg.empty_routers_grace_s:
                break  # no router live or recently seen: nothing serves the canary
            if now - attempt_start >= cfg.apply_timeout_s:
                if retries >= cfg.apply_retries:
                    timed_out = True
                    break
                retries += 1
                attempt_start = now
                self.log.warning(
                    "routers_apply_timeout",
                    release=self.name,
                    revision=target,
                    retry=retries,
                    lagging=[r.router_id for r in lagging],
                    quiet=[r.router_id for r in quiet],
                )
            await asyncio.sleep(cfg.poll_s)
        return routers, lagging, quiet, retries, timed_out

    async def _quarantine(self, sit: Situation) -> None:
        rel = sit.release
        version = None if rel.canary is None else rel.canary.version
        if rel.canary is not None and not rel.canary.quarantined:
            await self.client.quarantine_version(
                rel.canary.version,
                reason=fit_reason(f"rollback step 3: release {self.name} rolled back"),
            )
            self.log.info("rollback_step", release=self.name, step=3, name="quarantined")
            rel = await self.client.get_release(self.name)
            if rel.phase is not Phase.ROLLING_BACK:
                return  # someone else moved it meanwhile: decide again
        new = await self.client.patch_release(
            self.name,
            rel.revision,
            phase="rolled_back",
            reason=fit_reason(f"rollback step 3: canary {version} quarantined, rolled back"),
        )
        self.log.info(
            "rollback_step", release=self.name, step=3, name="rolled_back", revision=new.revision
        )

    def status(self, sit: Situation | None = None) -> RollbackStatus:
        sit = sit or self.last_situation
        body: RollbackStatus = {
            "release": self.name,
            "state": "unknown",
            "phase": None,
            "revision": None,
            # The contract's rule (canary_contract.phases.canary_live) on the release last
            # read: whether it still sends its canary traffic; null before the first read.
            "canary_live": None,
            "steps": [],
            "manual_requested": self.manual_reason is not None,
            "last_error": self.last_error,
            "waiting": self.apply_progress,
            "refused_step": self.refused_step,
            "running": self.lock.locked(),
        }
        if sit is not None:
            rel = sit.release
            body["state"] = sit.observed.value
            body["phase"] = rel.phase.value
            body["revision"] = rel.revision
            body["canary_live"] = rel.canary_live
            body["steps"] = sit.steps
            body["trip"] = None if rel.trip is None else trip_json(rel.trip)
            body["rollback_revision"] = sit.rollback_revision
        return body
