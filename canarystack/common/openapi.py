"""``GET /openapi.json``: every component publishes its HTTP API as an OpenAPI 3.1 document,
generated from its describers (``canarystack.<component>.api_spec``) and the shared
routes described here, so a route added without a description cannot hide.

This module must never import a component (components import it) or change a request.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from canary_contract import strictjson
from canarystack.common.apispec import (
    ANY_OBJECT,
    INTEGER,
    METHODS,
    NUMBER,
    REF_PREFIX,
    STRING,
    ApiSpec,
    OpenApiDocument,
    Param,
    SchemaObject,
    array,
    error_response,
    json_body,
    listing,
    obj,
    path_str,
    schema_required,
    sub_schema,
    text_response,
)
from canarystack.common.component import Component

# -- the shared routes (canarystack.common.app) ------------------------------------------
HEALTH_SCHEMA: SchemaObject = obj(
    ("status", "component", "version", "pid", "uptime_s"),
    status={"type": "string", "enum": ["ok", "degraded"]},
    component=STRING,
    version=STRING,
    pid=INTEGER,
    uptime_s=NUMBER,
    degraded_reasons=array(STRING),
)
# A fault as /admin/faults lists it; POST's answer (InjectedFault) adds "replaced".
FAULT_REQUIRED = ("id", "kind", "params", "ttl_s", "injected_at", "expires_at", "remaining_s")
FAULT_PROPERTIES: dict[str, SchemaObject] = {
    "id": STRING,
    "kind": STRING,
    "params": ANY_OBJECT,
    "ttl_s": NUMBER,
    "injected_at": NUMBER,
    "expires_at": NUMBER,
    "remaining_s": {"type": "number", "minimum": 0},
}
FAULT_SCHEMA = obj(FAULT_REQUIRED, **FAULT_PROPERTIES)


def fault_body_schema(spec: ApiSpec, component: Component) -> SchemaObject:
    """The body of ``POST /admin/faults``: one variant per kind, with its parameters flat
    (``{"kind", "ttl_s", ...params}``) or under ``params`` (``canarystack.common.faults``)."""
    faults = component.faults
    ttl: SchemaObject = {"type": "number", "exclusiveMinimum": 0}
    if math.isfinite(faults.max_ttl_s):
        ttl["maximum"] = faults.max_ttl_s
    ttl["description"] = "seconds until the fault ends by itself (required, capped)"
    variants: list[SchemaObject] = []
    for kind in sorted(faults.kinds):
        params = spec.model_schema(faults.kinds[kind])
        props = dict(sub_schema(params, "properties"))
        required = schema_required(params)
        head: dict[str, SchemaObject] = {"kind": {"const": kind}, "ttl_s": ttl}
        variants.append(
            {
                "type": "object",
                "title": f"{kind} fault",
                "properties": {**head, **props},
                "required": ["kind", "ttl_s", *required],
                "additionalProperties": False,
            }
        )
        nested: SchemaObject = {
            "type": "object",
            "properties": props,
            "additionalProperties": False,
        }
        if required:
            nested["required"] = required
        variants.append(
            {
                "type": "object",
                "title": f"{kind} fault, parameters under 'params'",
                "properties": {**head, "params": nested},
                "required": ["kind", "ttl_s", "params"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": variants}


def describe_common(spec: ApiSpec, component: Component) -> None:
    """``/health``, ``/metrics``, ``/admin/faults`` and ``/openapi.json``."""
    common_routes = spec.routes("common")
    common_routes.get(
        "/health",
        summary="Liveness and readiness; 503 when the component reports itself degraded.",
        responses={
            200: json_body(spec.named("Health", HEALTH_SCHEMA), "ok"),
            503: json_body({"$ref": REF_PREFIX + "Health"}, "degraded (status != ok)"),
        },
    )
    common_routes.get(
        "/metrics",
        summary="Prometheus metrics (text exposition format).",
        responses={200: text_response("Prometheus text")},
    )
    common_routes.get(
        "/openapi.json",
        summary="This document.",
        responses={200: json_body(obj(("openapi", "info", "paths")), "OpenAPI 3.1")},
    )
    fault_routes = spec.routes("faults")
    fault = spec.named("Fault", FAULT_SCHEMA)
    cleared = listing("cleared", fault)
    fault_routes.get(
        "/admin/faults",
        summary="The active faults.",
        admin=True,
        ok=listing("faults", fault),
    )
    kinds = ", ".join(sorted(component.faults.kinds))
    fault_routes.post(
        "/admin/faults",
        summary=f"Inject a fault ({kinds}); it ends by itself after ttl_s.",
        admin=True,
        body=spec.named(
            f"{component.name.capitalize()}FaultRequest", fault_body_schema(spec, component)
        ),
        params=[Param("x-actor", "header", STRING, "who injects it (logged)")],
        responses={
            201: json_body(
                spec.named(
                    "InjectedFault",
                    obj(
                        (*FAULT_REQUIRED, "replaced"),
                        **FAULT_PROPERTIES,
                        replaced=array(STRING),
                    ),
                ),
                "injected; 'replaced' lists the ids of the older fault of its kind it "
                "replaced for good",
            ),
            429: error_response("the cap on active faults is reached"),
        },
    )
    fault_routes.delete(
        "/admin/faults",
        summary="Clear every active fault.",
        admin=True,
        params=[Param("x-actor", "header", STRING, "who clears them (logged)")],
        ok=cleared,
    )
    fault_routes.delete(
        "/admin/faults/{fault_id}",
        summary="Clear one fault.",
        admin=True,
        params=[path_str("fault_id", "the id POST /admin/faults answered")],
        ok=cleared,
        responses={404: error_response("no such active fault")},
    )


# -- the route and its describers -----------------------------------------------------
Describer = Callable[[ApiSpec, web.Application], None]


@dataclass
class _OpenApiState:
    component: Component
    describers: list[Describer] = field(default_factory=list)
    body: bytes | None = None


OPENAPI: web.AppKey[_OpenApiState] = web.AppKey("openapi", _OpenApiState)


def install(app: web.Application, component: Component) -> None:
    """Serve ``GET /openapi.json`` for ``component`` (``create_app`` calls it): the route
    and an empty list of describers. A component's ``build_app`` then calls its
    ``api_spec.install(app)``, which adds a describer with ``add_describer``."""
    app[OPENAPI] = _OpenApiState(component=component)
    app.router.add_get("/openapi.json", _serve)


def add_describer(app: web.Application, describer: Describer) -> None:
    """Add a component's operations to the document (called from its ``build_app``)."""
    state = app[OPENAPI]
    state.describers.append(describer)
    state.body = None


