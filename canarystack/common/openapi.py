"""``GET /openapi.json``: every component publishes its HTTP API as an OpenAPI 3.1 document.

The document is generated, not written by hand: request bodies come from the pydantic
models that already validate them (``Model.model_json_schema(ref_template=...)``), the
shared parts (``/health``, ``/metrics``, ``/admin/faults``, the error shape) from here, and
the fault bodies from the component's own ``FaultRegistry`` (its kinds and ``max_ttl_s``).

Wiring:

- ``create_app`` calls ``install(app)``: the route and an empty list of describers;
- a component's ``build_app`` calls its ``canarystack.<component>.api_spec.install(app)``,
  which adds a describer: a function that adds the component's operations to an
  ``ApiSpec``.

The document is built on the first request and kept. Every route in the live aiohttp
router that no describer documented is listed under ``x-undocumented-routes``, and every
documented operation the router does not serve under ``x-unrouted-operations``; both
lists are empty in a correct build (tests/test_api_fuzz.py checks them), so a route added
without a description cannot hide.

This module must never import a component (components import it) or change a request.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from aiohttp import web
from pydantic import BaseModel

from canary_contract.json import JsonObject
from canarystack.common import strictjson

if TYPE_CHECKING:
    from canarystack.common.app import Component

OPENAPI_VERSION = "3.1.0"
REF_PREFIX = "#/components/schemas/"
REF_TEMPLATE = REF_PREFIX + "{model}"
ADMIN_SECURITY = "adminToken"
ERROR_SCHEMA_NAME = "Error"
ERROR_SCHEMA: JsonObject = {
    "type": "object",
    "description": "Every 4xx/5xx answer: the OpenAI error shape (extra top-level fields may "
    "follow, e.g. the digests of a digest mismatch).",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string", "minLength": 1},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
METHODS = ("get", "put", "post", "delete", "patch")


@dataclass
class Param:
    """A path, query or header parameter."""

    name: str
    where: Literal["path", "query", "header"]
    schema: JsonObject
    description: str = ""
    required: bool = False

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "name": self.name,
            "in": self.where,
            "required": True if self.where == "path" else self.required,
            "schema": self.schema,
        }
        if self.description:
            out["description"] = self.description
        return out


def query_int(
    name: str, description: str, *, minimum: int = 0, maximum: int | None = None
) -> Param:
    schema: JsonObject = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return Param(name, "query", schema, description)


def path_str(name: str, description: str, pattern: str | None = None) -> Param:
    schema: JsonObject = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return Param(name, "path", schema, description, required=True)


def json_body(schema: JsonObject, description: str = "") -> JsonObject:
    """A response whose body is JSON of ``schema``."""
    return {
        "description": description or "JSON",
        "content": {"application/json": {"schema": schema}},
    }


def error_response(description: str) -> JsonObject:
    return json_body({"$ref": REF_PREFIX + ERROR_SCHEMA_NAME}, description)


def text_response(description: str, media_type: str = "text/plain") -> JsonObject:
    return {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}


def obj(required: Sequence[str] = (), **properties: JsonObject) -> JsonObject:
    """A JSON object schema (extra properties allowed: answers may grow)."""
    out: JsonObject = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    return out


def nullable(schema: JsonObject) -> JsonObject:
    return {"anyOf": [schema, {"type": "null"}]}


NUMBER: JsonObject = {"type": "number"}
INTEGER: JsonObject = {"type": "integer"}
STRING: JsonObject = {"type": "string"}
BOOLEAN: JsonObject = {"type": "boolean"}
ANY_OBJECT: JsonObject = {"type": "object"}


class ApiSpec:
    """An OpenAPI document under construction."""

    def __init__(self, title: str, version: str, description: str = "") -> None:
        self.info: JsonObject = {"title": title, "version": version}
        if description:
            self.info["description"] = description
        self.paths: dict[str, dict[str, JsonObject]] = {}
        self.schemas: dict[str, JsonObject] = {ERROR_SCHEMA_NAME: copy.deepcopy(ERROR_SCHEMA)}

    # -- schemas ------------------------------------------------------------------------
    def _register(self, name: str, schema: JsonObject) -> None:
        known = self.schemas.get(name)
        if known is not None and known != schema:
            raise ValueError(
                f"OpenAPI: two different schemas are both named {name!r}; rename one model"
            )
        self.schemas[name] = schema

    def model(
        self, model: type[BaseModel], mode: Literal["validation", "serialization"] = "validation"
    ) -> JsonObject:
        """A ``$ref`` to ``model``'s JSON schema (its nested models registered too)."""
        schema = model.model_json_schema(ref_template=REF_TEMPLATE, mode=mode)
        return {"$ref": REF_PREFIX + self.inline_model_defs(schema, model.__name__)}

    def inline_model_defs(self, schema: JsonObject, name: str) -> str:
        """Register ``schema`` (a pydantic schema with ``$defs``) as ``name``; its name."""
        schema = dict(schema)
        for def_name, sub in schema.pop("$defs", {}).items():
            self._register(def_name, sub)
        self._register(name, schema)
        return name

    def model_schema(self, model: type[BaseModel]) -> JsonObject:
        """``model``'s schema itself (for editing), its nested models registered."""
        schema = dict(model.model_json_schema(ref_template=REF_TEMPLATE))
        for def_name, sub in schema.pop("$defs", {}).items():
            self._register(def_name, sub)
        return schema

    def named(self, name: str, schema: JsonObject) -> JsonObject:
        """Register a hand-written schema; a ``$ref`` to it."""
        self._register(name, schema)
        return {"$ref": REF_PREFIX + name}

    def refine(self, name: str, prop: str, schema: JsonObject) -> None:
        """Say more exactly what a registered schema's property takes, where its model
        validates by hand (a field typed ``Any`` with a validator). A property the model no
        longer has is left alone: the model stays the source of truth."""
        props = self.schemas.get(name, {}).get("properties", {})
        if prop in props:
            old = props[prop]
            props[prop] = {**schema, **({"title": old["title"]} if "title" in old else {})}

    # -- operations ---------------------------------------------------------------------
    def add(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        responses: Mapping[int | str, JsonObject],
        operation_id: str | None = None,
        description: str = "",
        tag: str | None = None,
        params: Iterable[Param] = (),
        body: JsonObject | None = None,
        body_required: bool = True,
        body_media_type: str = "application/json",
        admin: bool = False,
    ) -> None:
        method = method.lower()
        if method not in METHODS:
            raise ValueError(f"OpenAPI: unsupported method {method!r} for {path}")
        ops = self.paths.setdefault(path, {})
        if method in ops:
            raise ValueError(f"OpenAPI: {method.upper()} {path} is described twice")
        op: JsonObject = {
            "operationId": operation_id or _operation_id(method, path),
            "summary": summary,
        }
        if description:
            op["description"] = description
        if tag:
            op["tags"] = [tag]
        plist = [p.to_json() for p in params]
        if plist:
            op["parameters"] = plist
        if body is not None:
            op["requestBody"] = {
                "required": body_required,
                "content": {body_media_type: {"schema": body}},
            }
        resp: dict[str, JsonObject] = {str(k): v for k, v in responses.items()}
        if admin:
            op["security"] = [{ADMIN_SECURITY: []}]
            resp.setdefault(
                "401", error_response("No, a malformed or a wrong admin token (Bearer).")
            )
        if body is not None or plist:
            resp.setdefault("400", error_response("The request names the wrong field or value."))
        resp.setdefault("default", error_response("Any other error, in the same shape."))
        op["responses"] = resp
        ops[method] = op

    def document(self) -> JsonObject:
        return {
            "openapi": OPENAPI_VERSION,
            "info": self.info,
            "paths": {p: dict(ops) for p, ops in self.paths.items()},
            "components": {
                "schemas": self.schemas,
                "securitySchemes": {
                    ADMIN_SECURITY: {
                        "type": "http",
                        "scheme": "bearer",
                        "description": "The admin token (the stack's state folder, file "
                        "admin-token; CANARYSTACK_ADMIN_TOKEN or --admin-token-file).",
                    }
                },
            },
        }


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}").replace(".", "_").replace("-", "_") for w in path.split("/") if w]
    return "_".join([method, *words]) or method


