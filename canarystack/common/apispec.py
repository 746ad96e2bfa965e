"""Writing an OpenAPI 3.1 document: schema helpers, parameters and ``ApiSpec``.

Request bodies come from the pydantic models that validate them; the rest is written
with ``obj``/``nullable``/``json_body``. The OpenAPI objects the document is made of are
typed here, once, for every component (``OperationObject``, ``ResponseObject``, ...). This
module must never import a component, nor serve anything (``canarystack.common.openapi``
serves the document).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Required, TypeAlias, TypedDict, Unpack, get_args

from pydantic import BaseModel

OPENAPI_VERSION = "3.1.0"
REF_PREFIX = "#/components/schemas/"
REF_TEMPLATE = REF_PREFIX + "{model}"
ADMIN_SECURITY = "adminToken"
ERROR_SCHEMA_NAME = "Error"

# -- the OpenAPI 3.1 objects this module writes (their fields as the spec names them) -----
# A Schema Object: JSON Schema 2020-12, written here (``obj``, ``nullable``, ...) or made by
# pydantic. Its keywords are too many and too open to spell as a TypedDict, so a reader
# narrows what it takes out of one (``sub_schema``, ``schema_required``).
SchemaObject: TypeAlias = dict[str, object]
Method = Literal["get", "put", "post", "delete", "patch"]
Location = Literal["path", "query", "header"]


class MediaTypeObject(TypedDict, total=False):
    schema: SchemaObject


class ResponseObject(TypedDict, total=False):
    description: Required[str]
    content: dict[str, MediaTypeObject]


class RequestBodyObject(TypedDict, total=False):
    content: Required[dict[str, MediaTypeObject]]
    required: bool


# ``in`` is a Python keyword, hence the functional syntax.
ParameterObject = TypedDict(
    "ParameterObject",
    {
        "name": Required[str],
        "in": Required[Location],
        "required": bool,
        "schema": SchemaObject,
        "description": str,
    },
    total=False,
)


class OperationObject(TypedDict, total=False):
    operationId: str
    summary: str
    description: str
    tags: list[str]
    parameters: list[ParameterObject]
    requestBody: RequestBodyObject
    # Each requirement: a security scheme's name and its scopes (none for a bearer token).
    security: list[dict[str, list[str]]]
    # By status code ("200", "4XX") or "default".
    responses: dict[str, ResponseObject]


class PathItemObject(TypedDict, total=False):
    get: OperationObject
    put: OperationObject
    post: OperationObject
    delete: OperationObject
    patch: OperationObject


class InfoObject(TypedDict, total=False):
    title: Required[str]
    version: Required[str]
    description: str


class SecuritySchemeObject(TypedDict, total=False):
    type: Required[str]
    scheme: str
    description: str


class ComponentsObject(TypedDict, total=False):
    schemas: dict[str, SchemaObject]
    securitySchemes: dict[str, SecuritySchemeObject]


# The document; the two extensions are ``canarystack.common.openapi.build_document``'s.
OpenApiDocument = TypedDict(
    "OpenApiDocument",
    {
        "openapi": Required[str],
        "info": Required[InfoObject],
        "paths": dict[str, PathItemObject],
        "components": ComponentsObject,
        "x-undocumented-routes": list[str],
        "x-unrouted-operations": list[str],
    },
    total=False,
)


def as_schema(value: object, what: str) -> SchemaObject:
    """``value``, a schema read out of another one (``what`` names it in the error)."""
    if not isinstance(value, dict):
        raise TypeError(f"JSON schema: {what} is {type(value).__name__}, not an object")
    return value


def sub_schema(schema: SchemaObject, key: str) -> SchemaObject:
    """``schema[key]``, itself a JSON object (``properties``, ``$defs``, a property's schema):
    the stored one, so changing it changes ``schema``; a new empty one where ``schema`` has
    no ``key``."""
    return as_schema(schema.get(key, {}), repr(key))


def schema_required(schema: SchemaObject) -> list[str]:
    """A copy of an object schema's ``required`` (empty where it has none)."""
    names = schema.get("required", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"JSON schema: 'required' is {names!r}, not a list of names")
    return list(names)


ERROR_SCHEMA: SchemaObject = {
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
METHODS: tuple[Method, ...] = get_args(Method)


@dataclass
class Param:
    """A path, query or header parameter."""

    name: str
    where: Location
    schema: SchemaObject
    description: str = ""
    required: bool = False

    def to_json(self) -> ParameterObject:
        out: ParameterObject = {
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
    schema: SchemaObject = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return Param(name, "query", schema, description)


def path_str(name: str, description: str, pattern: str | None = None) -> Param:
    schema: SchemaObject = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return Param(name, "path", schema, description, required=True)


def json_body(schema: SchemaObject, description: str = "") -> ResponseObject:
    """A response whose body is JSON of ``schema``."""
    return {
        "description": description or "JSON",
        "content": {"application/json": {"schema": schema}},
    }


def error_response(description: str) -> ResponseObject:
    return json_body({"$ref": REF_PREFIX + ERROR_SCHEMA_NAME}, description)


def text_response(description: str, media_type: str = "text/plain") -> ResponseObject:
    return {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}


def obj(required: Sequence[str] = (), **properties: SchemaObject) -> SchemaObject:
    """A JSON object schema (extra properties allowed: answers may grow)."""
    out: SchemaObject = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    return out


def nullable(schema: SchemaObject) -> SchemaObject:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: SchemaObject) -> SchemaObject:
    return {"type": "array", "items": items}


def listing(
    key: str, items: SchemaObject, required: Sequence[str] = (), **more: SchemaObject
) -> SchemaObject:
    """A list answer: ``key`` holds an array of ``items``; ``more`` are its other fields
    (those in ``required`` always present)."""
    return obj((key, *required), **{key: array(items)}, **more)


NUMBER: SchemaObject = {"type": "number"}
INTEGER: SchemaObject = {"type": "integer"}
STRING: SchemaObject = {"type": "string"}
BOOLEAN: SchemaObject = {"type": "boolean"}
ANY_OBJECT: SchemaObject = {"type": "object"}


class ApiSpec:
    """An OpenAPI document under construction."""

    def __init__(self, title: str, version: str, description: str = "") -> None:
        self.info: InfoObject = {"title": title, "version": version}
        if description:
            self.info["description"] = description
        self.paths: dict[str, PathItemObject] = {}
        self.schemas: dict[str, SchemaObject] = {ERROR_SCHEMA_NAME: copy.deepcopy(ERROR_SCHEMA)}

    # -- schemas ------------------------------------------------------------------------
    def _register(self, name: str, schema: SchemaObject) -> None:
        known = self.schemas.get(name)
        if known is not None and known != schema:
            raise ValueError(
                f"OpenAPI: two different schemas are both named {name!r}; rename one model"
            )
        self.schemas[name] = schema

    def model(
        self, model: type[BaseModel], mode: Literal["validation", "serialization"] = "validation"
    ) -> SchemaObject:
        """A ``$ref`` to ``model``'s JSON schema (its nested models registered too)."""
        schema = model.model_json_schema(ref_template=REF_TEMPLATE, mode=mode)
        return {"$ref": REF_PREFIX + self.inline_model_defs(schema, model.__name__)}

    def inline_model_defs(self, schema: SchemaObject, name: str) -> str:
        """Register ``schema`` (a pydantic schema with ``$defs``) as ``name``; its name."""
        self._register(name, self._without_defs(schema))
        return name

    def model_schema(self, model: type[BaseModel]) -> SchemaObject:
        """``model``'s schema itself (for editing), its nested models registered."""
        return self._without_defs(model.model_json_schema(ref_template=REF_TEMPLATE))

    def _without_defs(self, schema: SchemaObject) -> SchemaObject:
        """A copy of ``schema`` less its ``$defs``, each of those registered by its name."""
        schema = dict(schema)
        for def_name, sub in as_schema(schema.pop("$defs", {}), "'$defs'").items():
            self._register(def_name, as_schema(sub, def_name))
        return schema

    def named(self, name: str, schema: SchemaObject) -> SchemaObject:
        """Register a hand-written schema; a ``$ref`` to it."""
        self._register(name, schema)
        return {"$ref": REF_PREFIX + name}

    def refine(self, name: str, prop: str, schema: SchemaObject) -> None:
        """Say more exactly what a registered schema's property takes, where its model
        validates by hand (a field typed ``Any`` with a validator). A property the model no
        longer has is left alone: the model stays the source of truth."""
        props = sub_schema(self.schemas.get(name, {}), "properties")
        if prop in props:
            old = as_schema(props[prop], prop)
            props[prop] = {**schema, **({"title": old["title"]} if "title" in old else {})}

    # -- operations ---------------------------------------------------------------------
    def add(
        self,
        method: Method,
        path: str,
        *,
        summary: str,
        responses: Mapping[int | str, ResponseObject] | None = None,
        ok: SchemaObject | None = None,
        operation_id: str | None = None,
        description: str = "",
        tag: str | None = None,
        params: Iterable[Param] = (),
        body: SchemaObject | None = None,
        body_required: bool = True,
        body_media_type: str = "application/json",
        admin: bool = False,
    ) -> None:
        """One operation. ``ok``: the schema of its 200 JSON answer (the common case),
        else every answer in ``responses``."""
        if method not in METHODS:
            raise ValueError(f"OpenAPI: unsupported method {method!r} for {path}")
        ops = self.paths.setdefault(path, {})
        if method in ops:
            raise ValueError(f"OpenAPI: {method.upper()} {path} is described twice")
        op: OperationObject = {
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
        resp: dict[str, ResponseObject] = {} if ok is None else {"200": json_body(ok)}
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

    def document(self) -> OpenApiDocument:
        return {
            "openapi": OPENAPI_VERSION,
            "info": self.info,
            "paths": {p: ops.copy() for p, ops in self.paths.items()},
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
    responses: Mapping[int | str, ResponseObject] | None
    ok: SchemaObject | None
    operation_id: str | None
    description: str
    params: Iterable[Param]
    body: SchemaObject | None
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
