"""``BrokerClient``: the async client the router, gate, rollback executor and stack use.
Over 400 lines because it is one short method per broker API call, over one transport;
the exceptions (``client_errors``) and ``follow()`` (``follow``) stand alone.

This module must never create or close the session it is given, retry a write on its own
(a retried write could apply twice; compare-and-set is the caller's decision), or import
the broker server.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NotRequired, TypedDict, TypeVar

import aiohttp

from canary_contract import strictjson
from canary_contract.broker import (
    Event,
    EventPage,
    Release,
    ReleaseList,
    RouterList,
    TripRecord,
    Version,
    VersionList,
)
from canary_contract.errors import ContractError
from canarystack.broker.client_errors import (
    BadBrokerAnswer,
    BrokerError,
    BrokerNotFound,
    BrokerRequestError,
    BrokerUnavailable,
    IllegalTransition,
    RevisionConflict,
    error_from,
)
from canarystack.broker.digest import manifest_digest
from canarystack.broker.follow import FollowEvent, FollowKind, ReleaseFollower
from canarystack.broker.records import WeightsJson

__all__ = [
    "UNSET",
    "BadBrokerAnswer",
    "BrokerClient",
    "BrokerError",
    "BrokerNotFound",
    "BrokerRequestError",
    "BrokerUnavailable",
    "FollowEvent",
    "FollowKind",
    "IllegalTransition",
    "ReleaseFollower",
    "RevisionConflict",
    "manifest_digest",
]

R = TypeVar("R", Release, ReleaseList, Version, VersionList, Event, EventPage, RouterList)

# Module-level so callers and tests can change them.
DEFAULT_TIMEOUT_S = 10.0
# A watch may legitimately take timeout_s; allow this much more before giving up on it.
WATCH_GRACE_S = 5.0
# Events asked for per request; the broker answers at most 10,000 (its MAX_EVENTS_PER_PAGE).
EVENTS_PAGE_SIZE = 10_000
# Give up paging after this many pages in one call (a broker that never ends a page).
MAX_EVENT_PAGES = 10_000


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET = _Unset.UNSET


class ReleasePatch(TypedDict):
    """The body of ``PATCH /v1/releases/{name}`` (``patch_release``): each change only
    when asked for (``actor`` added by ``_write``)."""

    expected_revision: int
    reason: str
    weights: NotRequired[WeightsJson]
    phase: NotRequired[str]
    canary: NotRequired[str | None]
    trip: NotRequired[TripRecord]


class RouterHeartbeat(TypedDict):
    """The body of ``POST /v1/routers/heartbeat`` (``heartbeat``); the times only when
    given."""

    router_id: str
    release: str
    applied_revision: int | None
    applied_at: NotRequired[float]
    canary_off_since: NotRequired[float]


def _typed(record: type[R], data: Mapping[str, object], method: str, url: str) -> R:
    """``data`` as the contract's ``record``, or ``BadBrokerAnswer`` naming the field."""
    try:
        return record.from_wire(data)
    except ContractError as exc:
        raise BadBrokerAnswer(f"{method} {url}: {exc}", method=method, url=url) from None


