"""The engine pod: the model-server contract (docs/ARCHITECTURE.md §1) over llama.cpp, its
tokens from a ``llama_cpp.server`` child (``canarystack.engine.child``) on a private port,
to which requests are proxied chunk by chunk; the ``kernel`` fault is a rollout of the
child's KV-cache type (``canarystack.engine.rollout``).

This module must never forward a request it has not validated, never hold a request
while no engine serves, and never kill a process it did not start.
"""

# Over 400 lines because it is one idea, the HTTP front of one llama.cpp child (validate,
# proxy, relay, record); rollouts, answer events and upstream bodies live beside it.

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import aiohttp
from aiohttp import web

from canary_contract import strictjson
from canarystack.common.app import Component
from canarystack.common.error_fields import CanaryStackError
from canarystack.common.errors import Unavailable, json_response
from canarystack.common.logs import get_logger
from canarystack.dependency.client import DependencyClient, DependencyConfig, DependencyHealth
from canarystack.engine.child import EngineChild, EngineSettings
from canarystack.engine.events import (
    ENGINE_INVALID_JSON,
    StreamState,
    engine_error_body,
    take_events,
    translate_event,
)
from canarystack.engine.faults import kernel_modes
from canarystack.engine.rollout import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_RETRY_S,
    DEFAULT_START_TIMEOUT_S,
    Rollouts,
)
from canarystack.engine.tokens import PromptCounter, TokenCounter
from canarystack.engine.upstream import add_context, upstream_body
from canarystack.engine.vllm import VllmPromptCounter
from canarystack.model.api_spec import install as install_api_spec
from canarystack.model.body import Limits, Parsed, read_request
from canarystack.model.contract import (
    RequestRecord,
    lookup_context,
    models_response,
    observe_token,
    response_headers,
    serve_logged,
)
from canarystack.model.metrics import ModelMetrics

UPSTREAM_READ_TIMEOUT_S = 300.0
# How much of an engine's error body a log line carries.
LOG_BODY_CHARS = 500
# Importable from here as before the split (tests/test_engine.py).
_StreamState = StreamState


class EngineFields(TypedDict):
    """What an engine pod adds to a ``request_done`` line."""

    kv_cache_type: str | None
    engine_pid: int | None


class EngineHealth(TypedDict):
    """The engine pod's fields of ``/health``: ``dependency`` only with ``--redis-url``,
    ``status`` only while no engine serves."""

    model: str
    engine: str
    fault_kinds: list[str]
    kernel_modes: list[str]
    build_kernel_fault: str | None
    kv_cache_type: str | None
    serving_s: float | None
    standby: list[str]
    desired_kv_cache_type: str
    rolling_out_to: str | None
    rollouts: int
    engine_pid: int | None
    inflight: int
    last_error: str | None
    dependency: NotRequired[DependencyHealth]
    standby_pending: NotRequired[list[str]]
    status: NotRequired[str]


@dataclass
class _Record(RequestRecord):
    """The shared request_done record plus the engine that served the request
    (``kv_cache_type``, ``engine_pid``). ``ttft_s`` is the pod's time from receiving the
    request to writing the first content event (null for non-streamed answers: the engine
    does not say when its first token was ready)."""

    kv_cache_type: str | None = None
    engine_pid: int | None = None

    def extra_fields(self) -> EngineFields:
        return {"kv_cache_type": self.kv_cache_type, "engine_pid": self.engine_pid}


class _ClientGone(CanaryStackError):
    pass


