"""The judge's OpenAPI description (``GET /openapi.json``; docs/drift-judge.md).

A mirrored request is any JSON object (the user's request as it came); the Flagger payload
is ``canarystack.judge.answers.FlaggerPayload``, the model that validates it. This module
must never change how a request is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.common import apispec as oa
from canarystack.common.openapi import add_describer
from canarystack.judge.answers import VERDICTS, FlaggerPayload
from canarystack.judge.service import OFFER_RESULTS, Judge

TAG = "judge"


def _verdict_schema(releases: list[str]) -> oa.SchemaObject:
    return oa.obj(
        ("release", "verdict", "reason", "comparisons"),
        release={"type": "string", "enum": releases},
        verdict={"type": "string", "enum": list(VERDICTS)},
        reason=oa.STRING,
        comparisons=oa.INTEGER,
        test=oa.nullable(oa.STRING),
        bucket=oa.nullable(oa.STRING),
        statistic=oa.nullable(oa.NUMBER),
        threshold=oa.nullable(oa.NUMBER),
        samples=oa.nullable(oa.INTEGER),
        drift=oa.ANY_OBJECT,
        scoring=oa.nullable(
            oa.obj(
                ("mode", "why"),
                mode={"type": "string", "enum": ["teacher-forced", "free"]},
                why=oa.nullable(oa.STRING),
            )
        ),
        trip=oa.nullable(oa.ANY_OBJECT),
    )


def describe(spec: oa.ApiSpec, app: web.Application, judge: Judge) -> None:
    releases = sorted(judge.gates)
    verdict = spec.named("JudgeVerdict", _verdict_schema(releases))
    routes = spec.routes(TAG)
    accepted = oa.json_body(
        oa.obj(
            ("release", "result"),
            release=oa.STRING,
            result={"type": "string", "enum": list(OFFER_RESULTS)},
        ),
        "taken: queued, or why not (the mirror ignores the answer)",
    )
    header = oa.Param(
        "x-judge-release", "header", {"type": "string"}, "the release (default: the first)"
    )
    for path, what in (("/v1/completions", "completion"), ("/v1/chat/completions", "chat")):
        routes.post(
            path,
            summary=f"A mirrored {what} request, as the user sent it; answered at once.",
            params=[header],
            body=oa.ANY_OBJECT,
            responses={
                202: accepted,
                404: oa.error_response("x-judge-release names a release not judged here"),
                413: oa.error_response("the body is over --max-body-bytes"),
            },
        )
    release = oa.Param("release", "path", {"type": "string"}, required=True)
    not_judged: dict[int | str, oa.ResponseObject] = {404: oa.error_response("not judged here")}
    routes.get(
        "/v1/analysis",
        summary="Every judged release's verdict.",
        ok=oa.listing("releases", verdict),
    )
    routes.get(
        "/v1/analysis/{release}",
        summary="A release's verdict (what an Argo Rollouts web metric reads).",
        params=[release],
        ok=verdict,
        responses=not_judged,
    )
    routes.post(
        "/v1/analysis/{release}/reset",
        summary="Start the release's canary afresh (the noise floor is kept).",
        params=[release],
        admin=True,
        ok=verdict,
        responses=not_judged,
    )
    routes.post(
        "/v1/flagger",
        summary="A Flagger webhook: 200 advances the canary, 412 halts it.",
        body=spec.model(FlaggerPayload),
        ok=verdict,
        responses={
            412: oa.error_response(
                "fail, or inconclusive unless metadata says pass (the verdict's fields "
                "follow the error)"
            ),
            **not_judged,
        },
    )


def install(app: web.Application, judge: Judge) -> None:
    """Describe the judge's routes in its ``/openapi.json``."""
    add_describer(app, lambda spec, a: describe(spec, a, judge))