class BrokerClient:
    """Async client for one broker. Cheap to build; holds no connection of its own.

    The caller passes its own ``aiohttp.ClientSession`` in (as with httpx), so it controls
    pooling and lifetime, and tests can aim the client at a real broker::

        async with aiohttp.ClientSession() as session:
            broker = BrokerClient(session, "http://127.0.0.1:18100", token, actor="rollback")
            release = await broker.get_release("default")
            release = await broker.watch("default", after=release.revision, timeout_s=30)
            await broker.patch_release("default", release.revision, canary_weight=0)

    Every answer is the contract's typed, frozen record (``canary_contract.broker``):
    ``Release`` (``get_release``, ``watch``, ``create_release``, ``patch_release``,
    ``release_records``), ``Version`` (``register_version``, ``version_record``,
    ``quarantine_version``, ``list_versions``), ``Event`` (``annotate``, ``events``),
    ``EventPage`` (``events_page_record``) and ``RouterList`` (``router_records``). An
    answer that is not the record is ``BadBrokerAnswer`` naming the field. ``events()``
    reads every page of the history (``iter_event_records`` yields them page by page;
    ``events_page_record`` is one request).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        admin_token: str | Callable[[], str] | None = None,
        actor: str = "unknown",
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        capability: str | None = None,
    ) -> None:
        # admin_token: the credential sent on writes (the gate's trip, the executor's
        # rollback, a router's heartbeat, the harness's operator credential); capability:
        # what check_credential requires the broker to say it grants. A callable token is
        # asked on every request (``common.auth.FileToken``: a rotated token file).
        self._session = session
        self.base_url = base_url.rstrip("/")
        self._admin_token = admin_token
        self.capability = capability
        self.actor = actor
        self.timeout_s = timeout_s

    # -- transport --------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, object] | None = None,
        params: Mapping[str, str] | None = None,
        admin: bool = False,
        timeout_s: float | None = None,
    ) -> tuple[Any, int, Mapping[str, str]]:
        """One request: ``(answer, status, headers)``, or the exception saying what failed.

        Every exception carries ``method`` and ``url`` (the hierarchy is in
        ``client_errors``, re-exported here): ``BrokerUnavailable`` (cannot connect, no
        answer in time, a 5xx, or ``BadBrokerAnswer``: retry with backoff),
        ``RevisionConflict`` and ``IllegalTransition`` (409), ``BrokerRequestError`` (any
        other 4xx; ``BrokerNotFound`` for 404). Bodies are written and answers read with
        ``strictjson``: a body holding NaN or Infinity is not sent (``BrokerRequestError``,
        status 400, code ``non_finite``), and an answer holding them is not a broker answer
        (``BrokerUnavailable``).
        """
        url = self.base_url + path
        headers = {"x-actor": self.actor}
        token = self._admin_token() if callable(self._admin_token) else self._admin_token
        if admin and token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data_out: bytes | None = None
        if body is not None:
            try:
                data_out = strictjson.dumps_bytes(body)
            except ValueError as exc:
                # What the broker would refuse with 400; never send NaN or Infinity.
                raise BrokerRequestError(
                    f"{method} {url}: not sent: the body holds a non-finite number ({exc}); "
                    "every number the broker stores must be finite",
                    400,
                    code="non_finite",
                    method=method,
                    url=url,
                ) from None
            headers["Content-Type"] = "application/json"
        limit_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with self._session.request(
                method,
                url,
                data=data_out,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=limit_s),
            ) as resp:
                text = await resp.text()
                status = resp.status
                resp_headers = dict(resp.headers)
        except TimeoutError:  # aiohttp's timeouts are TimeoutError since 3.10 / Python 3.11
            raise BrokerUnavailable(
                f"{method} {url}: no answer within {limit_s:g} s", method=method, url=url
            ) from None
        except aiohttp.ClientError as exc:
            raise BrokerUnavailable(
                f"{method} {url}: {type(exc).__name__}: {exc}", method=method, url=url
            ) from exc
        try:
            # Strict: an answer holding NaN or Infinity is not a broker answer.
            data: Any = strictjson.loads(text) if text else None
        except ValueError:
            data = None
        if status >= 400:
            raise error_from(status, data, text, method, url)
        if not isinstance(data, dict):
            raise BrokerUnavailable(
                f"{method} {url}: answered {status} without a JSON object: {text[:200]!r}",
                method=method,
                url=url,
            )
        return data, status, resp_headers

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, object]:
        data, _, _ = await self._call("GET", path, params=params)
        return dict(data)

    async def _write(
        self, method: str, path: str, body: Mapping[str, object], *, with_actor: bool = True
    ) -> dict[str, object]:
        if with_actor:
            body = {"actor": self.actor, **body}
        data, _, _ = await self._call(method, path, body=body, admin=True)
        return dict(data)

    # -- releases ---------------------------------------------------------------------------
    async def get_release(self, name: str) -> Release:
        """The release as the broker answers it now (``BadBrokerAnswer`` when the answer is
        not a release)."""
        path = f"/v1/releases/{name}"
        return self._release(name, await self._get(path), path)

    async def watch(self, name: str, after: int, timeout_s: float = 30.0) -> Release:
        """The release once its revision differs from ``after`` (newer; or older, when
        ``after`` came from another broker database), or, after ``timeout_s``, the current
        one unchanged (compare ``revision`` to tell). A release that does not exist yet is
        waited for; if it still does not exist at the timeout, ``BrokerNotFound``."""
        path = f"/v1/releases/{name}"
        data, _, _ = await self._call(
            "GET",
            path,
            params={"after": str(int(after)), "timeout_s": f"{timeout_s:g}"},
            timeout_s=timeout_s + WATCH_GRACE_S,
        )
        return self._release(name, dict(data), path)

    def _release(self, name: str, data: Mapping[str, object], path: str) -> Release:
        """``data`` as a ``Release``; an answer without an integer ``revision`` is named
        as one that may not come from a broker at all (a wrong ``--broker``)."""
        url = self.base_url + path
        revision = data.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise BadBrokerAnswer(
                f"the broker's answer for release {name!r} has no integer 'revision' "
                f"(got {revision!r}); is --broker {self.base_url} a broker?",
                method="GET",
                url=url,
            )
        return _typed(Release, data, "GET", url)

    # -- typed reads (the contract's records) ----------------------------------------------
    async def release_records(self) -> tuple[Release, ...]:
        path = "/v1/releases"
        return _typed(ReleaseList, await self._get(path), "GET", self.base_url + path).releases

    async def version_record(self, version: str) -> Version:
        path = f"/v1/versions/{version}"
        return _typed(Version, await self._get(path), "GET", self.base_url + path)

    async def events_page_record(
        self, name: str, after_seq: int = 0, limit: int | None = None
    ) -> EventPage:
        """One page of events (``EventPage.last``: no more after it)."""
        limit = EVENTS_PAGE_SIZE if limit is None else limit
        path = f"/v1/releases/{name}/events"
        data = await self._get(path, {"after_seq": str(int(after_seq)), "limit": str(limit)})
        return _typed(EventPage, data, "GET", self.base_url + path)

    async def router_records(self, release: str | None = None) -> RouterList:
        params = {"release": release} if release else None
        data = await self._get("/v1/routers", params)
        return _typed(RouterList, data, "GET", self.base_url + "/v1/routers")

    def follow(
        self,
        name: str,
        timeout_s: float | Callable[[], float] = 30.0,
        *,
        backoff_s: float | None = None,
        max_backoff_s: float | None = None,
        missing_retry_s: float | None = None,
    ) -> ReleaseFollower:
        """Follow release ``name``: ``async for event in client.follow(name): ...``.

        Reads the release plainly, then long-polls (``watch``, ``timeout_s``: seconds or a
        function read before each poll) past the revision it last yielded. Every answer is
        a ``FollowEvent`` of kind ``release``; a failure is one of kind ``not_found`` (then
        waits ``missing_retry_s``), ``unavailable``, ``refused`` or ``bad_answer`` (then
        waits the backoff: ``backoff_s`` doubling per error in a row up to
        ``max_backoff_s``), and the next read after it is a plain one. The caller decides
        what an error means to it (degraded, fail-safe); ``follower.retry()`` says that it
        could not handle the last release. Never ends; cancellation ends it at once."""
        return ReleaseFollower(
            self,
            name,
            timeout_s,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            missing_retry_s=missing_retry_s,
        )

    async def create_release(
        self,
        name: str,
        stable: str,
        canary: str | None = None,
        canary_weight: float = 0,
        reason: str = "",
    ) -> Release:
        path = "/v1/releases"
        answer = await self._write(
            "POST",
            path,
            {
                "name": name,
                "stable": stable,
                "canary": canary,
                "weights": {"canary": canary_weight},
                "reason": reason,
            },
        )
        return _typed(Release, answer, "POST", self.base_url + path)

    async def patch_release(
        self,
        name: str,
        expected_revision: int,
        *,
        canary_weight: float | None = None,
        phase: str | None = None,
        canary: str | _Unset | None = UNSET,
        trip: TripRecord | None = None,
        reason: str = "",
    ) -> Release:
        """Compare-and-set change; raises ``RevisionConflict`` or ``IllegalTransition``;
        answers the release as written (``BadBrokerAnswer`` when the answer is not one: the
        write may have landed, so read the release before writing again).

        ``canary=None`` removes the canary; leave it unset to keep it.
        """
        body: ReleasePatch = {"expected_revision": expected_revision, "reason": reason}
        if canary_weight is not None:
            body["weights"] = {"canary": canary_weight}
        if phase is not None:
            body["phase"] = phase
        if canary is not UNSET:
            body["canary"] = canary
        if trip is not None:
            body["trip"] = trip.copy()
        path = f"/v1/releases/{name}"
        answer = await self._write("PATCH", path, body)
        return _typed(Release, answer, "PATCH", self.base_url + path)

    # -- versions ---------------------------------------------------------------------------
    async def register_version(
        self, version: str, manifest: Any, digest: str | None = None
    ) -> Version:
        """Register a version; ``digest`` defaults to ``manifest_digest(manifest)``."""
        path = "/v1/versions"
        answer = await self._write(
            "POST",
            path,
            {
                "version": version,
                "manifest": manifest,
                "digest": digest or manifest_digest(manifest),
            },
            with_actor=False,  # the contract's body has no actor; the x-actor header names it
        )
        return _typed(Version, answer, "POST", self.base_url + path)

    async def list_versions(self) -> tuple[Version, ...]:
        path = "/v1/versions"
        return _typed(VersionList, await self._get(path), "GET", self.base_url + path).versions

    async def quarantine_version(self, version: str, reason: str = "") -> Version:
        path = f"/v1/versions/{version}/quarantine"
        answer = await self._write("POST", path, {"reason": reason})
        return _typed(Version, answer, "POST", self.base_url + path)

    # -- events -----------------------------------------------------------------------------
    async def iter_event_records(
        self, name: str, after_seq: int = 0
    ) -> AsyncIterator[tuple[Event, ...]]:
        """Every event after ``after_seq`` as the contract's ``Event`` records, page by page,
        to the end of the history (``BadBrokerAnswer`` for an answer that is not a page of
        them)."""
        path = f"/v1/releases/{name}/events"
        limit = EVENTS_PAGE_SIZE
        for _ in range(MAX_EVENT_PAGES):
            page = await self.events_page_record(name, after_seq, limit)
            if page.events and page.next_after_seq <= after_seq:
                raise BrokerUnavailable(
                    f"GET {self.base_url}{path}: next_after_seq {page.next_after_seq} does "
                    f"not move past after_seq {after_seq}; the broker's answer is inconsistent",
                    method="GET",
                    url=self.base_url + path,
                )
            after_seq = page.next_after_seq
            if page.events:
                yield page.events
            if len(page.events) < limit:
                return
        raise BrokerUnavailable(
            f"GET {self.base_url}{path}: still more after {MAX_EVENT_PAGES} pages of "
            f"{limit}; giving up",
            method="GET",
            url=self.base_url + path,
        )

    async def events(self, name: str, after_seq: int = 0) -> list[Event]:
        """Every event after ``after_seq`` (oldest first): all pages, not just the first."""
        out: list[Event] = []
        async for page in self.iter_event_records(name, after_seq):
            out.extend(page)
        return out

    async def annotate(self, name: str, change: Mapping[str, object], reason: str = "") -> Event:
        """Append an annotation event (``change`` needs an ``annotation`` key)."""
        path = f"/v1/releases/{name}/events"
        answer = await self._write("POST", path, {"change": dict(change), "reason": reason})
        return _typed(Event, answer, "POST", self.base_url + path)

    # -- routers ----------------------------------------------------------------------------
    async def heartbeat(
        self,
        router_id: str,
        release: str,
        applied_revision: int | None,
        *,
        applied_at: float | None = None,
        canary_off_since: float | None = None,
    ) -> None:
        """Report the revision applied; ``applied_at`` (when) and ``canary_off_since`` (since
        when the effective canary weight is 0) are sent only when given."""
        body: RouterHeartbeat = {
            "router_id": router_id,
            "release": release,
            "applied_revision": applied_revision,
        }
        if applied_at is not None:
            body["applied_at"] = applied_at
        if canary_off_since is not None:
            body["canary_off_since"] = canary_off_since
        await self._call("POST", "/v1/routers/heartbeat", body=body, admin=True)

    async def check_credential(self) -> list[str]:
        """Prove the credential without changing anything (``GET /v1/whoami``); its
        capabilities. Raises ``BrokerRequestError`` with status 401 when the broker does not
        know it, 403 when it does not grant ``capability``."""
        data, _, _ = await self._call("GET", "/v1/whoami", admin=True)
        caps = data.get("capabilities") if isinstance(data, dict) else None
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise BrokerUnavailable(
                f"GET {self.base_url}/v1/whoami: no list of capabilities in the answer",
                method="GET",
                url=self.base_url + "/v1/whoami",
            )
        if self.capability is not None and self.capability not in caps:
            name = data.get("credential") if isinstance(data, dict) else None
            raise BrokerRequestError(
                f"the broker says this credential is {name!r} and grants {', '.join(caps)}, "
                f"not {self.capability!r}: give this component the {self.capability} "
                "credential",
                403,
                method="GET",
                url=self.base_url + "/v1/whoami",
            )
        return list(caps)
