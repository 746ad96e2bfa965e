"""The rollback executor's OpenAPI description (``GET /openapi.json``;
docs/ARCHITECTURE.md §4).

The manual rollback body is ``canarystack.rollback.server.ManualRollback`` (optional: an
empty body is a rollback without a reason). This module must never change how a request
is handled.
"""

from __future__ import annotations

from aiohttp import web

from canary_contract.json import JsonObject
from canarystack.common.apispec import (
    BOOLEAN,
    INTEGER,
    STRING,
    ApiSpec,
    Param,
    error_response,
    json_body,
    nullable,
    obj,
)
from canarystack.common.openapi import add_describer
from canarystack.rollback.keys import SERVICE
from canarystack.rollback.service import ManualRollback

TAG = "rollback"

STATUS_SCHEMA: JsonObject = obj(
    ("release", "state", "phase", "revision", "steps"),
    release=STRING,
    state=STRING,
    phase=nullable(STRING),
    revision=nullable(INTEGER),
    steps={"type": "array", "items": {"type": "object"}},
    manual_requested=BOOLEAN,
    running=BOOLEAN,
)


def describe(spec: ApiSpec, app: web.Application) -> None:
    status = spec.named("RollbackStatus", STATUS_SCHEMA)
    watched = {"type": "string", "enum": sorted(app[SERVICE].releases)}
    release = Param("release", "path", watched, "a release this executor watches", True)
    spec.add(
        "post",
        "/v1/rollbacks/{release}",
        summary="Roll back a release by hand; 202 once step 1 is in the broker.",
        tag=TAG,
        admin=True,
        params=[release],
        body=spec.model(ManualRollback),
        body_required=False,
        responses={
            200: json_body(status, "already rolled back"),
            # The contract: 202 only once step 1 is in the broker (a crash after the
            # answer still resumes), so the steps it shows are never empty.
            202: json_body(
                {"allOf": [status, {"properties": {"steps": {"minItems": 1}}}]},
                "started: step 1 is in the broker",
            ),
            404: error_response("not watched by this executor, or unknown to the broker"),
            409: error_response(
                "nothing to roll back (phase, or no canary), or the broker refused step 1 "
                "(code step_refused)"
            ),
        },
    )
    spec.add(
        "get",
        "/v1/rollbacks/{release}",
        summary="The rollback steps done, read from the broker's history.",
        tag=TAG,
        params=[release],
        responses={200: json_body(status), 404: error_response("not watched, or unknown")},
    )


def install(app: web.Application) -> None:
    """Describe the rollback executor's routes in its ``/openapi.json``."""
    add_describer(app, describe)
