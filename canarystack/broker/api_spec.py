"""The broker's OpenAPI description (``GET /openapi.json``; docs/ARCHITECTURE.md §2).

Request bodies are the pydantic models of ``canarystack.broker.schemas``; answers are the
store's JSON (``canarystack.broker.store``). The watch timeout's bound is this broker's
``--max-watch-s``. This module must never change how a request is handled.
"""

from __future__ import annotations

from aiohttp import web

from canary_contract.json import JsonObject
from canarystack.broker import schemas
from canarystack.broker.keys import BROKER, MAX_EVENTS_PER_PAGE
from canarystack.broker.phases import Phase
from canarystack.common.apispec import (
    ANY_OBJECT,
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING,
    ApiSpec,
    Param,
    error_response,
    json_body,
    nullable,
    obj,
    path_str,
    query_int,
)
from canarystack.common.openapi import add_describer

# SQLite integers are 64-bit: the largest revision or sequence number the store can hold.
MAX_INT64 = 2**63 - 1
TAG = "broker"

VERSION_SCHEMA: JsonObject = obj(
    ("version", "digest", "manifest", "quarantined", "registered_at"),
    version=STRING,
    digest={"type": "string", "pattern": r"^sha256:[0-9a-f]{64}$"},
    manifest={},
    quarantined=BOOLEAN,
    registered_at=NUMBER,
    quarantine=obj(("time", "actor", "reason"), time=NUMBER, actor=STRING, reason=STRING),
)


def _release_schema(phases: list[str]) -> JsonObject:
    return obj(
        ("name", "phase", "revision", "stable", "canary", "weights", "trip"),
        name=STRING,
        phase={"type": "string", "enum": phases},
        revision={"type": "integer", "minimum": 0},
        stable=obj(("version", "digest"), version=STRING, digest=STRING),
        canary=nullable(
            obj(
                ("version", "digest", "quarantined"),
                version=STRING,
                digest=STRING,
                quarantined=BOOLEAN,
            )
        ),
        weights=obj(("canary",), canary={"type": "number", "minimum": 0, "maximum": 100}),
        trip=nullable(ANY_OBJECT),
        created_at=NUMBER,
        updated_at=NUMBER,
    )


EVENT_SCHEMA: JsonObject = obj(
    ("seq", "release", "time", "revision", "actor", "change", "reason"),
    seq=INTEGER,
    release=STRING,
    time=NUMBER,
    revision=nullable(INTEGER),
    actor=STRING,
    change=ANY_OBJECT,
    reason=STRING,
)

ROUTER_SCHEMA: JsonObject = obj(
    ("router_id", "release", "applied_revision", "last_seen", "age_s"),
    router_id=STRING,
    release=STRING,
    applied_revision=nullable(INTEGER),
    applied_at=nullable(NUMBER),
    canary_off_since=nullable(NUMBER),
    last_seen=NUMBER,
    age_s=NUMBER,
)


