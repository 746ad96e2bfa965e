"""The gate's OpenAPI description (``GET /openapi.json``; docs/ARCHITECTURE.md §3).

The sample batch is ``canarystack.gate.state.SampleBatch``, the pydantic model that
validates it. The state answers are described by their top-level fields only: the
statistics under them grow with the tests. This module must never change how a request
is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.common import apispec as oa
from canarystack.common.openapi import add_describer
from canarystack.gate.keys import SERVICE
from canarystack.gate.state import STATES, SampleBatch

TAG = "gate"


def _gate_schema(states: list[str]) -> oa.SchemaObject:
    return oa.obj(
        ("release", "state"),
        release=oa.STRING,
        state={"type": "string", "enum": states},
        revision=oa.nullable(oa.INTEGER),
        phase=oa.nullable(oa.STRING),
        buckets=oa.ANY_OBJECT,
        noise_floor=oa.ANY_OBJECT,
        false_alarm_budget=oa.ANY_OBJECT,
        trip=oa.nullable(oa.ANY_OBJECT),
    )


def describe(spec: oa.ApiSpec, app: web.Application) -> None:
    service = app[SERVICE]
    watched = sorted(service.gates)
    gate = spec.named("GateStatus", _gate_schema(list(STATES)))
    batch = spec.model(SampleBatch)
    # What the handler checks by hand: the release must be one this gate watches (else
    # 404) and every bucket one of its --bucket-edges labels (else 400).
    spec.refine("SampleBatch", "release", {"type": "string", "enum": watched})
    buckets: oa.SchemaObject = {"type": "string", "enum": list(service.config.labels)}
    spec.refine("Comparison", "bucket", buckets)
    spec.refine("Outcome", "bucket", buckets)
    count = {"type": "integer", "minimum": 0}
    routes = spec.routes(TAG)
    routes.post(
        "/v1/samples",
        summary="A router's batch of shadow comparisons and outcomes, validated whole.",
        admin=True,
        body=batch,
        responses={
            200: oa.json_body(
                oa.obj(
                    ("release", "accepted", "state"),
                    release=oa.STRING,
                    accepted=oa.obj(
                        ("comparisons", "outcomes"),
                        comparisons=count,
                        noise_comparisons=count,
                        outcomes=count,
                    ),
                    ignored={"type": "object", "additionalProperties": oa.INTEGER},
                    state=oa.STRING,
                ),
                "accepted",
            ),
            404: oa.error_response("this gate does not watch the batch's release"),
        },
    )
    routes.get(
        "/v1/gate",
        summary="Every watched release's state.",
        ok=oa.listing("gates", gate, ("false_alarm_budget",), false_alarm_budget=oa.ANY_OBJECT),
    )
    routes.get(
        "/v1/gate/{release}",
        summary="One release's state, statistics, noise floor and trip evidence.",
        params=[oa.Param("release", "path", {"type": "string", "enum": watched}, required=True)],
        ok=gate,
        responses={404: oa.error_response("not watched by this gate")},
    )


def install(app: web.Application) -> None:
    """Describe the gate's routes in its ``/openapi.json``."""
    add_describer(app, describe)
