"""The router's view of its release: watched from the broker, cached on disk, fail-safe.

This module must never block the request path: requests read ``ConfigWatcher.current``,
an immutable snapshot swapped in one assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from canary_contract.broker import Release
from canary_contract.json import JsonObject
from canarystack.broker.client import BrokerClient, FollowKind
from canarystack.common.logs import get_logger
from canarystack.router.snapshot import (
    Snapshot,
    auth_status,
    cache_path,
    canary_off_reason,
    effective_weight,
    read_cache,
    write_cache,
)

START_TIMEOUT_S = 2.0
# The fail-safe bound: this long without an answer from the broker (a release, or a watch
# that timed out on the broker's side: both say "this is the release now") and the router
# is at 0 % canary. Counted from the last answer, not from the first error, so it holds
# for a broker that stops answering mid-watch (SIGSTOP, a hung host) too (#27, finding 6).
WATCH_ERROR_FAILSAFE_S = 10.0
WATCH_TIMEOUT_S = 10.0  # long-poll length we ask the broker for (at most half the bound)
WATCH_SLACK_MAX_S = 5.0  # how late, at most, a watch answer may come before it counts as hung
# How often, at least, the router checks the bound (it wakes at the deadline otherwise).
FAILSAFE_CHECK_MAX_S = 1.0
STALE_POLL_S = 0.5
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 2.0

_log = get_logger("router")

__all__ = [
    "ConfigWatcher",
    "Snapshot",
    "auth_status",
    "cache_path",
    "canary_off_reason",
    "effective_weight",
    "read_cache",
    "write_cache",
]


class ConfigWatcher:
    """The release this router serves with, watched from the broker.

    - At start the router asks the broker once (bounded by ``START_TIMEOUT_S``); when that
      fails it uses the last-known release from ``DIR/router-<id>.json``; with neither it
      runs with no config, which means 0% canary.
    - Then it watches: ``GET /v1/releases/{name}?after=REV&timeout_s=S`` long-polls; every
      release with a new revision is applied at once, written to the cache file atomically
      (temp file + fsync + rename) and reported by a heartbeat right away; heartbeats also go
      out every ``heartbeat_s``. A heartbeat carries the revision applied, when it was applied
      (``applied_at``) and since when the effective canary weight has been 0
      (``canary_off_since``: the apply that made it 0, kept while it stays 0; null while the
      canary gets traffic). The router starts with no config, i.e. at 0%, so a router that
      never served the canary reports its own start: an upper bound, never too early.
    - Broker errors are counted by kind and retried with a short, capped backoff; the router
      keeps serving with the config it has — for at most ``failsafe_s`` after the broker's
      last answer (``last_answer``): past that, whether watches fail or hang, the router is
      on a fail-safe snapshot (source ``"failsafe"``, 0% canary) until the broker answers
      again. Long polls last at most half of ``failsafe_s``, so a healthy broker always
      answers well within it; and the first answer ends the fail-safe for good, since the
      bound then counts again from that answer (no flapping on recovery). 401/403 answers
      are reported (``broker_auth``), never taken for anything but a refused credential.
    - Effective canary weight (``snapshot.py``): 0 with no config, no canary version, a
      quarantined canary, or a canary-off phase, whatever ``weights.canary`` says; else
      ``weights.canary``. ``tripped`` takes effect in the same watch round it arrives.
    - The watch is ``BrokerClient.follow`` (its reads, error classification and backoff);
      this module chooses before each step what it waits past (stale, fail-safe).
    - The ``stale_config`` fault stops applying updates (the watch keeps running, so the
      router catches up as soon as the fault ends); heartbeats keep reporting the revision
      really applied.
    """

    def __init__(
        self,
        broker: BrokerClient | None,
        *,
        release: str,
        router_id: str,
        state_dir: str | Path,
        heartbeat_s: float = 1.0,
        watch_timeout_s: float = WATCH_TIMEOUT_S,
        is_stale: Callable[[], bool] = lambda: False,
        on_error: Callable[[str], None] = lambda kind: None,
        on_heartbeat_error: Callable[[], None] = lambda: None,
        on_apply: Callable[[Snapshot], None] = lambda snap: None,
        on_auth_error: Callable[[int], None] = lambda status: None,
        failsafe_s: float = WATCH_ERROR_FAILSAFE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker = broker
        self.release = release
        self.router_id = router_id
        self.cache = cache_path(state_dir, router_id)
        self.heartbeat_s = heartbeat_s
        self.is_stale = is_stale
        self.on_error = on_error
        self.on_heartbeat_error = on_heartbeat_error
        self.on_apply = on_apply
        self.on_auth_error = on_auth_error
        self.failsafe_s = failsafe_s
        self.clock = clock
        self.current = Snapshot.of(None, "none")
        self.last_seen_revision = 0
        self.watch_errors = 0
        # Monotonic time of the broker's last answer with the release (the start until then).
        self.last_answer = clock()
        # Per call ("watch", "heartbeat"): "ok" | "unauthorized" | "forbidden", last error.
        self.auth: dict[str, str] = {"watch": "ok", "heartbeat": "ok"}
        self.auth_error: str | None = None
        # The long poll's length: within half the fail-safe bound (the follower reads it).
        self.watch_timeout_s = min(watch_timeout_s, failsafe_s / 2)
        self._poll_s = self.watch_timeout_s
        self._beat_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- applying -------------------------------------------------------------------
    def _use(self, snap: Snapshot, log: Callable[..., None], event: str, **fields: Any) -> None:
        """Make ``snap`` the applied config, tell the router, and log ``event`` with the
        release, the snapshot's revision and ``fields``."""
        self.current = snap
        self.on_apply(snap)
        log(event, release=self.release, revision=snap.revision, **fields)

    def apply(self, release: JsonObject, source: str) -> None:
        snap = Snapshot.of(release, source)
        previous = self.current
        if snap.weight_pct == 0 and previous.weight_pct == 0:
            # Still 0%: the canary stopped getting traffic at the earlier apply, not now.
            snap = replace(snap, canary_off_since=previous.canary_off_since)
        self._use(
            snap,
            _log.info,
            "config_applied",
            previous_revision=previous.revision,
            phase=snap.phase,
            effective_canary_weight=snap.weight_pct,
            canary_off_since=snap.canary_off_since,
            source=source,
        )
        if source == "broker":
            try:
                write_cache(self.cache, release)
            except OSError as exc:
                _log.error("config_cache_write_failed", path=str(self.cache), error=str(exc))
            self._beat_now.set()

    def _offer(self, release: Release) -> None:
        rev = release.revision
        self.last_seen_revision = rev
        if self.is_stale():
            if rev != self.current.revision:
                _log.info("config_update_ignored", revision=rev, reason="stale_config fault")
            return
        if self.current.source == "broker" and rev == self.current.revision:
            return
        # The snapshot and the cache file keep the release as the broker's JSON.
        self.apply(release.to_wire(), "broker")

    @property
    def broker_auth(self) -> str:
        """The worst credential answer of the last watch and heartbeat."""
        for status in ("forbidden", "unauthorized"):
            if status in self.auth.values():
                return status
        return "ok"

    def _auth_result(self, call: str, exc: BaseException | None) -> None:
        """Record a call's credential answer: 401/403 set it, a success clears it; any
        other failure (a timeout, a 5xx) says nothing about the credential."""
        status = getattr(exc, "status", None) if exc is not None else None
        result = auth_status(status if isinstance(status, int) else None)
        if exc is not None and result == "ok":
            return
        if result != "ok":
            assert isinstance(status, int)
            self.on_auth_error(status)
            error = f"{type(exc).__name__}: {exc}"
            if self.auth[call] != result:
                _log.error(
                    "broker_auth_refused",
                    call=call,
                    status=status,
                    error=error,
                    effect="retried with backoff; check the router's heartbeat credential "
                    "(--broker-token-file)",
                )
            self.auth_error = error
        elif self.auth[call] != "ok":
            _log.info("broker_auth_recovered", call=call)
        self.auth[call] = result

    def _error(self, kind: str, exc: BaseException) -> None:
        self.watch_errors += 1
        self.on_error(kind)
        self._auth_result("watch", exc)
        _log.warning("broker_watch_error", kind=kind, error=f"{type(exc).__name__}: {exc}")
        self.check_failsafe()

    def check_failsafe(self) -> float:
        """Go fail-safe once the broker's last answer is ``failsafe_s`` old, whatever the
        watch is doing (failing, hanging, backing off); the seconds left until then."""
        silent_s = self.clock() - self.last_answer
        if self.current.source == "failsafe" or not self.current.configured:
            return self.failsafe_s  # already at 0% (with no config the canary is off anyway)
        if silent_s >= self.failsafe_s:
            self.fail_safe(silent_s)
            return self.failsafe_s
        return self.failsafe_s - silent_s

    def _watch_ok(self) -> None:
        self.last_answer = self.clock()
        self._auth_result("watch", None)

    def fail_safe(self, failing_s: float) -> None:
        """0% canary until a watch succeeds again (the snapshot keeps its revision)."""
        previous = self.current
        snap = previous.fail_safe()
        self._use(
            snap,
            _log.error,
            "config_failsafe",
            failing_s=round(failing_s, 3),
            bound_s=self.failsafe_s,
            effect="0% canary until the broker answers a watch",
        )
        self._beat_now.set()

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Initial config (broker, else cache, else none); then the watch + heartbeat tasks."""
        got = False
        if self.broker is not None:
            try:
                release = await asyncio.wait_for(
                    self.broker.get_release(self.release), START_TIMEOUT_S
                )
                self._offer(release)
                self._watch_ok()
                got = True
            except Exception as exc:
                self._error(_kind(exc), exc)
        if not got:
            cached = read_cache(self.cache, self.release)
            if cached is not None:
                self.apply(cached, "cache")
                self.last_seen_revision = self.current.revision
            else:
                _log.warning(
                    "config_none", release=self.release, effect="0% canary until the broker answers"
                )
        if self.broker is not None:
            self._tasks = [
                asyncio.create_task(self._watch_loop()),
                asyncio.create_task(self._heartbeat_loop()),
                asyncio.create_task(self._failsafe_loop()),
            ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _watch_loop(self) -> None:
        """Follow the release (``BrokerClient.follow``: the reads, their errors and the
        backoff), choosing before each step what it waits past."""
        assert self.broker is not None
        follower = self.broker.follow(
            self.release,
            lambda: self._poll_s,
            backoff_s=BACKOFF_MIN_S,
            max_backoff_s=BACKOFF_MAX_S,
        )
        while True:
            stale = self.is_stale()
            if self.current.source == "failsafe":
                # Leave fail-safe on the first answer (a plain read), not at the end of a
                # long poll.
                follower.after = None
                limit_s = START_TIMEOUT_S
            else:
                # While stale, watch from the revision seen, not the one applied: no
                # spinning. With no config yet, after=0 long-polls until the release exists.
                follower.after = self.last_seen_revision if stale else self.current.revision
                # Short polls while stale, so the pending revision applies soon after the
                # fault expires rather than at the end of a long poll.
                limit_s = self._poll_s = (
                    min(self.watch_timeout_s, STALE_POLL_S) if stale else self.watch_timeout_s
                )
            # A watch answer may come this late (network, a busy broker); past it the
            # call counts as hung. A quarter of the bound: a hung long poll is retried as a
            # plain read well before the fail-safe would fire for it.
            slack_s = min(WATCH_SLACK_MAX_S, self.failsafe_s / 4)
            try:
                event = await asyncio.wait_for(anext(follower), limit_s + slack_s)
            except TimeoutError as exc:
                follower.retry()  # backs off as after any error
                self._error(_kind(exc), exc)
                continue
            if event.kind is FollowKind.RELEASE and event.release is not None:
                self._offer(event.release)
                self._watch_ok()
            else:
                error = event.error or RuntimeError(f"broker follow: {event.kind}")
                self._error(_kind(error), error)

    async def _heartbeat_loop(self) -> None:
        assert self.broker is not None
        failing = False
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._beat_now.wait(), self.heartbeat_s)
            self._beat_now.clear()
            snap = self.current
            if not snap.configured:
                continue  # nothing applied yet: no revision to report
            try:
                await asyncio.wait_for(
                    self.broker.heartbeat(
                        self.router_id,
                        self.release,
                        snap.revision,
                        applied_at=snap.applied_at,
                        canary_off_since=snap.canary_off_since,
                    ),
                    max(1.0, self.heartbeat_s * 2),
                )
                if failing:
                    _log.info("broker_heartbeat_recovered")
                failing = False
                self._auth_result("heartbeat", None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.on_heartbeat_error()
                self._auth_result("heartbeat", exc)
                if not failing:
                    _log.warning("broker_heartbeat_failed", error=f"{type(exc).__name__}: {exc}")
                failing = True

    async def _failsafe_loop(self) -> None:
        """Check the bound at its deadline (and at least every ``FAILSAFE_CHECK_MAX_S``),
        not only when a watch call returns: a watch may hang for its whole timeout."""
        while True:
            left_s = self.check_failsafe()
            await asyncio.sleep(min(max(left_s, 0.01), FAILSAFE_CHECK_MAX_S))


def _kind(exc: BaseException) -> str:
    """A short label for metrics: timeout, unavailable, not_found, http_<status>, connect..."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        if status == 404:
            return "not_found"
        if status == 503:
            return "unavailable"
        return f"http_{status}"
    name = type(exc).__name__
    if "Unavailable" in name:
        return "unavailable"
    if "Connect" in name:
        return "connect"
    return name.lower()
