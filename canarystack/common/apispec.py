"""Writing an OpenAPI 3.1 document: schema helpers, parameters and ``ApiSpec``.

Request bodies come from the pydantic models that validate them; the rest is written
with ``obj``/``nullable``/``json_body``. This module must never import a component, nor
serve anything (``canarystack.common.openapi`` serves the document).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Required, TypedDict, Unpack

from pydantic import BaseModel

from canary_contract.json import JsonObject

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


def array(items: JsonObject) -> JsonObject:
    return {"type": "array", "items": items}


def listing(
    key: str, items: JsonObject, required: Sequence[str] = (), **more: JsonObject
) -> JsonObject:
    """A list answer: ``key`` holds an array of ``items``; ``more`` are its other fields
    (those in ``required`` always present)."""
    return obj((key, *required), **{key: array(items)}, **more)


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
        responses: Mapping[int | str, JsonObject] | None = None,
        ok: JsonObject | None = None,
        operation_id: str | None = None,
        description: str = "",
        tag: str | None = None,
        params: Iterable[Param] = (),
        body: JsonObject | None = None,
        body_required: bool = True,
        body_media_type: str = "application/json",
        admin: bool = False,
    ) -> None:
        """One operation. ``ok``: the schema of its 200 JSON answer (the common case),
        else every answer in ``responses``."""
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
        resp: dict[str, JsonObject] = {} if ok is None else {"200": json_body(ok)}
        resp.update((str(k), v) for k, v in (responses or {}).items())
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

    def routes(self, tag: str) -> TaggedRoutes:
        """``add`` for the operations under ``tag``, a method each: ``routes.get(path,
        summary=...)`` is ``add("get", path, summary=..., tag=tag)``."""
        return TaggedRoutes(self, tag)

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


class Operation(TypedDict, total=False):
    """``ApiSpec.add``'s keyword arguments but ``tag`` (``TaggedRoutes`` gives that)."""

    summary: Required[str]
    responses: Mapping[int | str, JsonObject] | None
    ok: JsonObject | None
    operation_id: str | None
    description: str
    params: Iterable[Param]
    body: JsonObject | None
    body_required: bool
    body_media_type: str
    admin: bool


@dataclass(frozen=True)
class TaggedRoutes:
    """``ApiSpec.add`` for the operations of one tag (``ApiSpec.routes``), named by their
    method as aiohttp names routes (``web.get(path, handler)``)."""

    spec: ApiSpec
    tag: str

    def get(self, path: str, **op: Unpack[Operation]) -> None:
        self.spec.add("get", path, tag=self.tag, **op)

    def post(self, path: str, **op: Unpack[Operation]) -> None:
        self.spec.add("post", path, tag=self.tag, **op)

    def patch(self, path: str, **op: Unpack[Operation]) -> None:
        self.spec.add("patch", path, tag=self.tag, **op)

    def delete(self, path: str, **op: Unpack[Operation]) -> None:
        self.spec.add("delete", path, tag=self.tag, **op)


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}").replace(".", "_").replace("-", "_") for w in path.split("/") if w]
    return "_".join([method, *words]) or method