def describe(spec: ApiSpec, app: web.Application) -> None:
    broker = app[BROKER]
    version = spec.named("Version", VERSION_SCHEMA)
    release = spec.named("Release", _release_schema([p.value for p in Phase]))
    event = spec.named("Event", EVENT_SCHEMA)
    router = spec.named("Router", ROUTER_SCHEMA)
    actor = Param("x-actor", "header", STRING, "who makes the change, when the body has no actor")
    version_name = path_str("version", "a registered version", schemas.NAME_PATTERN)
    release_name = path_str("name", "a release", schemas.NAME_PATTERN)

    spec.add(
        "post",
        "/v1/versions",
        summary="Register a version and its manifest digest (idempotent for the same digest).",
        tag=TAG,
        admin=True,
        params=[actor],
        body=spec.model(schemas.RegisterVersion),
        responses={
            200: json_body(version, "already registered with this digest"),
            201: json_body(version, "registered"),
            409: error_response("the version exists with another digest"),
            422: error_response("the digest does not match the manifest"),
        },
    )
    spec.add(
        "get",
        "/v1/versions",
        summary="Every registered version.",
        tag=TAG,
        responses={
            200: json_body(obj(("versions",), versions={"type": "array", "items": version}))
        },
    )
    spec.add(
        "get",
        "/v1/versions/{version}",
        summary="One version.",
        tag=TAG,
        params=[version_name],
        responses={200: json_body(version), 404: error_response("no such version")},
    )
    spec.add(
        "post",
        "/v1/versions/{version}/quarantine",
        summary="Quarantine a version: every release using it as canary goes to weight 0.",
        tag=TAG,
        admin=True,
        params=[version_name, actor],
        body=spec.model(schemas.QuarantineVersion),
        body_required=False,
        responses={200: json_body(version), 404: error_response("no such version")},
    )
    spec.add(
        "get",
        "/v1/releases",
        summary="Every release.",
        tag=TAG,
        responses={
            200: json_body(obj(("releases",), releases={"type": "array", "items": release}))
        },
    )
    spec.add(
        "post",
        "/v1/releases",
        summary="Create a release.",
        tag=TAG,
        admin=True,
        params=[actor],
        body=spec.model(schemas.CreateRelease),
        responses={
            201: json_body(release, "created"),
            404: error_response("a named version is not registered"),
            409: error_response("the release exists"),
            422: error_response("the release cannot be created like this"),
        },
    )
    timeout: JsonObject = {"type": "number", "exclusiveMinimum": 0, "maximum": broker.max_watch_s}
    spec.add(
        "get",
        "/v1/releases/{name}",
        summary="A release; with 'after' a long-poll until its revision differs from 'after'.",
        tag=TAG,
        params=[
            release_name,
            query_int(
                "after", "the revision the caller has (makes this a watch)", maximum=MAX_INT64
            ),
            Param(
                "timeout_s",
                "query",
                timeout,
                "watch timeout in seconds (only with 'after'; at most --max-watch-s)",
            ),
        ],
        responses={
            200: json_body(release, "the release (x-watch-timeout: true when the watch timed out)"),
            404: error_response("no such release"),
        },
    )
    spec.add(
        "patch",
        "/v1/releases/{name}",
        summary="Change a release (compare-and-set on expected_revision).",
        tag=TAG,
        admin=True,
        params=[release_name, actor],
        body=spec.model(schemas.PatchRelease),
        responses={
            200: json_body(release),
            404: error_response("no such release or version"),
            409: error_response("expected_revision is not the current revision"),
            422: error_response("a transition or value the release does not allow"),
        },
    )
    spec.add(
        "get",
        "/v1/releases/{name}/events",
        summary="The release's event history, oldest first after after_seq.",
        tag=TAG,
        params=[
            release_name,
            query_int("after_seq", "events after this sequence number", maximum=MAX_INT64),
            query_int("limit", "events per page", minimum=1, maximum=MAX_EVENTS_PER_PAGE),
        ],
        responses={
            200: json_body(
                obj(
                    ("events",),
                    events={"type": "array", "items": event},
                    next_after_seq=INTEGER,
                )
            )
        },
    )
    spec.add(
        "post",
        "/v1/releases/{name}/events",
        summary="Add an annotation (e.g. fault_injected) to the release's history.",
        tag=TAG,
        admin=True,
        params=[release_name, actor],
        body=spec.model(schemas.Annotation),
        responses={201: json_body(event, "recorded"), 404: error_response("no such release")},
    )
    spec.add(
        "post",
        "/v1/routers/heartbeat",
        summary="A router says which revision it applied.",
        tag=TAG,
        admin=True,
        body=spec.model(schemas.Heartbeat),
        responses={200: json_body(obj(("ok",), ok={"const": True}))},
    )
    spec.add(
        "get",
        "/v1/routers",
        summary="Routers with a live heartbeat.",
        tag=TAG,
        params=[Param("release", "query", STRING, "only the routers of this release")],
        responses={
            200: json_body(
                obj(
                    ("routers", "expiry_s"),
                    routers={"type": "array", "items": router},
                    expiry_s=NUMBER,
                )
            )
        },
    )
    spec.add(
        "get",
        "/v1/whoami",
        summary="Which credential the caller holds and what it may write (403 for a write "
        "it does not grant; docs/ARCHITECTURE.md §8).",
        tag=TAG,
        admin=True,
        responses={
            200: json_body(
                obj(
                    ("credential", "capabilities", "single_credential_mode"),
                    credential=STRING,
                    capabilities={"type": "array", "items": STRING},
                    single_credential_mode=BOOLEAN,
                )
            )
        },
    )


def install(app: web.Application) -> None:
    """Describe the broker's routes in its ``/openapi.json``."""
    add_describer(app, describe)
