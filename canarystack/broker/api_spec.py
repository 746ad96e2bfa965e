"""The broker's OpenAPI description (``GET /openapi.json``; docs/ARCHITECTURE.md §2).

Request bodies are the pydantic models of ``canarystack.broker.schemas``; answers are the
store's JSON (``canarystack.broker.store``). The watch timeout's bound is this broker's
``--max-watch-s``. This module must never change how a request is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.broker import schemas
from canarystack.broker.keys import BROKER, MAX_EVENTS_PER_PAGE
from canarystack.broker.overdue import AWAITING_ROLLBACK
from canarystack.broker.phases import Phase
from canarystack.common import apispec as oa
from canarystack.common.openapi import add_describer

# SQLite integers are 64-bit: the largest revision or sequence number the store can hold.
MAX_INT64 = 2**63 - 1
TAG = "broker"

VERSION_SCHEMA: oa.SchemaObject = oa.obj(
    ("version", "digest", "manifest", "quarantined", "registered_at"),
    version=oa.STRING,
    digest={"type": "string", "pattern": r"^sha256:[0-9a-f]{64}$"},
    manifest={},
    quarantined=oa.BOOLEAN,
    registered_at=oa.NUMBER,
    quarantine=oa.obj(
        ("time", "actor", "reason"), time=oa.NUMBER, actor=oa.STRING, reason=oa.STRING
    ),
)


def _release_schema(phases: list[str]) -> oa.SchemaObject:
    return oa.obj(
        ("name", "phase", "revision", "stable", "canary", "weights", "trip"),
        name=oa.STRING,
        phase={"type": "string", "enum": phases},
        revision={"type": "integer", "minimum": 0},
        stable=oa.obj(("version", "digest"), version=oa.STRING, digest=oa.STRING),
        canary=oa.nullable(
            oa.obj(
                ("version", "digest", "quarantined"),
                version=oa.STRING,
                digest=oa.STRING,
                quarantined=oa.BOOLEAN,
            )
        ),
        weights=oa.obj(("canary",), canary={"type": "number", "minimum": 0, "maximum": 100}),
        trip=oa.nullable(oa.ANY_OBJECT),
        created_at=oa.NUMBER,
        updated_at=oa.NUMBER,
        # The rollback executor's dead-man switch (``overdue.Overdue.to_json``): present
        # only while the release's rollback is overdue.
        rollback_overdue=oa.obj(
            ("phase", "revision", "for_s", "limit_s", "reason"),
            phase={"type": "string", "enum": sorted(AWAITING_ROLLBACK)},
            revision=oa.INTEGER,
            for_s=oa.NUMBER,
            limit_s=oa.NUMBER,
            reason=oa.STRING,
        ),
    )


EVENT_SCHEMA: oa.SchemaObject = oa.obj(
    ("seq", "release", "time", "revision", "actor", "change", "reason"),
    seq=oa.INTEGER,
    release=oa.STRING,
    time=oa.NUMBER,
    revision=oa.nullable(oa.INTEGER),
    actor=oa.STRING,
    change=oa.ANY_OBJECT,
    reason=oa.STRING,
)

ROUTER_SCHEMA: oa.SchemaObject = oa.obj(
    ("router_id", "release", "applied_revision", "last_seen", "age_s"),
    router_id=oa.STRING,
    release=oa.STRING,
    applied_revision=oa.nullable(oa.INTEGER),
    applied_at=oa.nullable(oa.NUMBER),
    canary_off_since=oa.nullable(oa.NUMBER),
    identity={"enum": ["bound", "shared", "operator"]},
    last_seen=oa.NUMBER,
    age_s=oa.NUMBER,
)


def describe(spec: oa.ApiSpec, app: web.Application) -> None:
    """The broker's operations: versions, releases and their events, routers, the store
    and the caller's credential."""
    broker = app[BROKER]
    version = spec.named("Version", VERSION_SCHEMA)
    release = spec.named("Release", _release_schema([p.value for p in Phase]))
    event = spec.named("Event", EVENT_SCHEMA)
    router = spec.named("Router", ROUTER_SCHEMA)
    actor = oa.Param(
        "x-actor", "header", oa.STRING, "who makes the change, when the body has no actor"
    )
    release_name = oa.path_str("name", "a release", schemas.NAME_PATTERN)

    routes = spec.routes(TAG)
    _describe_versions(spec, routes, version, actor)
    _describe_releases(spec, routes, release, release_name, actor, broker.max_watch_s)
    _describe_events(spec, routes, event, release_name, actor)
    _describe_routers(spec, routes, router)
    _describe_store_and_credential(spec, routes, actor)


