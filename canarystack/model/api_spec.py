"""The model server's OpenAPI description (``GET /openapi.json``; docs/ARCHITECTURE.md §1),
also used by the router, which proxies the same two operations (``describe_generation``).

This module must never change how a request is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.common import apispec as oa
from canarystack.common.openapi import add_describer

TAG = "openai"

_LOGPROB_ENTRY: oa.SchemaObject = oa.obj(("token", "logprob"), token=oa.STRING, logprob=oa.NUMBER)
USAGE_SCHEMA: oa.SchemaObject = oa.obj(
    ("prompt_tokens", "completion_tokens", "total_tokens"),
    prompt_tokens=oa.INTEGER,
    completion_tokens=oa.INTEGER,
    total_tokens=oa.INTEGER,
)


def _completion(object_name: str, choice: oa.SchemaObject) -> oa.SchemaObject:
    """An OpenAI completion answer, chat answer or stream chunk: ``object`` is
    ``object_name``, each of ``choices`` is ``choice``."""
    return oa.obj(
        ("id", "object", "created", "model", "choices"),
        id=oa.STRING,
        object={"const": object_name},
        created=oa.INTEGER,
        model=oa.STRING,
        choices=oa.array(choice),
        usage=oa.nullable(USAGE_SCHEMA),
    )


COMPLETION_SCHEMA: oa.SchemaObject = _completion(
    "text_completion",
    oa.obj(
        ("index", "text", "logprobs", "finish_reason"),
        index=oa.INTEGER,
        text=oa.STRING,
        logprobs=oa.nullable(
            oa.obj(
                ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
                tokens=oa.array(oa.STRING),
                token_logprobs=oa.array(oa.nullable(oa.NUMBER)),
                top_logprobs={
                    "type": "array",
                    "items": oa.nullable({"type": "object", "additionalProperties": oa.NUMBER}),
                },
                text_offset=oa.array(oa.INTEGER),
            )
        ),
        finish_reason=oa.nullable(oa.STRING),
        stop_reason=oa.nullable(oa.STRING),
    ),
)
CHAT_COMPLETION_SCHEMA: oa.SchemaObject = _completion(
    "chat.completion",
    oa.obj(
        ("index", "message", "finish_reason"),
        index=oa.INTEGER,
        message=oa.obj(("role", "content"), role=oa.STRING, content=oa.nullable(oa.STRING)),
        logprobs=oa.nullable(
            oa.obj(
                ("content",),
                content={
                    "type": "array",
                    "items": {
                        "allOf": [
                            _LOGPROB_ENTRY,
                            oa.obj((), top_logprobs=oa.array(_LOGPROB_ENTRY)),
                        ]
                    },
                },
            )
        ),
        finish_reason=oa.nullable(oa.STRING),
    ),
)
MODELS_SCHEMA: oa.SchemaObject = oa.obj(
    ("object", "data"),
    object={"const": "list"},
    data={
        "type": "array",
        "items": oa.obj(
            ("id", "object", "created", "owned_by", "max_model_len"),
            id=oa.STRING,
            object={"const": "model"},
            created=oa.INTEGER,
            owned_by=oa.STRING,
            root=oa.nullable(oa.STRING),
            parent=oa.nullable(oa.STRING),
            max_model_len=oa.INTEGER,
            version=oa.STRING,
        ),
    },
)


def _sse(chunk_object: str) -> oa.MediaTypeObject:
    """One server-sent event of a stream (OpenAPI 3.1: the schema describes each event):
    ``data`` is a chunk's JSON, or ``[DONE]`` at the end."""
    chunk = _completion(chunk_object, oa.obj(("index",), index=oa.INTEGER))
    return {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "event": oa.STRING,
                "data": {
                    "anyOf": [
                        {"const": "[DONE]"},
                        {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": chunk,
                        },
                    ]
                },
            },
        }
    }


_TEXT_PART: oa.SchemaObject = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": oa.STRING},
}


def _stop(max_items: int) -> oa.SchemaObject:
    """``stop``: a string or a list of at most ``max_items`` (non-empty strings)."""
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": max_items},
        ],
        "description": "a stop string or a list of them (non-empty strings)",
    }


