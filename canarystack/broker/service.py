"""The broker's in-process state around the store: cached releases, watches, heartbeats.

This module knows nothing of HTTP (the handlers are ``canarystack.broker.server``); it
must never touch SQLite from the event loop thread, publish a write before its commit
returned, or hold a watch past its timeout (except under drop_watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from canarystack.broker import capabilities
from canarystack.broker.capabilities import Credentials
from canarystack.broker.custody import Custody, recovery_text
from canarystack.broker.errors import Conflicting, Crowded
from canarystack.broker.highwater import Loss
from canarystack.broker.overdue import DEFAULT_ROLLBACK_OVERDUE_S, Overdue, all_overdue, overdue
from canarystack.broker.records import ReleaseJson, RouterBeatJson
from canarystack.broker.schemas import Heartbeat
from canarystack.broker.store import Store
from canarystack.common.app import Component
from canarystack.common.logs import get_logger

T = TypeVar("T")

# Module-level so tests can shorten them instead of sleeping.
# A waiting long-poll wakes at least this often to notice a client that went away.
WATCH_SLICE_S = 1.0
# How often a long-poll hung by drop_watch checks whether the fault ended or the client left.
DROP_WATCH_POLL_S = 0.05
# A router whose heartbeats stopped stays listed under "recent" this many expiry periods,
# so the rollback executor can tell "no router exists" from "the routers just went quiet".
RECENT_ROUTER_FACTOR = 3.0
# Router ids listed at once (live and recent) from the shared heartbeat credential; a new
# id beyond it is refused (429). Router-bound credentials are always admitted: only the
# operator can mint them.
DEFAULT_MAX_ROUTERS = 256

_log = get_logger("broker")
# canarystack_broker_writes_total{outcome}: a refused write keeps the label it had when the
# store raised HTTP errors (the status's name), so dashboards and alerts read it unchanged.
_OUTCOME_LABEL = {"Missing": "NotFound", "Conflicting": "Conflict", "Refused": "Unprocessable"}


@dataclass
class RouterBeat:
    router_id: str
    release: str
    applied_revision: int | None
    last_seen: float  # epoch seconds, for people
    seen_mono: float  # for expiry
    applied_at: float | None = None  # the router's clock, epoch seconds
    canary_off_since: float | None = None  # the router's clock; None: canary gets traffic
    # "bound": a router-bound credential proved the id; "shared": the shared heartbeat
    # credential (any holder could claim it); "operator": the operator credential.
    identity: str = "shared"


class Broker:
    """The in-process state around the store: cached releases, watches, heartbeats.

    SQLite calls block, and with ``synchronous=FULL`` every commit waits for an fsync. Run
    on the event loop, that wait would stall every long-poll wake-up and router heartbeat
    behind it, so all SQLite work runs on one dedicated thread (a
    ``ThreadPoolExecutor(max_workers=1)``) holding the only connection. One thread also
    serialises writes, which SQLite would do anyway. Reads of a release (the hot path:
    every router watch and GET) are answered from an in-memory copy that is replaced after
    each commit, so they never wait for the database.

    Router heartbeats live in memory only: after a restart, routers reappear within one
    heartbeat. A router whose heartbeats stop leaves ``live_routers`` after
    ``router_expiry_s`` and is listed by ``recent_routers`` for ``RECENT_ROUTER_FACTOR``
    times that, so the rollback executor can tell routers that just went quiet from no
    routers at all.
    """

    def __init__(
        self,
        state_dir: Path,
        component: Component,
        *,
        router_expiry_s: float = 3.0,
        max_watch_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        credentials: Credentials | None = None,
        max_routers: int = DEFAULT_MAX_ROUTERS,
        require_router_credentials: bool = False,
        rollback_overdue_s: float = DEFAULT_ROLLBACK_OVERDUE_S,
    ) -> None:
        self.state_dir = Path(state_dir)
        # The rollback executor's dead-man switch (``overdue``): a release tripped or
        # rolling back with no phase change for this long is reported.
        self.rollback_overdue_s = rollback_overdue_s
        # When each release entered its phase, on ``clock`` (memory only).
        self._phase_since: dict[str, float] = {}
        self.max_routers = max_routers
        # --require-router-credentials: heartbeats only from router-bound credentials.
        self.require_router_credentials = require_router_credentials
        # Router ids a router-bound credential has spoken for: the shared one cannot.
        self.bound_ids: set[str] = set()
        self.component = component
        self.credentials = credentials or capabilities.single_credential(component.admin_token)
        self.faults = component.faults
        self.router_expiry_s = router_expiry_s
        self.max_watch_s = max_watch_s
        self._clock = clock
        self._wall = wall
        self._executor: ThreadPoolExecutor | None = None
        self._store: Store | None = None
        self._custody: Custody | None = None
        self.releases: dict[str, ReleaseJson] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._routers: dict[str, RouterBeat] = {}
        # Routers whose heartbeats stopped less than recent_s ago (memory only, as beats).
        self._gone: dict[str, RouterBeat] = {}
        self.recent_s = router_expiry_s * RECENT_ROUTER_FACTOR
        self.closing = False
        self.watchers = 0

        reg = component.registry
        Gauge("canarystack_broker_watchers", "Long-polls waiting now", registry=reg).set_function(
            lambda: float(self.watchers)
        )
        Gauge(
            "canarystack_broker_live_routers", "Routers with a live heartbeat", registry=reg
        ).set_function(lambda: float(len(self.live_routers())))
        Gauge(
            "canarystack_broker_rollbacks_overdue",
            "Releases tripped or rolling back with no phase change for --rollback-overdue-s "
            "(the rollback executor is not moving them)",
            registry=reg,
        ).set_function(lambda: float(len(self.overdue_rollbacks())))
        self._revision = Gauge(
            "canarystack_broker_release_revision", "Current revision", ["release"], registry=reg
        )
        self._writes = Counter(
            "canarystack_broker_writes_total",
            "Write requests by kind and outcome",
            ["kind", "outcome"],
            registry=reg,
        )
        self._commit_s = Histogram(
            "canarystack_broker_write_seconds",
            "Time a write spends on the database thread (transaction and fsync)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=reg,
        )

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-sqlite")
        self._store = await self._db(Store.open, self.state_dir)
        self._custody = Custody(self._store, self.state_dir)
        loss = await self._db(self._custody.check)
        for release in await self._db(self.store.list_releases):
            self._publish(release)
            # The phase began at or before the last update: counting from there never
            # reports a rollback early, and a restart does not hide one that is overdue.
            age = max(0.0, self._wall() - float(release["updated_at"]))
            self._phase_since[release["name"]] = self._clock() - age
        _log.info(
            "store_opened",
            path=str(self.store.path),
            releases=len(self.releases),
            journal_mode="wal",
            synchronous="full",
        )
        if loss is not None:
            _log.error(
                "store_lost",
                lost=loss.lines(),
                effect="every /v1 call but GET /v1/store, GET /v1/routers, heartbeats and "
                "POST /v1/store/accept-loss answers 503 store_lost; /health is 503",
                recovery=recovery_text(self.state_dir),
            )

    @property
    def custody(self) -> Custody:
        if self._custody is None:
            raise RuntimeError("the broker store is not open (start() has not run)")
        return self._custody

    @property
    def store_lost(self) -> Loss | None:
        """What the store lost against its high-water mark, until an operator accepts it."""
        return None if self._custody is None else self._custody.lost

    async def accept_loss(self, actor: str, reason: str) -> Loss:
        """The operator's acceptance of the loss (``Custody.accept``); serve again after."""
        loss, _ = await self.write(
            "accept_loss",
            self.custody.accept,
            actor,
            reason,
            time.time(),
            changed=lambda result: result[1],
        )
        _log.warning("store_loss_accepted", actor=actor, reason=reason, lost=loss.lines())
        return loss

    def wake_all(self) -> None:
        """On shutdown: let every waiting long-poll answer now."""
        self.closing = True
        for event in self._changed.values():
            event.set()
        self._changed.clear()

    async def stop(self) -> None:
        if self._store is not None:
            await self._db(self._store.close)
            self._store = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("the broker store is not open (start() has not run)")
        return self._store

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise RuntimeError("the broker's database thread is not running")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def write(
        self,
        kind: str,
        fn: Callable[..., T],
        *args: Any,
        changed: Callable[[T], list[ReleaseJson]] | None = None,
    ) -> T:
        """Run a write on the database thread; it has committed when this returns.

        ``changed`` picks the releases the write changed out of its result. They are
        published (cache, watchers) from the commit's own completion, not from the
        awaiting handler, and the handler's wait is shielded: a handler cancelled after
        the commit cannot leave the in-memory copy behind the database.
        """
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        if self._executor is None:
            raise RuntimeError("the broker's database thread is not running")
        future = loop.run_in_executor(
            self._executor, functools.partial(self._write_marked, fn, *args)
        )

        def on_commit(done: asyncio.Future[T]) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            self._commit_s.observe(time.perf_counter() - started)
            if changed is not None:
                self.publish_all(changed(done.result()))

        future.add_done_callback(on_commit)
        try:
            result = await asyncio.shield(future)
        except Exception as exc:
            name = type(exc).__name__
            self._writes.labels(kind=kind, outcome=_OUTCOME_LABEL.get(name, name)).inc()
            raise
        self._writes.labels(kind=kind, outcome="ok").inc()
        return result

    def _write_marked(self, fn: Callable[..., T], *args: Any) -> T:
        """On the database thread: the write, then the high-water mark grown to cover it,
        so no answer is newer than the mark (a failed write changes nothing to mark)."""
        result = fn(*args)
        self.custody.after_write()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._db(fn, *args)

    # -- releases and watches -------------------------------------------------------------
    def _publish(self, release: ReleaseJson) -> None:
        name = release["name"]
        cached = self.releases.get(name)
        # Commits can resume on the loop out of order; never go back to an older revision.
        if cached is not None and cached["revision"] >= release["revision"]:
            return
        self.releases[name] = release
        if cached is None or cached["phase"] != release["phase"]:
            self._phase_since[name] = self._clock()
        self._revision.labels(release=name).set(release["revision"])
        event = self._changed.pop(name, None)
        if event is not None:
            event.set()

    def publish_all(self, releases: list[ReleaseJson]) -> None:
        for release in releases:
            self._publish(release)

    def overdue_rollbacks(self) -> list[Overdue]:
        """The releases whose rollback has not moved for ``rollback_overdue_s``."""
        return all_overdue(self.releases, self._phase_since, self._clock(), self.rollback_overdue_s)

    def with_overdue(self, release: ReleaseJson) -> ReleaseJson:
        """``release`` as answered: with ``rollback_overdue`` while its rollback is overdue
        (left out otherwise, as the contract's ``Release`` writes it)."""
        found = overdue(
            release,
            self._phase_since.get(release["name"]),
            self._clock(),
            self.rollback_overdue_s,
        )
        return release if found is None else {**release, "rollback_overdue": found.to_json()}

    async def _hang_while_dropped(self, gone: Callable[[], bool]) -> bool:
        """Under drop_watch, answer nothing until the fault ends; False if the client left."""
        while self.faults.get("drop_watch") is not None and not self.closing:
            if gone():
                return False
            await asyncio.sleep(DROP_WATCH_POLL_S)
        return True

    async def watch(
        self, name: str, after: int, timeout_s: float, gone: Callable[[], bool]
    ) -> tuple[ReleaseJson | None, bool]:
        """The release once its revision differs from ``after``: ``(release, timed_out)``.
        ``gone()`` says whether the client went away (then ``(None, True)``).

        Waits on an ``asyncio.Event`` per release that a commit sets (and replaces); there
        is no polling of SQLite. Answers at once when ``after`` is not the current revision
        (above it too: the client's revision came from another database, e.g. a wiped
        state folder). Under the ``drop_watch`` fault it answers nothing until the fault
        ends or the client leaves.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.watchers += 1
        try:
            while True:
                if not await self._hang_while_dropped(gone):
                    return None, True
                release = self.releases.get(name)
                # Answer at once when the client is *ahead* too: its revision came from
                # another database (a wiped state folder), and waiting for the broker to
                # count up to it would freeze the client's config for minutes.
                if release is not None and release["revision"] != after:
                    return release, False
                remaining = deadline - loop.time()
                if remaining <= 0 or self.closing:
                    return release, True
                event = self._changed.get(name)
                if event is None:
                    event = self._changed[name] = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, WATCH_SLICE_S))
                if gone():
                    return None, True
        finally:
            self.watchers -= 1

    # -- routers ------------------------------------------------------------------------
    def _known_revision(self, release: str) -> int | None:
        """The highest revision of ``release`` this broker ever acknowledged, or None."""
        cached = self.releases.get(release)
        seen = [
            rev
            for rev in (
                None if cached is None else cached["revision"],
                self.custody.mark.acknowledged.releases.get(release),
                self.custody.mark.carried.release_floors.get(release),
            )
            if isinstance(rev, int)
        ]
        return max(seen) if seen else None

    def admit(self, beat: Heartbeat, identity: str) -> None:
        """Refuse a heartbeat whose claims this broker knows to be false: a revision it
        never issued (409 ``revision_ahead``), or a new router id past ``max_routers``
        from a credential any holder could use (``Crowded``)."""
        known = self._known_revision(beat.release)
        if known is not None and (beat.applied_revision or 0) > known:
            raise Conflicting(
                f"Router {beat.router_id!r} claims applied_revision {beat.applied_revision} "
                f"of release {beat.release!r}, but this broker never issued a revision "
                f"above {known}: a router reports only what it applied (GET "
                f"/v1/releases/{beat.release} gives the current one).",
                param="applied_revision",
                code="revision_ahead",
                extra={"known_revision": known},
            )
        if (
            identity in ("bound", "pod")
            or beat.router_id in self._routers
            or beat.router_id in self._gone
        ):
            return
        self._expire()
        if len(self._routers) + len(self._gone) >= self.max_routers:
            raise Crowded(
                f"Router {beat.router_id!r} is refused: {self.max_routers} routers are "
                "listed already (live or recent; this broker's --max-routers). Entries "
                f"leave the list {self.recent_s:g} s after their last heartbeat; give "
                "each router its own credential (python -m canarystack.broker.router_token) "
                "to be admitted beyond the cap.",
                param="router_id",
                code="too_many_routers",
                extra={"max_routers": self.max_routers},
            )

    def heartbeat(self, beat: Heartbeat, identity: str = "shared") -> None:
        self._gone.pop(beat.router_id, None)
        self._routers[beat.router_id] = RouterBeat(
            router_id=beat.router_id,
            release=beat.release,
            applied_revision=beat.applied_revision,
            last_seen=self._wall(),
            seen_mono=self._clock(),
            applied_at=beat.applied_at,
            canary_off_since=beat.canary_off_since,
            identity=identity,
        )

    def _expire(self) -> float:
        now = self._clock()
        for rid, beat in list(self._routers.items()):
            if now - beat.seen_mono > self.router_expiry_s:
                del self._routers[rid]
                self._gone[rid] = beat
        for rid, beat in list(self._gone.items()):
            if now - beat.seen_mono > self.recent_s:
                del self._gone[rid]
        return now

    @staticmethod
    def _beats_json(
        beats: dict[str, RouterBeat], now: float, release: str | None
    ) -> list[RouterBeatJson]:
        return [
            {
                "router_id": b.router_id,
                "release": b.release,
                "applied_revision": b.applied_revision,
                "applied_at": b.applied_at,
                "canary_off_since": b.canary_off_since,
                "identity": b.identity,
                "last_seen": b.last_seen,
                "age_s": round(now - b.seen_mono, 3),
            }
            for b in sorted(beats.values(), key=lambda b: b.router_id)
            if release is None or b.release == release
        ]

    def live_routers(self, release: str | None = None) -> list[RouterBeatJson]:
        now = self._expire()
        return self._beats_json(self._routers, now, release)

    def recent_routers(self, release: str | None = None) -> list[RouterBeatJson]:
        """Routers no longer live whose last heartbeat is less than ``recent_s`` old."""
        now = self._expire()
        return self._beats_json(self._gone, now, release)