def _describe_versions(
    spec: oa.ApiSpec, routes: oa.TaggedRoutes, version: oa.SchemaObject, actor: oa.Param
) -> None:
    """``/v1/versions``: register, list, read and quarantine a version."""
    version_name = oa.path_str("version", "a registered version", schemas.NAME_PATTERN)
    routes.post(
        "/v1/versions",
        summary="Register a version and its manifest digest (idempotent for the same digest).",
        admin=True,
        params=[actor],
        body=spec.model(schemas.RegisterVersion),
        responses={
            200: oa.json_body(version, "already registered with this digest"),
            201: oa.json_body(version, "registered"),
            409: oa.error_response("the version exists with another digest"),
            422: oa.error_response("the digest does not match the manifest"),
        },
    )
    routes.get(
        "/v1/versions",
        summary="Every registered version.",
        ok=oa.listing("versions", version),
    )
    routes.get(
        "/v1/versions/{version}",
        summary="One version.",
        params=[version_name],
        ok=version,
        responses={404: oa.error_response("no such version")},
    )
    routes.post(
        "/v1/versions/{version}/quarantine",
        summary="Quarantine a version: every release using it as canary goes to weight 0.",
        admin=True,
        params=[version_name, actor],
        body=spec.model(schemas.QuarantineVersion),
        body_required=False,
        ok=version,
        responses={404: oa.error_response("no such version")},
    )


def _describe_releases(
    spec: oa.ApiSpec,
    routes: oa.TaggedRoutes,
    release: oa.SchemaObject,
    release_name: oa.Param,
    actor: oa.Param,
    max_watch_s: float,
) -> None:
    """``/v1/releases``: list, create, read (or watch, up to ``max_watch_s``) and change a
    release."""
    routes.get(
        "/v1/releases",
        summary="Every release.",
        ok=oa.listing("releases", release),
    )
    routes.post(
        "/v1/releases",
        summary="Create a release.",
        admin=True,
        params=[actor],
        body=spec.model(schemas.CreateRelease),
        responses={
            201: oa.json_body(release, "created"),
            404: oa.error_response("a named version is not registered"),
            409: oa.error_response("the release exists"),
            422: oa.error_response("the release cannot be created like this"),
        },
    )
    timeout: oa.SchemaObject = {"type": "number", "exclusiveMinimum": 0, "maximum": max_watch_s}
    routes.get(
        "/v1/releases/{name}",
        summary="A release; with 'after' a long-poll until its revision differs from 'after'.",
        params=[
            release_name,
            oa.query_int(
                "after", "the revision the caller has (makes this a watch)", maximum=MAX_INT64
            ),
            oa.Param(
                "timeout_s",
                "query",
                timeout,
                "watch timeout in seconds (only with 'after'; at most --max-watch-s)",
            ),
        ],
        responses={
            200: oa.json_body(
                release, "the release (x-watch-timeout: true when the watch timed out)"
            ),
            404: oa.error_response("no such release"),
        },
    )
    routes.patch(
        "/v1/releases/{name}",
        summary="Change a release (compare-and-set on expected_revision).",
        admin=True,
        params=[release_name, actor],
        body=spec.model(schemas.PatchRelease),
        ok=release,
        responses={
            404: oa.error_response("no such release or version"),
            409: oa.error_response("expected_revision is not the current revision"),
            422: oa.error_response("a transition or value the release does not allow"),
        },
    )