def request_headers() -> list[oa.Param]:
    """The headers a model server reads (and a router passes on)."""
    return [
        oa.Param("x-request-id", "header", oa.STRING, "the client's request id (echoed back)"),
        oa.Param("traceparent", "header", oa.STRING, "W3C trace context (logged)"),
        oa.Param(
            "x-traffic-tag", "header", oa.STRING, "a label for the request's traffic (logged)"
        ),
    ]


def describe_generation(
    spec: oa.ApiSpec,
    *,
    max_model_len: int | None,
    extra_params: list[oa.Param] | None = None,
    extra_responses: dict[int | str, oa.ResponseObject] | None = None,
) -> None:
    """``POST /v1/completions`` and ``POST /v1/chat/completions``. Request bodies are
    ``canarystack.model.schemas`` (the pydantic models that validate them), with the
    fields they check by hand (``prompt``, ``stop``, message ``content``) described as
    those validators accept them. Answers are the OpenAI/vLLM shapes of
    ``canarystack.model.render``: JSON, or ``text/event-stream`` with ``stream: true``."""
    from canarystack.model.schemas import (
        MAX_STOP_SEQUENCES,
        ChatCompletionRequest,
        CompletionRequest,
    )

    stop = _stop(MAX_STOP_SEQUENCES)
    tokens: oa.SchemaObject = {"type": "integer", "minimum": 1}
    if max_model_len is not None:
        tokens["maximum"] = max_model_len
    completion = spec.model(CompletionRequest)
    spec.refine(
        "CompletionRequest",
        "prompt",
        {
            "anyOf": [
                {"type": "string", "pattern": r"\S"},
                {
                    "type": "array",
                    "items": {"type": "string", "pattern": r"\S"},
                    "minItems": 1,
                    "maxItems": 1,
                },
            ],
            "description": "the prompt text (at least one token: an empty or blank prompt "
            "is a 400), or a list holding exactly one string",
        },
    )
    chat = spec.model(ChatCompletionRequest)
    spec.refine(
        "ChatMessage",
        "content",
        {
            "anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": _TEXT_PART}],
            "description": "a string, null, or text content parts (joined)",
        },
    )
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        spec.refine(name, "stop", stop)
        spec.refine(name, "n", {"anyOf": [{"const": 1}, {"type": "null"}], "default": 1})
        spec.refine(name, "best_of", {"anyOf": [{"const": 1}, {"type": "null"}]})
        spec.refine(name, "max_tokens", oa.nullable(tokens))
    spec.refine("ChatCompletionRequest", "max_completion_tokens", oa.nullable(tokens))
    spec.refine(
        "CompletionRequest",
        "echo",
        {
            "anyOf": [{"type": "boolean"}, {"type": "null"}],
            "description": "true: the prompt, with its tokens' logprobs when logprobs is "
            "set (teacher-forced scoring), comes before the answer; not with stream true",
        },
    )
    routes = spec.routes(TAG)
    params = [*request_headers(), *(extra_params or [])]
    errors: dict[int | str, oa.ResponseObject] = {
        404: oa.error_response("'model' names a model this server does not serve"),
        **(extra_responses or {}),
    }
    for path, kind, what, body, name, schema, chunk_object in (
        (
            "/v1/completions",
            "text completion",
            "completion",
            completion,
            "Completion",
            COMPLETION_SCHEMA,
            "text_completion",
        ),
        (
            "/v1/chat/completions",
            "chat completion",
            "chat completion",
            chat,
            "ChatCompletion",
            CHAT_COMPLETION_SCHEMA,
            "chat.completion.chunk",
        ),
    ):
        routes.post(
            path,
            summary=f"A {kind} (OpenAI/vLLM-compatible); SSE with stream: true.",
            params=params,
            body=body,
            responses={
                200: {
                    "description": f"the {what}",
                    "content": {
                        "application/json": {"schema": spec.named(name, schema)},
                        "text/event-stream": _sse(chunk_object),
                    },
                },
                **errors,
            },
        )


def describe_models(spec: oa.ApiSpec) -> None:
    spec.routes(TAG).get(
        "/v1/models",
        summary="The served model (vLLM's list shape, plus 'version').",
        ok=spec.named("ModelList", MODELS_SCHEMA),
    )


def install(app: web.Application, *, max_model_len: int) -> None:
    """Describe a model server's routes in its ``/openapi.json``."""

    def describe(spec: oa.ApiSpec, _app: web.Application) -> None:
        describe_generation(spec, max_model_len=max_model_len)
        describe_models(spec)

    add_describer(app, describe)
