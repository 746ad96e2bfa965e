"""The broker's HTTP API (aiohttp), per docs/ARCHITECTURE.md §2.

Threading: SQLite calls block, and with ``synchronous=FULL`` every commit waits for an
fsync. Run on the event loop, that wait would stall every long-poll wake-up and router
heartbeat behind it, so all SQLite work runs on one dedicated thread
(a ``ThreadPoolExecutor(max_workers=1)``) holding the only connection. One thread also
serialises writes, which SQLite would do anyway. Reads of a release — the hot path: every
router watch and GET — are answered from an in-memory copy that is replaced after each
commit, so they never wait for the database.

Watch: ``GET /v1/releases/{name}?after=REV&timeout_s=S`` waits on an ``asyncio.Event``
per release that a commit sets (and replaces); there is no polling of SQLite. It also
answers at once when ``after`` is above the current revision (the client's revision came
from another database, e.g. a wiped state folder). A watch on
a release that does not exist yet waits for it to be created (a router may start before
the release does); if the timeout passes first it gets 404.

Faults: ``latency`` (``ms`` added to every /v1 request), ``unavailable`` (503 on every
/v1 request) and ``drop_watch`` (long-polls hang, answering nothing, until the client
disconnects or the fault ends; then they answer normally). /health, /metrics and /admin
are never faulted, so the harness can still observe and heal the broker.

Router heartbeats live in memory only: after a restart, routers reappear within one
heartbeat. A router whose heartbeats stop leaves ``routers`` after ``--router-expiry-s``
and is listed under ``recent`` for ``RECENT_ROUTER_FACTOR`` times that, so the rollback
executor can tell routers that just went quiet from no routers at all.

Input (``canarystack.broker.wire``): bodies of at most 256 KiB (413 above, checked
against ``Content-Length`` before reading), strict JSON (no NaN/Infinity, integers of at
most 32 digits, at most 64 levels, valid UTF-8), integers within SQLite's 64 bits, numbers
finite; query integers digits-only within a stated range; annotations and trip detail at
most 16 KiB as JSON (they are part of every history page). Every answer is written with
``allow_nan=False``. Event history is paged: ``GET .../events?after_seq=N&limit=L``
(L <= 10,000) answers ``{"events", "next_after_seq", "limit"}``, oldest first; a page
shorter than ``limit`` is the last. ``/health`` says ``max_watch_s`` (a router checks its
watch timeout against it) and ``router_expiry_s``.

This module must never answer a write before its commit returned, touch SQLite from the
event loop thread, or hold a long-poll past ``--max-watch-s`` (except under drop_watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

import canarystack
from canarystack.broker import capabilities
from canarystack.broker.api_spec import install as install_api_spec
from canarystack.broker.capabilities import Credentials
from canarystack.broker.digest import manifest_digest
from canarystack.broker.phases import Phase
from canarystack.broker.store import ReleasePatch, Store
from canarystack.broker.wire import (
    BROKER_MAX_BODY_BYTES,
    MAX_INT64,
    header_text,
    json_response,
    query_float,
    query_int,
    read_json_object,
    read_optional_object,
)
from canarystack.common import strictjson
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.auth import Forbidden
from canarystack.common.colour import Colour
from canarystack.common.errors import (
    BadRequest,
    Handler,
    NotFound,
    Unavailable,
    Unprocessable,
    parse_model,
)
from canarystack.common.faults import FaultParams, FaultRegistry, LatencyMs, NoParams
from canarystack.common.logs import get_logger

T = TypeVar("T")
Json = dict[str, Any]

# Module-level so tests can shorten them instead of sleeping.
DEFAULT_WATCH_TIMEOUT_S = 30.0
# A waiting long-poll wakes at least this often to notice a client that went away.
WATCH_SLICE_S = 1.0
# How often a long-poll hung by drop_watch checks whether the fault ended or the client left.
DROP_WATCH_POLL_S = 0.05
MAX_EVENTS_PER_PAGE = 10_000
# A router whose heartbeats stopped stays listed under "recent" this many expiry periods,
# so the rollback executor can tell "no router exists" from "the routers just went quiet".
RECENT_ROUTER_FACTOR = 3.0

_log = get_logger("broker")


# -- faults -------------------------------------------------------------------------------
FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyMs,
    "unavailable": NoParams,
    "drop_watch": NoParams,
}


# -- request bodies -----------------------------------------------------------------------
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# For path segments: fullmatch, because re's '$' also matches before a trailing newline.
_NAME_RE = re.compile(NAME_PATTERN[1:-1])
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Actor = Annotated[str, Field(min_length=1, max_length=200)]
Reason = Annotated[str, Field(max_length=4000)]
# Every number the broker stores must be finite (strictjson already refuses NaN and
# Infinity on the wire; the models refuse them again for any other path) and every integer
# must fit SQLite's signed 64 bits.
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
EpochSeconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_INT64)]


# An event's change is part of every page of history (up to MAX_EVENTS_PER_PAGE of them
# per answer), so what a client adds to one (an annotation, trip detail) stays small.
MAX_EVENT_FIELD_BYTES = 16 * 1024


def _small_json(value: dict[str, Any], field: str) -> dict[str, Any]:
    size = len(strictjson.dumps(value))
    if size > MAX_EVENT_FIELD_BYTES:
        raise ValueError(
            f"{field} is {size} bytes as JSON, over the limit of {MAX_EVENT_FIELD_BYTES}: it "
            "is stored in the release's event history and read back on every page; keep "
            "it to a few fields"
        )
    return value


class _Body(BaseModel):
    # Unknown fields are refused so that typos show instead of being ignored.
    model_config = ConfigDict(extra="forbid")


class Weights(_Body):
    canary: Annotated[float, Field(strict=True, ge=0, le=100, allow_inf_nan=False)]


# A trip's example colours (``canarystack.common.colour``): at most this many, each a
# request id and trace id the gate saw in the samples behind the trip, and their tag.
MAX_TRIP_COLOURS = 8
Token = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/=+-]{1,128}$")]


class TripColour(_Body):
    request_id: Token
    trace_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    tag: Token | None = None


class TripEvidence(_Body):
    test: Literal["drift", "latency", "errors", "no_data"]
    bucket: Annotated[str, Field(min_length=1, max_length=64)]
    statistic: Number
    threshold: Number
    samples: Count
    first_sample_time: Number
    last_sample_time: Number
    tripped_at: Number
    detail: dict[str, Any] = Field(default_factory=dict)
    # Optional (older gates send none): stored only when sent.
    colours: Annotated[list[TripColour], Field(max_length=MAX_TRIP_COLOURS)] | None = None

    @field_validator("detail")
    @classmethod
    def _small_detail(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _small_json(value, "trip.detail")

    @model_validator(mode="after")
    def _ordered(self) -> TripEvidence:
        if self.last_sample_time < self.first_sample_time:
            raise ValueError(
                "trip.last_sample_time is before trip.first_sample_time; send the window's "
                "first and last sample times in order"
            )
        return self


class RegisterVersion(_Body):
    version: Name
    manifest: Any
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class QuarantineVersion(_Body):
    actor: Actor | None = None
    reason: Reason = ""


class CreateRelease(_Body):
    name: Name
    stable: Name
    canary: Name | None = None
    weights: Weights = Field(default_factory=lambda: Weights(canary=0))
    actor: Actor | None = None
    reason: Reason = ""


class PatchRelease(_Body):
    expected_revision: Count
    weights: Weights | None = None
    phase: Phase | None = None
    canary: Name | None = None
    trip: TripEvidence | None = None
    actor: Actor | None = None
    reason: Reason = ""


class Annotation(_Body):
    actor: Actor | None = None
    change: dict[str, Any]
    reason: Reason = ""

    @field_validator("change")
    @classmethod
    def _small_change(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _small_json(value, "change")

    @model_validator(mode="after")
    def _has_annotation(self) -> Annotation:
        note = self.change.get("annotation")
        if not isinstance(note, str) or not note:
            raise ValueError(
                "change.annotation must be a non-empty string naming the annotation "
                "(e.g. 'fault_injected')"
            )
        return self


class Heartbeat(_Body):
    router_id: Annotated[str, Field(min_length=1, max_length=200)]
    release: Name
    applied_revision: Count | None
    # Optional (older routers omit them): when the router applied that revision, and since
    # when its effective canary weight is 0 (null while the canary gets traffic).
    applied_at: EpochSeconds | None = None
    canary_off_since: EpochSeconds | None = None


# -- the broker -----------------------------------------------------------------------------
@dataclass
class RouterBeat:
    router_id: str
    release: str
    applied_revision: int | None
    last_seen: float  # epoch seconds, for people
    seen_mono: float  # for expiry
    applied_at: float | None = None  # the router's clock, epoch seconds
    canary_off_since: float | None = None  # the router's clock; None: canary gets traffic


class Broker:
    """The in-process state around the store: cached releases, watches, heartbeats."""

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
    ) -> None:
        self.state_dir = Path(state_dir)
        self.component = component
        self.credentials = credentials or capabilities.single_credential(component.admin_token)
        self.faults = component.faults
        self.router_expiry_s = router_expiry_s
        self.max_watch_s = max_watch_s
        self._clock = clock
        self._wall = wall
        self._executor: ThreadPoolExecutor | None = None
        self._store: Store | None = None
        self.releases: dict[str, Json] = {}
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
        for release in await self._db(self.store.list_releases):
            self._publish(release)
        _log.info(
            "store_opened",
            path=str(self.store.path),
            releases=len(self.releases),
            journal_mode="wal",
            synchronous="full",
        )

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
        changed: Callable[[T], list[Json]] | None = None,
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
        future = loop.run_in_executor(self._executor, functools.partial(fn, *args))

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
            self._writes.labels(kind=kind, outcome=type(exc).__name__).inc()
            raise
        self._writes.labels(kind=kind, outcome="ok").inc()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._db(fn, *args)

    # -- releases and watches -------------------------------------------------------------
    def _publish(self, release: Json) -> None:
        name = release["name"]
        cached = self.releases.get(name)
        # Commits can resume on the loop out of order; never go back to an older revision.
        if cached is not None and cached["revision"] >= release["revision"]:
            return
        self.releases[name] = release
        self._revision.labels(release=name).set(release["revision"])
        event = self._changed.pop(name, None)
        if event is not None:
            event.set()

    def publish_all(self, releases: list[Json]) -> None:
        for release in releases:
            self._publish(release)

    async def _hang_while_dropped(self, request: web.Request) -> bool:
        """Under drop_watch, answer nothing until the fault ends; False if the client left."""
        while self.faults.get("drop_watch") is not None and not self.closing:
            if _client_gone(request):
                return False
            await asyncio.sleep(DROP_WATCH_POLL_S)
        return True

    async def watch(
        self, name: str, after: int, timeout_s: float, request: web.Request
    ) -> tuple[Json | None, bool]:
        """The release once its revision differs from ``after``: ``(release, timed_out)``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.watchers += 1
        try:
            while True:
                if not await self._hang_while_dropped(request):
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
                if _client_gone(request):
                    return None, True
        finally:
            self.watchers -= 1

    # -- routers ------------------------------------------------------------------------
    def heartbeat(self, beat: Heartbeat) -> None:
        self._gone.pop(beat.router_id, None)
        self._routers[beat.router_id] = RouterBeat(
            router_id=beat.router_id,
            release=beat.release,
            applied_revision=beat.applied_revision,
            last_seen=self._wall(),
            seen_mono=self._clock(),
            applied_at=beat.applied_at,
            canary_off_since=beat.canary_off_since,
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
    def _beats_json(beats: dict[str, RouterBeat], now: float, release: str | None) -> list[Json]:
        return [
            {
                "router_id": b.router_id,
                "release": b.release,
                "applied_revision": b.applied_revision,
                "applied_at": b.applied_at,
                "canary_off_since": b.canary_off_since,
                "last_seen": b.last_seen,
                "age_s": round(now - b.seen_mono, 3),
            }
            for b in sorted(beats.values(), key=lambda b: b.router_id)
            if release is None or b.release == release
        ]

    def live_routers(self, release: str | None = None) -> list[Json]:
        now = self._expire()
        return self._beats_json(self._routers, now, release)

    def recent_routers(self, release: str | None = None) -> list[Json]:
        """Routers no longer live whose last heartbeat is less than ``recent_s`` old."""
        now = self._expire()
        return self._beats_json(self._gone, now, release)


BROKER: web.AppKey[Broker] = web.AppKey("broker", Broker)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


# -- helpers ------------------------------------------------------------------------------
def _actor(given: str | None, request: web.Request) -> str:
    actor = given or header_text(request, "x-actor")
    if not actor:
        raise BadRequest(
            "Who is making this change? Give 'actor' in the body (or an x-actor header); "
            "it is recorded in the release's event history.",
            param="actor",
        )
    return actor


def _name(request: web.Request, key: str) -> str:
    value = request.match_info[key]
    if not _NAME_RE.fullmatch(value):
        raise BadRequest(
            f"{key} {value!r} is not a valid name: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, at most 128 characters.",
            param=key,
        )
    return value


def _broker(request: web.Request) -> Broker:
    return request.app[BROKER]


def _admin(request: web.Request, write: str) -> Broker:
    """The broker, after checking that the caller's credential may make ``write``."""
    return _authorized(request, write)[0]


def _authorized(request: web.Request, write: str) -> tuple[Broker, str]:
    broker = _broker(request)
    credential = broker.credentials.identify(request)
    capabilities.check_write(broker.credentials, credential, write)
    return broker, credential


# -- handlers: versions ---------------------------------------------------------------------
async def register_version(request: web.Request) -> web.Response:
    broker = _admin(request, "register_version")
    body = parse_model(RegisterVersion, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    computed = manifest_digest(body.manifest)
    if computed != body.digest:
        raise Unprocessable(
            f"Digest mismatch for version {body.version!r}: the request says {body.digest} "
            f"but the manifest hashes to {computed} (sha256 of the UTF-8 string, or of "
            "json.dumps(manifest, sort_keys=True, separators=(',', ':'))). Send the digest "
            "of exactly this manifest.",
            param="digest",
            code="digest_mismatch",
            extra={"given_digest": body.digest, "computed_digest": computed},
        )
    version, created = await broker.write(
        "register_version",
        broker.store.register_version,
        body.version,
        body.digest,
        body.manifest,
        time.time(),
    )
    if created:
        _log.info(
            "version_registered",
            version=body.version,
            digest=body.digest,
            actor=header_text(request, "x-actor") or "admin",
        )
    return json_response(version, status=201 if created else 200)


async def list_versions(request: web.Request) -> web.Response:
    broker = _broker(request)
    return json_response({"versions": await broker.read(broker.store.list_versions)})


async def get_version(request: web.Request) -> web.Response:
    broker = _broker(request)
    name = _name(request, "version")
    version = await broker.read(broker.store.get_version, name)
    if version is None:
        raise NotFound(
            f"No version {name!r}: GET /v1/versions lists the registered ones.",
            param="version",
        )
    return json_response(version)


async def quarantine_version(request: web.Request) -> web.Response:
    broker, credential = _authorized(request, "quarantine_version")
    name = _name(request, "version")
    if credential == capabilities.ROLLBACK and not any(
        (rel.get("canary") or {}).get("version") == name for rel in broker.releases.values()
    ):
        raise Forbidden(
            f"The rollback credential may only quarantine a release's canary version; "
            f"{name!r} is the canary of no release, so it cannot quarantine it.",
            param="version",
            code="forbidden",
            extra={"credential": credential, "may": capabilities.GRANTS[credential]},
        )
    data = await read_optional_object(request, BROKER_MAX_BODY_BYTES)
    body = parse_model(QuarantineVersion, data or {})
    actor = _actor(body.actor, request)
    version, changed = await broker.write(
        "quarantine",
        broker.store.quarantine_version,
        name,
        actor,
        body.reason,
        time.time(),
        changed=lambda result: result[1],
    )
    if changed:
        _log.info("version_quarantined", version=name, actor=actor, releases=len(changed))
    return json_response(version)


# -- handlers: releases ---------------------------------------------------------------------
async def list_releases(request: web.Request) -> web.Response:
    broker = _broker(request)
    return json_response({"releases": [broker.releases[n] for n in sorted(broker.releases)]})


async def create_release(request: web.Request) -> web.Response:
    broker = _admin(request, "create_release")
    body = parse_model(CreateRelease, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    actor = _actor(body.actor, request)
    release = await broker.write(
        "create_release",
        broker.store.create_release,
        body.name,
        body.stable,
        body.canary,
        body.weights.canary,
        actor,
        body.reason,
        time.time(),
        changed=lambda release: [release],
    )
    _log.info("release_created", release=body.name, actor=actor, revision=release["revision"])
    return json_response(release, status=201)


async def get_release(request: web.Request) -> web.Response:
    broker = _broker(request)
    name = _name(request, "name")
    if "after" not in request.query:
        if "timeout_s" in request.query:
            raise BadRequest(
                "Query parameter 'timeout_s' only applies to a watch: give 'after' (the "
                "revision you have) too.",
                param="timeout_s",
            )
        release = broker.releases.get(name)
        if release is None:
            raise NotFound(f"No release {name!r}: GET /v1/releases lists them.", param="name")
        return json_response(release)
    after = query_int(request, "after", None)
    timeout_s = _watch_timeout(request, broker.max_watch_s)
    release, timed_out = await broker.watch(name, after, timeout_s, request)
    if release is None:
        raise NotFound(
            f"No release {name!r} (the watch waited {timeout_s:g} s for it to be created).",
            param="name",
        )
    headers = {"x-watch-timeout": "true"} if timed_out else {}
    return json_response(release, headers=headers)


def _trip_json(trip: TripEvidence) -> Json:
    out = trip.model_dump()
    if out["colours"] is None:  # not sent: the stored trip stays as the gate wrote it
        del out["colours"]
    return out


def _watch_timeout(request: web.Request, max_watch_s: float) -> float:
    raw = request.query.get("timeout_s")
    if raw is None:
        return min(DEFAULT_WATCH_TIMEOUT_S, max_watch_s)
    value = query_float(raw)  # NaN unless a finite decimal: refuses inf, 1e400, '1_0', ' 5'
    if not (0 < value <= max_watch_s):  # also refuses nan
        raise BadRequest(
            f"Query parameter 'timeout_s' is {raw[:40]!r}: give seconds > 0 and <= "
            f"{max_watch_s:g} (this broker's --max-watch-s) as a finite decimal number.",
            param="timeout_s",
        )
    return value


async def patch_release(request: web.Request) -> web.Response:
    broker, credential = _authorized(request, "patch_release")
    name = _name(request, "name")
    body = parse_model(PatchRelease, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    actor = _actor(body.actor, request)
    patch = ReleasePatch(
        expected_revision=body.expected_revision,
        canary_weight=None if body.weights is None else body.weights.canary,
        phase=body.phase,
        canary_set="canary" in body.model_fields_set,
        canary=body.canary,
        trip=None if body.trip is None else _trip_json(body.trip),
    )
    fields = frozenset(body.model_fields_set & {"phase", "weights", "canary", "trip"})
    authorize = functools.partial(
        capabilities.check_patch,
        credential,
        fields=fields,
        canary_weight=patch.canary_weight,
    )
    release, changed = await broker.write(
        "patch_release",
        broker.store.patch_release,
        name,
        patch,
        actor,
        body.reason,
        time.time(),
        authorize,
        changed=lambda result: [result[0]] if result[1] else [],
    )
    if changed and body.trip is not None and body.trip.colours:
        hops, now = request.app[COMPONENT].hops, time.time()
        for c in body.trip.colours:
            colour = Colour(c.request_id, c.trace_id, secrets.token_hex(8), None, c.tag)
            hops.record("trip_evidence", colour, now)
    if changed:
        _log.info(
            "release_changed",
            release=name,
            revision=release["revision"],
            phase=release["phase"],
            canary_weight=release["weights"]["canary"],
            actor=actor,
        )
    return json_response(release)


# -- handlers: events -----------------------------------------------------------------------
async def list_events(request: web.Request) -> web.Response:
    broker = _broker(request)
    name = _name(request, "name")
    after_seq = query_int(request, "after_seq", 0)
    limit = query_int(request, "limit", MAX_EVENTS_PER_PAGE, minimum=1, maximum=MAX_EVENTS_PER_PAGE)
    events = await broker.read(broker.store.events, name, after_seq, limit)
    # Oldest first after after_seq; a page shorter than limit is the last one. Readers
    # repeat with after_seq=next_after_seq until then.
    next_after_seq = events[-1]["seq"] if events else after_seq
    payload = {"events": events, "next_after_seq": next_after_seq, "limit": limit}
    # A full page is megabytes of JSON: write it off the event loop.
    body = await asyncio.get_running_loop().run_in_executor(None, strictjson.dumps_bytes, payload)
    return web.Response(body=body, content_type="application/json")


async def annotate(request: web.Request) -> web.Response:
    broker = _admin(request, "annotate")
    name = _name(request, "name")
    body = parse_model(Annotation, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    actor = _actor(body.actor, request)
    event = await broker.write(
        "annotate", broker.store.annotate, name, body.change, actor, body.reason, time.time()
    )
    return json_response(event, status=201)


# -- handlers: credentials ---------------------------------------------------------------
async def whoami(request: web.Request) -> web.Response:
    """Which credential the caller holds and what it grants (401 for an unknown one)."""
    broker = _broker(request)
    credential = broker.credentials.identify(request)
    return json_response(
        {
            "credential": credential,
            "capabilities": broker.credentials.capabilities(credential),
            "single_credential_mode": broker.credentials.single,
        }
    )


# -- handlers: routers ----------------------------------------------------------------------
async def heartbeat(request: web.Request) -> web.Response:
    broker = _admin(request, "heartbeat")
    body = parse_model(Heartbeat, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    broker.heartbeat(body)
    return json_response({"ok": True})


async def list_routers(request: web.Request) -> web.Response:
    broker = _broker(request)
    release = request.query.get("release") or None
    return json_response(
        {
            "routers": broker.live_routers(release),
            "expiry_s": broker.router_expiry_s,
            # Not live any more, but heartbeating less than recent_s ago: a reader must not
            # take an empty "routers" for "no router exists" while this is not empty.
            "recent": broker.recent_routers(release),
            "recent_s": broker.recent_s,
        }
    )


# -- app ------------------------------------------------------------------------------------
@web.middleware
async def fault_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/v1/"):
        faults = request.app[COMPONENT].faults
        latency = faults.get("latency")
        if isinstance(latency, LatencyMs) and latency.ms > 0:
            await faults.delay("latency", latency.ms / 1000.0)
        if faults.get("unavailable") is not None:
            raise Unavailable(
                "The broker is unavailable (injected fault 'unavailable'); retry with "
                "backoff — it ends when its ttl_s runs out or DELETE /admin/faults clears it."
            )
    return await handler(request)


async def _broker_ctx(app: web.Application) -> AsyncIterator[None]:
    broker = app[BROKER]
    await broker.start()
    yield
    await broker.stop()


async def _on_shutdown(app: web.Application) -> None:
    app[BROKER].wake_all()


def build_app(
    state_dir: Path,
    admin_token: str | None,
    *,
    router_expiry_s: float = 3.0,
    max_watch_s: float = 60.0,
    max_fault_ttl_s: float = 600.0,
    credentials: Credentials | None = None,
) -> web.Application:
    """The broker app; the store opens when the app starts, not here.

    ``credentials`` (``--credentials-dir``): one token per capability, and ``admin_token``
    is then the broker's fault credential only. Without them, single-credential mode: the
    admin token grants every write.
    """
    faults = FaultRegistry("broker", FAULT_KINDS, max_ttl_s=max_fault_ttl_s)
    component = Component(
        name="broker", version=canarystack.__version__, admin_token=admin_token, faults=faults
    )
    broker = Broker(
        state_dir,
        component,
        router_expiry_s=router_expiry_s,
        max_watch_s=max_watch_s,
        credentials=credentials,
    )
    component.health_extra = lambda: {
        "releases": len(broker.releases),
        "watchers": broker.watchers,
        # A router checks its --watch-timeout-s against this at start (a longer one would
        # be refused with 400 on every watch and never apply a trip).
        "max_watch_s": broker.max_watch_s,
        "router_expiry_s": broker.router_expiry_s,
    }
    app = create_app(component, client_max_size=BROKER_MAX_BODY_BYTES)
    app.middlewares.append(fault_middleware)
    app[BROKER] = broker
    app.cleanup_ctx.append(_broker_ctx)
    app.on_shutdown.append(_on_shutdown)
    r = app.router
    r.add_post("/v1/versions", register_version)
    r.add_get("/v1/versions", list_versions)
    r.add_get("/v1/versions/{version}", get_version)
    r.add_post("/v1/versions/{version}/quarantine", quarantine_version)
    r.add_get("/v1/releases", list_releases)
    r.add_post("/v1/releases", create_release)
    r.add_get("/v1/releases/{name}", get_release)
    r.add_patch("/v1/releases/{name}", patch_release)
    r.add_get("/v1/releases/{name}/events", list_events)
    r.add_post("/v1/releases/{name}/events", annotate)
    r.add_post("/v1/routers/heartbeat", heartbeat)
    r.add_get("/v1/routers", list_routers)
    r.add_get("/v1/whoami", whoami)
    install_api_spec(app)
    return app