def _describe_events(
    spec: oa.ApiSpec,
    routes: oa.TaggedRoutes,
    event: oa.SchemaObject,
    release_name: oa.Param,
    actor: oa.Param,
) -> None:
    """``/v1/releases/{name}/events``: a release's history, and annotations added to it."""
    routes.get(
        "/v1/releases/{name}/events",
        summary="The release's event history, oldest first after after_seq.",
        params=[
            release_name,
            oa.query_int("after_seq", "events after this sequence number", maximum=MAX_INT64),
            oa.query_int("limit", "events per page", minimum=1, maximum=MAX_EVENTS_PER_PAGE),
        ],
        ok=oa.listing("events", event, next_after_seq=oa.INTEGER),
    )
    routes.post(
        "/v1/releases/{name}/events",
        summary="Add an annotation (e.g. fault_injected) to the release's history.",
        admin=True,
        params=[release_name, actor],
        body=spec.model(schemas.Annotation),
        responses={201: oa.json_body(event, "recorded"), 404: oa.error_response("no such release")},
    )


def _describe_routers(spec: oa.ApiSpec, routes: oa.TaggedRoutes, router: oa.SchemaObject) -> None:
    """``/v1/routers``: a router's heartbeat, and the routers with a live one."""
    routes.post(
        "/v1/routers/heartbeat",
        summary="A router says which revision it applied (as itself only, when its "
        "credential is bound to it).",
        admin=True,
        body=spec.model(schemas.Heartbeat),
        ok=oa.obj(("ok",), ok={"const": True}),
        responses={
            409: oa.error_response("applied_revision above any revision the broker issued"),
            429: oa.error_response("--max-routers routers are listed already"),
        },
    )
    routes.get(
        "/v1/routers",
        summary="Routers with a live heartbeat.",
        params=[oa.Param("release", "query", oa.STRING, "only the routers of this release")],
        ok=oa.listing("routers", router, ("expiry_s",), expiry_s=oa.NUMBER),
    )


def _describe_store_and_credential(
    spec: oa.ApiSpec, routes: oa.TaggedRoutes, actor: oa.Param
) -> None:
    """``/v1/store``: whether the store lost writes, and an operator accepting a loss;
    ``/v1/whoami``: the caller's credential."""
    routes.get(
        "/v1/store",
        summary="Whether the store holds every acknowledged write ('ok') or lost some "
        "('lost': what, and how to recover), and the high-water mark it is held to.",
        ok=oa.obj(("status", "acknowledged", "carried"), status={"enum": ["ok", "lost"]}),
    )
    routes.post(
        "/v1/store/accept-loss",
        summary="An operator accepts a store loss: quarantines are kept, each release comes "
        "back at a new revision with its canary at 0 %, and the broker serves again.",
        admin=True,
        params=[actor],
        body=spec.model(schemas.AcceptLoss),
        ok=oa.obj(("status", "accepted"), status={"const": "ok"}, accepted=oa.ANY_OBJECT),
        responses={409: oa.error_response("the store lost nothing")},
    )
    routes.get(
        "/v1/whoami",
        summary="Which credential the caller holds and what it may write (403 for a write "
        "it does not grant; docs/ARCHITECTURE.md §8).",
        admin=True,
        ok=oa.obj(
            ("credential", "capabilities", "single_credential_mode"),
            credential=oa.STRING,
            capabilities=oa.array(oa.STRING),
            single_credential_mode=oa.BOOLEAN,
        ),
    )


def install(app: web.Application) -> None:
    """Describe the broker's routes in its ``/openapi.json``."""
    add_describer(app, describe)