class EnginePod:
    """What the router, the gate and the harness see as a model server: OpenAI
    ``/v1/completions``, ``/v1/chat/completions`` (streamed or not, with logprobs) and
    ``/v1/models``, the headers ``x-model-version``, ``x-request-id`` and
    ``x-engine-kv-cache``, one ``request_done`` log line per request, vLLM-named metrics;
    ``/health`` shows the serving cache type and any rollout in progress.

    Bodies are read as the simulator reads them (``canarystack.model.body``: within
    ``Limits.for_model_len(n_ctx)``, strict JSON with caps, parsed in a worker thread when
    big). Client mistakes are checked here before anything reaches the engine (a 400
    naming the field; the engine itself answers 500 to some bad input), the context
    length counted with the engine's own tokenizer. Requests are never held while no
    child serves (at start-up, or after the child died and is restarted): they get a 503
    ``engine_unavailable``, like a pod that is not ready. Streams get the ``usage`` chunk
    when ``stream_options.include_usage`` asks for it (``canarystack.engine.events``).

    With ``--redis-url`` the pod uses the shared dependency as the simulator does
    (``_with_context``, and a ``dependency`` field in ``/health``); a slow, full or dead
    Redis degrades the answer, never fails it.
    """

    def __init__(
        self,
        settings: EngineSettings,
        version: str,
        component: Component,
        *,
        default_max_tokens: int = 16,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        retry_s: float = DEFAULT_RETRY_S,
        dependency: DependencyConfig | None = None,
        standby: tuple[str, ...] = (),
        build_kernel_fault: str | None = None,
    ) -> None:
        self.settings = settings
        # --kernel-fault as given (its variant is settings.build): /health says it.
        self.build_kernel_fault = build_kernel_fault
        self.version = version
        self.component = component
        self.log = component.log or get_logger(component.name)
        self.default_max_tokens = default_max_tokens
        self.children = Rollouts(
            settings,
            component.faults,
            self.log,
            start_timeout_s=start_timeout_s,
            drain_timeout_s=drain_timeout_s,
            retry_s=retry_s,
            standby=standby,
        )
        self._session: aiohttp.ClientSession | None = None
        self.counter: TokenCounter = (
            VllmPromptCounter(settings.model_path)
            if settings.kind == "vllm"
            else PromptCounter(settings.model_path)
        )
        self.created = int(time.time())
        self.inflight = 0
        self.metrics = ModelMetrics(
            component.registry,
            settings.served_model_name,
            running=lambda: float(min(self.inflight, 1)),
            # llama_cpp.server generates one request at a time; the rest wait for it.
            waiting=lambda: float(max(self.inflight - 1, 0)),
        )
        # --redis-url and its options: the shared dependency, as the simulator uses it;
        # None serves without one (no lookups, no x-dependency header).
        self.dependency = (
            DependencyClient(dependency, component.registry) if dependency is not None else None
        )

    # -- wiring ---------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        install_api_spec(app, max_model_len=self.settings.n_ctx)
        app.cleanup_ctx.append(self._lifecycle)

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        loop_task = asyncio.create_task(self.children.run(self._session))
        yield
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop_task
        await self.children.stop_all()
        await self._session.close()
        if self.dependency is not None:
            await self.dependency.close()

    def health_extra(self) -> EngineHealth:
        children = self.children
        active = children.active
        since = children.serving_since_mono
        extra: EngineHealth = {
            "model": self.settings.served_model_name,
            "engine": self._engine(),
            "fault_kinds": sorted(self.component.faults.kinds),
            "kernel_modes": kernel_modes(self.settings.kind),
            "build_kernel_fault": self.build_kernel_fault,
            "kv_cache_type": active.cache_type if active else None,
            # Seconds since its first engine could take a request (a new pod's bad build:
            # the harness times the fault from then, not from this wrapper's start).
            "serving_s": None if since is None else round(time.monotonic() - since, 3),
            "standby": sorted(children.warm),
            "desired_kv_cache_type": children.desired_cache_type(),
            "rolling_out_to": children.rolling_to,
            "rollouts": children.rollouts,
            "engine_pid": active.pid if active else None,
            "inflight": self.inflight,
            "last_error": children.last_error,
        }
        # The pod serves without its dependency: /health says how it is (a degraded
        # dependency is shared, not this pod's failure), as the simulator's does.
        if self.dependency is not None:
            extra["dependency"] = self.dependency.health()
        pending = children.standby_pending()
        if pending:  # not ready until its standby builds are warm (Rollouts)
            extra["standby_pending"] = pending
        if active is None or pending:
            extra["status"] = "starting"
        return extra

    # -- HTTP -----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return models_response(
            self.settings.served_model_name,
            created=self.created,
            max_model_len=self.settings.n_ctx,
            version=self.version,
            engine=self._engine(),
        )

    def _engine(self) -> str:
        return "vllm" if self.settings.kind == "vllm" else "llama.cpp"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        rec = _Record.start(request)
        headers = response_headers(self.version, rec)
        self.inflight += 1
        try:
            return await serve_logged(
                rec,
                headers,
                self._serve(request, chat, rec, headers),
                log=self.log,
                version=self.version,
                model=self.settings.served_model_name,
            )
        finally:
            self.inflight -= 1

    @property
    def limits(self) -> Limits:
        """Body and prompt limits from the engine's context length (as the simulator's)."""
        return Limits.for_model_len(self.settings.n_ctx)

    async def _serve(
        self, request: web.Request, chat: bool, rec: _Record, headers: dict[str, str]
    ) -> web.StreamResponse:
        kind = "chat" if chat else "completion"
        parsed = await read_request(request, kind, self.limits)
        upstream, stream, include_usage = upstream_body(
            parsed,
            chat,
            rec,
            self.counter,
            served=self.settings.served_model_name,
            n_ctx=self.settings.n_ctx,
            default_max_tokens=self.default_max_tokens,
        )
        if self.settings.kind == "vllm":
            # The generated model's weights are random, so its end-of-sequence token means
            # nothing; drawn first (about 1 request in 160 here), vLLM answers with no
            # content, which the load generator rightly counts as an error. At least one
            # token (vLLM's min_tokens); later, EOS still ends an answer as it would.
            upstream.setdefault("min_tokens", 1)
        child = self._serving_child(rec)
        if self.dependency is not None:
            # Bounded by the dependency's deadline; a rollout may switch children meanwhile.
            await self._with_context(request, parsed, upstream, rec, headers)
            child = self._serving_child(rec)
        assert self._session is not None
        rec.kv_cache_type = child.cache_type
        rec.engine_pid = child.pid
        headers["x-engine-kv-cache"] = child.cache_type
        self.metrics.prompt_tokens.inc(rec.prompt_tokens)
        child.inflight += 1
        try:
            async with self._session.post(
                child.url + request.path,
                data=strictjson.dumps_bytes(upstream),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=None, sock_read=UPSTREAM_READ_TIMEOUT_S),
            ) as up:
                if up.status != 200:
                    return await self._engine_error(up, rec, headers)
                if stream:
                    state = StreamState(chat, include_usage, rec.prompt_tokens)
                    return await self._relay_stream(request, up, rec, headers, state)
                return await self._relay_body(up, rec, headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Only failures before anything was sent get here (the stream relay handles
            # its own): the engine is not answering.
            rec.error = "engine_unavailable"
            raise Unavailable(
                f"The llama.cpp engine did not answer ({type(exc).__name__}: {exc}); it may "
                "be restarting. Retry in a few seconds.",
                code="engine_unavailable",
            ) from None
        finally:
            child.inflight -= 1
            self._finish(rec)

    def _serving_child(self, rec: _Record) -> EngineChild:
        """The child that serves now, or the 503 of a pod that is not ready."""
        child = self.children.active
        if child is None or self._session is None:
            rec.error = "engine_unavailable"
            raise Unavailable(
                "The llama.cpp engine of this model server is not serving right now (it is "
                "starting, or restarting after it exited); retry in a few seconds.",
                code="engine_unavailable",
            )
        return child

    async def _with_context(
        self,
        request: web.Request,
        parsed: Parsed,
        upstream: dict[str, object],
        rec: _Record,
        headers: dict[str, str],
    ) -> None:
        """The shared dependency's context for this request (``lookup_context``) put in
        front of what the engine gets (``add_context``), unless it would not fit ``n_ctx``
        with the answer."""
        assert self.dependency is not None
        req = parsed.req
        context = await lookup_context(self.dependency, request, req, rec, headers)
        if context is None:
            return
        tokens = add_context(upstream, req, context, self.counter, self.settings.n_ctx)
        if tokens is not None:
            rec.prompt_tokens = tokens

    async def _engine_error(
        self, up: aiohttp.ClientResponse, rec: _Record, headers: dict[str, str]
    ) -> web.Response:
        raw = await up.read()
        rec.status = up.status
        rec.error = f"engine_http_{up.status}"
        self.log.warning(
            "engine_error",
            request_id=rec.request_id,
            status=up.status,
            body=raw[:LOG_BODY_CHARS].decode("utf-8", errors="replace"),
        )
        body = engine_error_body(up.status, raw)
        return json_response(body, status=up.status, headers=headers)

    async def _relay_body(
        self, up: aiohttp.ClientResponse, rec: _Record, headers: dict[str, str]
    ) -> web.Response:
        """The engine's answer, read with ``strictjson``: one that is not strict JSON (a
        ``NaN`` or ``Infinity`` logprob) is relayed unchanged, so the router and the oracle
        count it as a broken canary, and ``request_done`` says ``engine_invalid_json``."""
        raw = await up.read()
        try:
            obj = strictjson.loads(raw)
        except ValueError as exc:  # StrictJsonError: NaN/Infinity, bad UTF-8, ...
            # Relayed unchanged, so the readers downstream see the broken answer.
            rec.error = ENGINE_INVALID_JSON
            self.log.warning(
                "engine_answer_invalid",
                request_id=rec.request_id,
                error=str(exc),
                body=raw[:LOG_BODY_CHARS].decode("utf-8", errors="replace"),
            )
            return web.Response(body=raw, content_type="application/json", headers=headers)
        with contextlib.suppress(ValueError, TypeError, KeyError, IndexError, AttributeError):
            usage = obj.get("usage") or {}
            rec.completion_tokens = int(usage.get("completion_tokens") or 0)
            rec.finish_reason = obj["choices"][0].get("finish_reason")
        return json_response(obj, headers=headers)

    async def _relay_stream(
        self,
        request: web.Request,
        up: aiohttp.ClientResponse,
        rec: _Record,
        headers: dict[str, str],
        state: StreamState,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        buf = b""
        last_write = 0.0
        try:
            async for chunk in up.content.iter_any():
                out, content, buf = take_events(buf + chunk, state)
                if not out:
                    continue
                try:
                    await resp.write(out)
                except (ConnectionError, RuntimeError) as exc:
                    raise _ClientGone(str(exc)) from None
                now = time.monotonic()
                if content:
                    observe_token(rec, self.metrics, now, last_write)
                    last_write = now
        except _ClientGone:
            rec.error = "client_disconnected"
            rec.finish_reason = "abort"
        except (aiohttp.ClientError, TimeoutError) as exc:
            rec.error = "engine_broken_stream"
            rec.finish_reason = "abort"
            self.log.warning("engine_stream_broken", request_id=rec.request_id, error=str(exc))
        else:
            if not state.done:
                rec.error = "engine_broken_stream"
                rec.finish_reason = "abort"
            else:
                rec.finish_reason = state.finish_reason
        if state.invalid is not None:
            rec.error = rec.error or ENGINE_INVALID_JSON
            self.log.warning(
                "engine_answer_invalid", request_id=rec.request_id, error=state.invalid
            )
        rec.completion_tokens = state.completion_tokens
        return resp

    # One SSE event from the engine -> (bytes to send, whether it carries a token).
    _event = staticmethod(translate_event)

    def _finish(self, rec: _Record) -> None:
        self.metrics.e2e_s.observe(time.monotonic() - rec.t_recv)
        self.metrics.generation_tokens.inc(rec.completion_tokens)
        reason = rec.finish_reason if rec.finish_reason in ("stop", "length") else "abort"
        self.metrics.success[reason].inc()