# -- the shared routes (canarystack.common.app) ------------------------------------------
HEALTH_SCHEMA: JsonObject = obj(
    ("status", "component", "version", "pid", "uptime_s"),
    status={"type": "string", "enum": ["ok", "degraded"]},
    component=STRING,
    version=STRING,
    pid=INTEGER,
    uptime_s=NUMBER,
    degraded_reasons={"type": "array", "items": STRING},
)
FAULT_SCHEMA: JsonObject = obj(
    ("id", "kind", "params", "ttl_s", "injected_at", "expires_at", "remaining_s"),
    id=STRING,
    kind=STRING,
    params=ANY_OBJECT,
    ttl_s=NUMBER,
    injected_at=NUMBER,
    expires_at=NUMBER,
    remaining_s={"type": "number", "minimum": 0},
)


def fault_body_schema(spec: ApiSpec, component: Component) -> JsonObject:
    """The body of ``POST /admin/faults``: one variant per kind, with its parameters flat
    (``{"kind", "ttl_s", ...params}``) or under ``params`` (``canarystack.common.faults``)."""
    faults = component.faults
    ttl: JsonObject = {"type": "number", "exclusiveMinimum": 0}
    if math.isfinite(faults.max_ttl_s):
        ttl["maximum"] = faults.max_ttl_s
    ttl["description"] = "seconds until the fault ends by itself (required, capped)"
    variants: list[JsonObject] = []
    for kind in sorted(faults.kinds):
        params = spec.model_schema(faults.kinds[kind])
        props = dict(params.get("properties", {}))
        required = list(params.get("required", []))
        head = {"kind": {"const": kind}, "ttl_s": ttl}
        variants.append(
            {
                "type": "object",
                "title": f"{kind} fault",
                "properties": {**head, **props},
                "required": ["kind", "ttl_s", *required],
                "additionalProperties": False,
            }
        )
        nested: JsonObject = {"type": "object", "properties": props, "additionalProperties": False}
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
    spec.add(
        "get",
        "/health",
        summary="Liveness and readiness; 503 when the component reports itself degraded.",
        tag="common",
        responses={
            200: json_body(spec.named("Health", HEALTH_SCHEMA), "ok"),
            503: json_body({"$ref": REF_PREFIX + "Health"}, "degraded (status != ok)"),
        },
    )
    spec.add(
        "get",
        "/metrics",
        summary="Prometheus metrics (text exposition format).",
        tag="common",
        responses={200: text_response("Prometheus text")},
    )
    spec.add(
        "get",
        "/openapi.json",
        summary="This document.",
        tag="common",
        responses={200: json_body(obj(("openapi", "info", "paths")), "OpenAPI 3.1")},
    )
    fault = spec.named("Fault", FAULT_SCHEMA)
    cleared = obj(("cleared",), cleared={"type": "array", "items": fault})
    spec.add(
        "get",
        "/admin/faults",
        summary="The active faults.",
        tag="faults",
        admin=True,
        responses={200: json_body(obj(("faults",), faults={"type": "array", "items": fault}))},
    )
    kinds = ", ".join(sorted(component.faults.kinds))
    spec.add(
        "post",
        "/admin/faults",
        summary=f"Inject a fault ({kinds}); it ends by itself after ttl_s.",
        tag="faults",
        admin=True,
        body=spec.named(
            f"{component.name.capitalize()}FaultRequest", fault_body_schema(spec, component)
        ),
        params=[Param("x-actor", "header", STRING, "who injects it (logged)")],
        responses={201: json_body(fault, "injected")},
    )
    spec.add(
        "delete",
        "/admin/faults",
        summary="Clear every active fault.",
        tag="faults",
        admin=True,
        params=[Param("x-actor", "header", STRING, "who clears them (logged)")],
        responses={200: json_body(cleared)},
    )
    spec.add(
        "delete",
        "/admin/faults/{fault_id}",
        summary="Clear one fault.",
        tag="faults",
        admin=True,
        params=[path_str("fault_id", "the id POST /admin/faults answered")],
        responses={200: json_body(cleared), 404: error_response("no such active fault")},
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
    """Serve ``GET /openapi.json`` for ``component`` (called by ``create_app``)."""
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


def build_document(app: web.Application) -> JsonObject:
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
