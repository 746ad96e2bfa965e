"""What every model server does the same way (docs/ARCHITECTURE.md §1 and §1.1).

This module must never import an engine (no llama.cpp, no simulator model): the engine
pod imports it without the simulator, the simulator without llama.cpp.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self

from aiohttp import web

from canarystack.common.app import COMPONENT as COMPONENT_KEY
from canarystack.common.app import Component, create_app
from canarystack.common.auth import load_admin_token
from canarystack.common.cli import serve
from canarystack.common.colour import COLOUR_KEY, Colour
from canarystack.common.errors import ApiError, BadRequest, NotFound, error_response
from canarystack.common.faults import FaultParams, FaultRegistry
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.dependency.client import DependencyClient
from canarystack.model.metrics import ModelMetrics
from canarystack.model.schemas import ChatCompletionRequest, CompletionRequest, first_user_message

# Both model servers log and register faults as "model": to everyone else they are one kind.
COMPONENT = "model"
MAX_REQUEST_ID_CHARS = 200


# -- flags ------------------------------------------------------------------------------
def add_identity_options(group: argparse._ArgumentGroup) -> None:
    """``--version`` and ``--served-model-name``."""
    group.add_argument("--version", default="v1", help="model version name (default %(default)s)")
    group.add_argument(
        "--served-model-name",
        default="default",
        help="the name clients send in 'model' (default %(default)s)",
    )


def add_default_max_tokens_option(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--default-max-tokens",
        type=int,
        default=16,
        help="max_tokens when a request gives none (default %(default)s)",
    )


def check_shared_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Exit with a usage error naming the flag when a shared flag's value is unusable."""
    if args.default_max_tokens < 1:
        parser.error(f"--default-max-tokens {args.default_max_tokens}: give at least 1")
    if not args.version.strip() or not args.served_model_name.strip():
        parser.error("--version and --served-model-name must not be empty")


class ModelServerApp(Protocol):
    def health_extra(self) -> Mapping[str, object]: ...

    def add_routes(self, app: web.Application) -> None: ...


def run_model_server(
    args: argparse.Namespace,
    version: str,
    fault_kinds: Mapping[str, type[FaultParams]],
    build: Callable[[Component], ModelServerApp],
    *,
    client_max_size: int | None = None,
) -> None:
    """Wire a model server into a component (faults, admin token, /health) and serve it
    until SIGTERM. ``client_max_size`` caps what ``request.read()`` accepts (aiohttp's
    413), for the routes that read that way; None keeps ``create_app``'s default.

    Two processes serve the model-server contract: the simulator (``canarystack.model``) and
    the engine pod (``canarystack.engine``). What the contract fixes, and they share from here
    so the two cannot drift apart:

    - the flags ``--version``, ``--served-model-name`` and ``--default-max-tokens`` and their
      checks, and the component wiring (``run_model_server``);
    - the request checks: the ``model`` name and the context length (a 4xx naming the field);
    - the ``request_done`` record and log line, the ``x-model-version``/``x-request-id``
      headers, and the answer to a client mistake (``serve_logged``);
    - the ``/v1/models`` body.
    """
    log = get_logger(COMPONENT)
    faults = FaultRegistry(COMPONENT, fault_kinds, max_ttl_s=args.max_fault_ttl_s, log=log)
    component = Component(
        name=COMPONENT,
        version=version,
        admin_token=load_admin_token(args.admin_token_file),
        faults=faults,
        log=log,
    )
    server = build(component)
    component.health_extra = server.health_extra
    app = (
        create_app(component)
        if client_max_size is None
        else create_app(component, client_max_size=client_max_size)
    )
    server.add_routes(app)
    # Everything built so far (modules, the engine's tables) lives as long as the
    # process: out of the collector's sight, a full collection during a big answer
    # scans only that answer's objects (~2 ms instead of ~60 ms of a frozen loop).
    gc.freeze()
    serve(app, args, COMPONENT)


# -- request checks ---------------------------------------------------------------------
def check_model_name(requested: str | None, served: str) -> None:
    """A request may leave ``model`` out or name the served model; anything else is a 404."""
    if requested is not None and requested != served:
        shown = requested if len(requested) <= 100 else requested[:100] + "..."
        raise NotFound(
            f"The model `{shown}` does not exist. This server serves `{served}` "
            "(GET /v1/models lists it); send that name in 'model' or leave it out.",
            param="model",
            code="model_not_found",
        )


def resolve_max_tokens(
    max_tokens: int | None,
    prompt_tokens: int,
    *,
    max_len: int,
    default_max_tokens: int,
    prompt_field: str,
) -> int:
    """``max_tokens`` (the default when the request gives none, fitted into the context),
    or a 400 when prompt and completion do not fit into ``max_len`` tokens."""
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, max_len - prompt_tokens))
    if prompt_tokens + max_tokens > max_len:
        raise BadRequest(
            f"This model's maximum context length is {max_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
            f"{prompt_field}, {max_tokens} in the completion). Please reduce the length "
            f"of the {prompt_field} or max_tokens.",
            param="max_tokens" if prompt_tokens < max_len else prompt_field,
        )
    return max_tokens


