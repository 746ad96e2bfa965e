"""The rollback executor's OpenAPI description (``GET /openapi.json``;
docs/ARCHITECTURE.md §4).

The manual rollback body is ``canarystack.rollback.server.ManualRollback`` (optional: an
empty body is a rollback without a reason). This module must never change how a request
is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.common import apispec as oa
from canarystack.common.openapi import add_describer
from canarystack.rollback.keys import SERVICE
from canarystack.rollback.service import ManualRollback

TAG = "rollback"

STATUS_SCHEMA: oa.SchemaObject = oa.obj(
    ("release", "state", "phase", "revision", "steps"),
    release=oa.STRING,
    state=oa.STRING,
    phase=oa.nullable(oa.STRING),
    revision=oa.nullable(oa.INTEGER),
    canary_live=oa.nullable(oa.BOOLEAN),
    steps=oa.array({"type": "object"}),
    manual_requested=oa.BOOLEAN,
    running=oa.BOOLEAN,
)


def describe(spec: oa.ApiSpec, app: web.Application) -> None:
    status = spec.named("RollbackStatus", STATUS_SCHEMA)
    watched: oa.SchemaObject = {"type": "string", "enum": sorted(app[SERVICE].releases)}
    release = oa.Param("release", "path", watched, "a release this executor watches", True)
    routes = spec.routes(TAG)
    routes.post(
        "/v1/rollbacks/{release}",
        summary="Roll back a release by hand; 202 once step 1 is in the broker.",
        admin=True,
        params=[release],
        body=spec.model(ManualRollback),
        body_required=False,
        responses={
            200: oa.json_body(status, "already rolled back"),
            # The contract: 202 only once step 1 is in the broker (a crash after the
            # answer still resumes), so the steps it shows are never empty.
            202: oa.json_body(
                {"allOf": [status, {"properties": {"steps": {"minItems": 1}}}]},
                "started: step 1 is in the broker",
            ),
            404: oa.error_response("not watched by this executor, or unknown to the broker"),
            409: oa.error_response(
                "nothing to roll back (phase, or no canary), or the broker refused step 1 "
                "(code step_refused)"
            ),
        },
    )
    routes.get(
        "/v1/rollbacks/{release}",
        summary="The rollback steps done, read from the broker's history.",
        params=[release],
        ok=status,
        responses={404: oa.error_response("not watched, or unknown")},
    )


def install(app: web.Application) -> None:
    """Describe the rollback executor's routes in its ``/openapi.json``."""
    add_describer(app, describe)
