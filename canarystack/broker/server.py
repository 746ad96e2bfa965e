"""The broker's HTTP API (aiohttp), per docs/ARCHITECTURE.md §2: the handlers and the app.
The bodies are ``schemas``, the state ``service``, the SQLite store ``store``, input and
answers ``wire``. Over 400 lines because it is the broker's routes, one short handler each;
split by resource, each part would repeat the same helpers.

This module must never answer a write before its commit returned, touch SQLite from the
event loop thread, or hold a long-poll past ``--max-watch-s`` (except under drop_watch).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from aiohttp import web

import canarystack
from canary_contract import strictjson
from canary_contract.broker import MAX_TRIP_COLOURS, trip_json
from canarystack.broker import capabilities
from canarystack.broker.api_spec import install as install_api_spec
from canarystack.broker.capabilities import Credentials
from canarystack.broker.changes import ReleasePatch
from canarystack.broker.custody import recovery_text
from canarystack.broker.digest import manifest_digest
from canarystack.broker.errors import BrokerDomainError, Conflicting, Crowded, Missing, Refused
from canarystack.broker.highwater import CarriedJson, LossJson, SummaryJson
from canarystack.broker.keys import BROKER, KUBE_IDENTITY, MAX_EVENTS_PER_PAGE
from canarystack.broker.kube_identity import (
    KubeRouterIdentity,
    ReviewUnavailable,
    looks_like_service_account_token,
)
from canarystack.broker.overdue import DEFAULT_ROLLBACK_OVERDUE_S
from canarystack.broker.records import OverdueJson
from canarystack.broker.schemas import (
    _NAME_RE,
    MAX_EVENT_FIELD_BYTES,
    NAME_PATTERN,
    AcceptLoss,
    Annotation,
    CreateRelease,
    Heartbeat,
    PatchRelease,
    QuarantineVersion,
    RegisterVersion,
)
from canarystack.broker.service import DEFAULT_MAX_ROUTERS, Broker
from canarystack.broker.wire import (
    BROKER_MAX_BODY_BYTES,
    header_text,
    json_response,
    query_float,
    query_int,
    read_json_object,
    read_optional_object,
)
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.auth import Forbidden, presented_token
from canarystack.common.colour import Colour
from canarystack.common.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Handler,
    NotFound,
    Unauthorized,
    Unavailable,
    Unprocessable,
    parse_model,
)
from canarystack.common.faults import FaultParams, FaultRegistry, LatencyMs, NoParams
from canarystack.common.logs import get_logger

# Names other modules read here (the request bodies live in ``schemas``).
__all__ = [
    "BROKER",
    "MAX_EVENT_FIELD_BYTES",
    "MAX_TRIP_COLOURS",
    "NAME_PATTERN",
    "Annotation",
    "Broker",
    "PatchRelease",
    "build_app",
]


# Module-level so tests can shorten them instead of sleeping.
DEFAULT_WATCH_TIMEOUT_S = 30.0

_log = get_logger("broker")


# -- faults -------------------------------------------------------------------------------
# ``latency`` (``ms`` added to every /v1 request), ``unavailable`` (503 on every /v1
# request) and ``drop_watch`` (long-polls hang, answering nothing, until the client
# disconnects or the fault ends; then they answer normally). /health, /metrics and /admin
# are never faulted, so the harness can still observe and heal the broker.
FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyMs,
    "unavailable": NoParams,
    "drop_watch": NoParams,
}


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
        broker.custody.register_version,
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
        rel["canary"] is not None and rel["canary"]["version"] == name
        for rel in broker.releases.values()
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
    releases = [broker.with_overdue(broker.releases[n]) for n in sorted(broker.releases)]
    return json_response({"releases": releases})


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
        broker.custody.first_revision(body.name),
        changed=lambda release: [release],
    )
    _log.info("release_created", release=body.name, actor=actor, revision=release["revision"])
    return json_response(broker.with_overdue(release), status=201)


async def get_release(request: web.Request) -> web.Response:
    """The release, or a watch: ``?after=REV&timeout_s=S`` answers once the revision
    differs from ``after`` or after ``timeout_s`` (``x-watch-timeout: true``); a watch on a
    release that does not exist yet waits for it, and is a 404 if the timeout passes
    first."""
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
        return json_response(broker.with_overdue(release))
    after = query_int(request, "after", None)
    timeout_s = _watch_timeout(request, broker.max_watch_s)
    release, timed_out = await broker.watch(name, after, timeout_s, lambda: _client_gone(request))
    if release is None:
        raise NotFound(
            f"No release {name!r} (the watch waited {timeout_s:g} s for it to be created).",
            param="name",
        )
    headers = {"x-watch-timeout": "true"} if timed_out else {}
    return json_response(broker.with_overdue(release), headers=headers)


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
    """A compare-and-set change of a release. A trip's ``colours`` (the request ids and
    trace ids behind it) are each recorded as a ``trip_evidence`` hop."""
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
        # Colours not sent stay out: the stored trip stays as the gate wrote it.
        trip=None if body.trip is None else trip_json(body.trip),
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
    return json_response(broker.with_overdue(release))


# -- handlers: events -----------------------------------------------------------------------
async def list_events(request: web.Request) -> web.Response:
    """One page of history: ``?after_seq=N&limit=L`` (L <= 10,000) answers ``{"events",
    "next_after_seq", "limit"}``, oldest first; a page shorter than ``limit`` is the last."""
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
    """A router's heartbeat. The id it claims must be its credential's: a router-bound
    credential speaks for its own router only, a router pod's service-account token
    (``--router-identity kubernetes``) for its own pod only, and under
    ``--require-router-credentials`` the shared heartbeat credential speaks for none (403
    either way)."""
    kube = request.app.get(KUBE_IDENTITY)
    given = presented_token(request, "credential")
    if kube is not None and looks_like_service_account_token(given):
        broker = _broker(request)
        pod = await _reviewed_pod(kube, given)
        body = parse_model(Heartbeat, await read_json_object(request, BROKER_MAX_BODY_BYTES))
        identity = _pod_identity(broker, pod, body.router_id)
    else:
        broker, credential = _authorized(request, "heartbeat")
        body = parse_model(Heartbeat, await read_json_object(request, BROKER_MAX_BODY_BYTES))
        identity = _router_identity(request, broker, credential, body.router_id)
    broker.admit(body, identity)
    broker.heartbeat(body, identity)
    return json_response({"ok": True})


async def _reviewed_pod(kube: KubeRouterIdentity, token: str) -> str:
    """The router pod a service-account token speaks for (the API server's review), or
    401 (not a router's token), or 503 (the API server cannot review it now)."""
    try:
        pod = await kube.router_of(token)
    except ReviewUnavailable as exc:
        raise Unavailable(
            f"This broker checks router identity with the Kubernetes API server "
            f"(--router-identity kubernetes) and cannot now: {exc}. Retry.",
            code="identity_unavailable",
        ) from None
    if pod is None:
        raise Unauthorized(
            "This service-account token is not a router pod's: the API server does not "
            f"accept it for audience {kube.audience!r} as {kube.username}, bound to a pod. "
            "Mount the router's projected token (deploy/k8s/base/stack/router.yaml) as its "
            "--broker-token-file."
        )
    return pod


def _pod_identity(broker: Broker, pod: str, claimed: str) -> str:
    """A router pod heartbeats as itself only (403 otherwise)."""
    if pod != claimed:
        raise Forbidden(
            f"This service-account token belongs to router pod {pod!r}; it cannot "
            f"heartbeat as {claimed!r}. Start the router with --router-id set to its pod "
            "name (the downward API's metadata.name).",
            param="router_id",
            code="router_identity",
        )
    broker.bound_ids.add(pod)
    return "pod"


def _router_identity(request: web.Request, broker: Broker, credential: str, claimed: str) -> str:
    """How the claimed router id is vouched for ("bound", "shared", "operator"), or 403."""
    if credential != capabilities.HEARTBEAT:
        return "operator"
    bound = broker.credentials.bound_router(request)
    if bound is not None:
        if bound != claimed:
            raise Forbidden(
                f"This heartbeat credential belongs to router {bound!r}; it cannot "
                f"heartbeat as {claimed!r}. Send router_id {bound!r}, or give router "
                f"{claimed!r} its own credential (python -m canarystack.broker.router_token).",
                param="router_id",
                code="router_identity",
            )
        broker.bound_ids.add(bound)
        return "bound"
    if broker.require_router_credentials:
        raise Forbidden(
            "This broker (--require-router-credentials) takes heartbeats only from "
            "router-bound credentials, and the shared heartbeat credential could claim any "
            "router. Mint one per router: python -m canarystack.broker.router_token "
            f"--credentials-dir DIR {claimed!r}, and give it to that router's "
            "--broker-token-file.",
            param="router_id",
            code="router_identity",
        )
    if claimed in broker.bound_ids:
        raise Forbidden(
            f"Router {claimed!r} has its own credential: the shared heartbeat credential "
            "cannot speak for it.",
            param="router_id",
            code="router_identity",
        )
    return "shared"


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


class StoreState(TypedDict):
    """``GET /v1/store``; ``lost`` and ``recovery`` only while the store lost writes."""

    status: Literal["ok", "lost"]
    acknowledged: SummaryJson
    carried: CarriedJson
    mark_unsaved: str | None
    lost: NotRequired[LossJson]
    recovery: NotRequired[str]


class BrokerHealth(TypedDict):
    """The broker's fields of ``/health`` (``status`` and the rest only while degraded)."""

    releases: int
    watchers: int
    max_watch_s: float
    router_expiry_s: float
    store: Literal["ok", "lost", "mark_unsaved"]
    status: NotRequired[str]
    degraded_reasons: NotRequired[list[str]]
    # Always there, set after the store's keys above (so NotRequired where built).
    rollbacks_overdue: NotRequired[dict[str, OverdueJson]]
    serving: NotRequired[bool]


# -- handlers: the store's custody ------------------------------------------------------------
async def store_state(request: web.Request) -> web.Response:
    """``GET /v1/store``: whether the store holds every acknowledged write (``ok``) or lost
    some (``lost``, with what and how to recover), and the high-water mark it is held to."""
    broker = _broker(request)
    custody = broker.custody
    body: StoreState = {
        "status": "lost" if custody.lost else "ok",
        "acknowledged": custody.mark.acknowledged.to_json(),
        "carried": custody.mark.carried.to_json(),
        "mark_unsaved": custody.unsaved,
    }
    if custody.lost:
        body["lost"] = custody.lost.to_json()
        body["recovery"] = recovery_text(broker.state_dir)
    return json_response(body)


async def accept_loss(request: web.Request) -> web.Response:
    """``POST /v1/store/accept-loss`` (operator): serve again on the store as it is."""
    broker, credential = _authorized(request, "accept_store_loss")
    body = parse_model(AcceptLoss, await read_json_object(request, BROKER_MAX_BODY_BYTES))
    actor = _actor(body.actor, request)
    if broker.store_lost is None:
        raise Conflict(
            "The store lost nothing (GET /v1/store says ok): there is no loss to accept.",
            code="no_store_loss",
        )
    loss = await broker.accept_loss(actor, body.reason)
    return json_response({"status": "ok", "accepted": loss.to_json(), "by": credential})


# Served while the store is lost: what it is, how to recover, and what routers report.
_WHILE_LOST = {
    ("GET", "/v1/store"),
    ("POST", "/v1/store/accept-loss"),
    ("GET", "/v1/routers"),
    ("POST", "/v1/routers/heartbeat"),
    ("GET", "/v1/whoami"),
}


@web.middleware
async def store_lost_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """503 ``store_lost`` on every other /v1 call while the store is behind its mark: an
    older store must not hand out an older release (a quarantine undone, a canary back)."""
    broker = request.app[BROKER]
    loss = broker.store_lost
    if (
        loss is not None
        and request.path.startswith("/v1/")
        and (request.method, request.path) not in _WHILE_LOST
    ):
        raise Unavailable(
            "The broker's store is older than what it acknowledged, so it serves nothing "
            f"from it; lost: {'; '.join(loss.lines())}. {recovery_text(broker.state_dir)} "
            "GET /v1/store shows the details.",
            code="store_lost",
            extra={"lost": loss.to_json()},
        )
    return await handler(request)


def _health(broker: Broker) -> BrokerHealth:
    out: BrokerHealth = {
        "releases": len(broker.releases),
        "watchers": broker.watchers,
        # A router checks its --watch-timeout-s against this at start (a longer one would
        # be refused with 400 on every watch and never apply a trip).
        "max_watch_s": broker.max_watch_s,
        "router_expiry_s": broker.router_expiry_s,
        "store": "ok",
    }
    custody = broker.custody
    if custody.lost:
        out["store"] = "lost"
        out["status"] = "store_lost"
        out["degraded_reasons"] = [
            f"the store lost acknowledged writes: {'; '.join(custody.lost.lines())}. "
            + recovery_text(broker.state_dir)
        ]
    elif custody.unsaved:
        out["store"] = "mark_unsaved"
        out["status"] = "degraded"
        out["degraded_reasons"] = [
            f"the high-water mark could not be saved ({custody.unsaved}): a later loss of "
            "the store would go unnoticed; free the disk or fix the folder's permissions"
        ]
    # The rollback executor's dead-man switch: degraded, but serving (HTTP 200, so a
    # readiness or liveness probe does not take away the broker the executor needs).
    late = broker.overdue_rollbacks()
    out["rollbacks_overdue"] = {o.release: o.to_json() for o in late}
    if late:
        if "status" not in out:  # a store problem keeps its own status (and its 503)
            out["status"] = "degraded"
            out["serving"] = True
        out["degraded_reasons"] = [*out.get("degraded_reasons", []), *(o.reason() for o in late)]
    return out


# -- app ------------------------------------------------------------------------------------
class TooManyRouters(ApiError):
    """429: the routers listed are at ``--max-routers``."""

    status = 429


_STATUS_OF: dict[type[BrokerDomainError], type[ApiError]] = {
    Missing: NotFound,
    Conflicting: Conflict,
    Refused: Unprocessable,
    Crowded: TooManyRouters,
}


def to_api_error(exc: BrokerDomainError) -> ApiError:
    """The HTTP error of a domain error (the one place statuses are chosen): ``Missing``
    404, ``Conflicting`` 409, ``Refused`` 422, ``Crowded`` 429."""
    cls = next((api for dom, api in _STATUS_OF.items() if isinstance(exc, dom)), Unprocessable)
    return cls(exc.message, param=exc.param, code=exc.code, extra=exc.extra or None)


@web.middleware
async def domain_error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BrokerDomainError as exc:
        raise to_api_error(exc) from None


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
    max_routers: int = DEFAULT_MAX_ROUTERS,
    require_router_credentials: bool = False,
    rollback_overdue_s: float = DEFAULT_ROLLBACK_OVERDUE_S,
    kube_identity: KubeRouterIdentity | None = None,
) -> web.Application:
    """The broker app; the store opens when the app starts, not here.

    ``credentials`` (``--credentials-dir``): one token per capability, and ``admin_token``
    is then the broker's fault credential only. Without them, single-credential mode: the
    admin token grants every write. ``max_routers`` caps the router ids the shared heartbeat
    credential may have listed; ``require_router_credentials`` refuses it for heartbeats
    (routers then each hold a credential bound to their id). ``kube_identity``: router
    pods heartbeat with their own service-account tokens, reviewed by the API server. A
    release tripped or rolling back with no phase change for ``rollback_overdue_s`` makes
    ``/health`` degraded.
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
        max_routers=max_routers,
        require_router_credentials=require_router_credentials,
        rollback_overdue_s=rollback_overdue_s,
    )
    component.health_extra = lambda: _health(broker)
    app = create_app(component, client_max_size=BROKER_MAX_BODY_BYTES)
    app.middlewares.append(fault_middleware)
    app.middlewares.append(store_lost_middleware)
    app.middlewares.append(domain_error_middleware)
    app[BROKER] = broker
    if kube_identity is not None:
        app[KUBE_IDENTITY] = kube_identity

        async def close_identity(_app: web.Application) -> None:
            await kube_identity.close()

        app.on_cleanup.append(close_identity)
    app.cleanup_ctx.append(_broker_ctx)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_routes(
        [
            web.post("/v1/versions", register_version),
            web.get("/v1/versions", list_versions),
            web.get("/v1/versions/{version}", get_version),
            web.post("/v1/versions/{version}/quarantine", quarantine_version),
            web.get("/v1/releases", list_releases),
            web.post("/v1/releases", create_release),
            web.get("/v1/releases/{name}", get_release),
            web.patch("/v1/releases/{name}", patch_release),
            web.get("/v1/releases/{name}/events", list_events),
            web.post("/v1/releases/{name}/events", annotate),
            web.post("/v1/routers/heartbeat", heartbeat),
            web.get("/v1/routers", list_routers),
            web.get("/v1/whoami", whoami),
            web.get("/v1/store", store_state),
            web.post("/v1/store/accept-loss", accept_loss),
        ]
    )
    install_api_spec(app)
    return app