# -- one request: the request_done record and line ----------------------------------------
@dataclass
class RequestRecord:
    """What the request_done log line says about one request."""

    request_id: str
    traceparent: str | None
    traffic_tag: str | None
    endpoint: str
    t_recv: float
    stream: bool = False
    status: int = 200
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    queue_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    # The shared dependency's result for this request (canarystack.dependency.client
    # RESULTS), None when the server has no dependency.
    dependency: str | None = None

    @classmethod
    def start(cls, request: web.Request) -> Self:
        """A record for a request that arrives now (the client's x-request-id when it is a
        usable one, else a new one: the id is echoed in headers and JSON bodies, so bytes
        that are not printable ASCII, or more than ``MAX_REQUEST_ID_CHARS``, never are)."""
        given = request.headers.get("x-request-id") or ""
        usable = 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isascii() and given.isprintable()
        return cls(
            request_id=given if usable else uuid.uuid4().hex,
            traceparent=request.headers.get("traceparent"),
            traffic_tag=request.headers.get("x-traffic-tag"),
            endpoint=request.path,
            t_recv=time.monotonic(),
        )

    def extra_fields(self) -> Mapping[str, object]:
        """Fields a model server adds to the line (after the shared ones): its own keys
        (a TypedDict), none here."""
        return {}


async def serve_logged(
    rec: RequestRecord,
    headers: dict[str, str],
    serving: Awaitable[web.StreamResponse],
    *,
    log: JsonLogger,
    version: str,
    model: str,
) -> web.StreamResponse:
    """Await ``serving``; a client mistake (``ApiError``) becomes its JSON answer with
    ``headers``; either way, and on a cancelled request, one ``request_done`` line."""
    try:
        return await serving
    except ApiError as err:
        rec.status = err.status
        rec.error = rec.error or f"http_{err.status}"
        resp = error_response(err)
        resp.headers.update(headers)
        return resp
    except asyncio.CancelledError:
        rec.error = rec.error or "cancelled"
        rec.finish_reason = "abort"
        raise
    finally:
        log.info(
            "request_done",
            request_id=rec.request_id,
            traceparent=rec.traceparent,
            traffic_tag=rec.traffic_tag,
            version=version,
            model=model,
            endpoint=rec.endpoint,
            stream=rec.stream,
            status=rec.status,
            prompt_tokens=rec.prompt_tokens,
            completion_tokens=rec.completion_tokens,
            ttft_s=None if rec.ttft_s is None else round(rec.ttft_s, 6),
            queue_s=None if rec.queue_s is None else round(rec.queue_s, 6),
            e2e_s=round(time.monotonic() - rec.t_recv, 6),
            finish_reason=rec.finish_reason,
            error=rec.error,
            **({"dependency": rec.dependency} if rec.dependency is not None else {}),
            **rec.extra_fields(),
        )


def observe_token(rec: RequestRecord, metrics: ModelMetrics, now: float, last_write: float) -> None:
    """A content event written at ``now``: the request's TTFT when it is the first, else the
    inter-token gap since ``last_write``."""
    if rec.ttft_s is None:
        rec.ttft_s = now - rec.t_recv
        metrics.ttft_s.observe(rec.ttft_s)
    else:
        metrics.itl_s.observe(now - last_write)


async def lookup_context(
    dependency: DependencyClient,
    request: web.Request,
    req: CompletionRequest | ChatCompletionRequest,
    rec: RequestRecord,
    headers: dict[str, str],
) -> str | None:
    """The shared dependency's retrieved context for this request, or None
    (``DependencyClient.lookup``: the context GET and the prompt-prefix SETEX, each a
    ``redis`` hop of the request's colour). ``rec.dependency`` and ``x-dependency`` say
    whether the dependency answered (``ok``) or the answer goes without it (``degraded``)."""
    colour = request.get(COLOUR_KEY)
    hops = request.app[COMPONENT_KEY].hops

    def on_call() -> None:
        if isinstance(colour, Colour):
            hops.record("redis", colour, time.time())

    lookup = await dependency.lookup(first_user_message(req), req.prompt_text(), on_call=on_call)
    rec.dependency = lookup.result
    headers["x-dependency"] = lookup.header
    return lookup.context


def response_headers(version: str, rec: RequestRecord) -> dict[str, str]:
    return {"x-model-version": version, "x-request-id": rec.request_id}


# -- /v1/models -------------------------------------------------------------------------
def models_response(
    name: str, *, created: int, max_model_len: int, version: str, **extra: Any
) -> web.Response:
    """The one-model list, vLLM's shape plus ``version`` (and ``extra``)."""
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "canarystack",
                    "root": name,
                    "parent": None,
                    "max_model_len": max_model_len,
                    "version": version,
                    **extra,
                }
            ],
        },
        headers={"x-model-version": version},
    )