def live_routes(app: web.Application) -> set[tuple[str, str]]:
    """``(method, path template)`` of every route the app serves (HEAD left out)."""
    routes: set[tuple[str, str]] = set()
    for route in app.router.routes():
        method = route.method.lower()
        canonical = route.resource.canonical if route.resource is not None else None
        if method in METHODS and canonical:
            routes.add((method, canonical))
    return routes


def build_document(app: web.Application) -> OpenApiDocument:
    """The document: the shared routes, then every describer's operations. Each route the
    live aiohttp router serves that no describer documented is listed under
    ``x-undocumented-routes``, each documented operation it does not serve under
    ``x-unrouted-operations``; both are empty in a correct build (tests/test_api_fuzz.py
    checks them). Built on the first request and kept."""
    component = app[OPENAPI].component
    spec = ApiSpec(
        f"canarystack {component.name}",
        component.version,
        f"The HTTP API of the canarystack {component.name} (docs/ARCHITECTURE.md). Errors "
        "use the OpenAI error shape (components/schemas/Error).",
    )
    describe_common(spec, component)
    for describer in app[OPENAPI].describers:
        describer(spec, app)
    doc = spec.document()
    documented = {(m, p) for p, ops in spec.paths.items() for m in ops}
    live = live_routes(app)
    doc["x-undocumented-routes"] = sorted(f"{m.upper()} {p}" for m, p in live - documented)
    doc["x-unrouted-operations"] = sorted(f"{m.upper()} {p}" for m, p in documented - live)
    return doc


async def _serve(request: web.Request) -> web.Response:
    state = request.app[OPENAPI]
    if state.body is None:
        state.body = strictjson.dumps_bytes(build_document(request.app))
    return web.Response(body=state.body, content_type="application/json")
