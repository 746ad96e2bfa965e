"""The engine pod: the model-server contract (docs/ARCHITECTURE.md §1) over llama.cpp.

The pod is what the router, the gate and the harness see as a model server: OpenAI
``/v1/completions``, ``/v1/chat/completions`` (streamed or not, with logprobs) and
``/v1/models``, the headers ``x-model-version`` and ``x-request-id``, one
``request_done`` log line per request, vLLM-named metrics, and the ``kernel`` fault. The
tokens come from a real engine: a ``llama_cpp.server`` child on a private port
(``canarystack.engine.child``), to which requests are proxied chunk by chunk.

The kernel fault is a rollout. A reconcile loop compares the KV-cache type the faults ask
for (the newest active ``kernel`` fault's ``cache_type``, else ``f16``) with the serving
child's; on a difference it starts a new child with the asked-for cache, waits until it
answers and has served a warm-up request, switches new requests to it, then lets the old
child finish its in-flight requests (bounded) and stops it by PID — a surge rollout, as a
Deployment does it, so a rollout costs no failed request. When the fault is cleared or
its TTL ends (enforced here, by ``FaultRegistry``), the same loop rolls back to f16. A
rollout takes a few seconds (a Python server start); ``/health`` shows the serving cache
type and any rollout in progress, and ``rollout_started``/``rollout_done`` log lines
carry the times.

Bodies are read as the simulator reads them (``canarystack.model.body``): within
``Limits.for_model_len(n_ctx)`` (a 413 from ``Content-Length`` or as soon as a chunked
body passes it), strict JSON with caps on containers, messages, stop strings and prompt
bytes before validation, parsed in a worker thread when big. Only the fields the
contract validates are forwarded to the engine. The engine's answers are read with
``canarystack.common.strictjson``: one that is not strict JSON (a ``NaN`` or ``Infinity``
logprob) is relayed unchanged, so the router and the oracle count it as a broken canary,
and ``request_done`` says ``error: engine_invalid_json``; it is never taken as sound.

With ``--redis-url`` the pod uses the shared dependency as the simulator does
(``canarystack.dependency``): per request a context lookup and a prompt-prefix cache
write through ``DependencyClient`` (``redis`` hops of the request's colour), the context
put in front of the prompt when it fits, ``x-dependency: ok|degraded`` on the answer and
a ``dependency`` field in ``/health``; a slow, full or dead Redis degrades the answer,
never fails it.

Decided: requests are never held while no child serves (at start-up, or after the
child died — it is restarted at once): they get a 503 ``engine_unavailable`` that says
so, like a pod that is not ready. Client mistakes are checked here before anything
reaches the engine (``canarystack.model.schemas``: a 400 naming the field; the engine
itself answers 500 to some bad input), including the context length, counted with the
engine's own tokenizer. Streams get the ``usage`` chunk when ``stream_options.
include_usage`` asks for it (llama.cpp's server does not send one): prompt tokens counted
here, completion tokens = the content events relayed.

``request_done`` carries the same fields as the simulator's, plus ``kv_cache_type`` and
``engine_pid``; ``ttft_s`` is the pod's time from receiving the request to writing the
first content event (null for non-streamed answers: the engine does not say when its
first token was ready).

This module must never forward a request it has not validated, never hold a request
while no engine serves, and never kill a process it did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from canary_contract.json import JsonObject
from canarystack.common import strictjson
from canarystack.common.app import COMPONENT, Component
from canarystack.common.colour import COLOUR_KEY, Colour
from canarystack.common.errors import BadRequest, Unavailable, json_response
from canarystack.common.logs import get_logger
from canarystack.dependency.client import DependencyClient, DependencyConfig
from canarystack.engine.child import EngineChild, EngineSettings, log_tail
from canarystack.engine.faults import HEALTHY_CACHE, EngineKernelParams
from canarystack.model.api_spec import install as install_api_spec
from canarystack.model.body import Limits, Parsed, read_request
from canarystack.model.contract import (
    RequestRecord,
    check_model_name,
    models_response,
    resolve_max_tokens,
    response_headers,
    serve_logged,
)
from canarystack.model.metrics import ModelMetrics
from canarystack.model.schemas import (
    CompletionRequest,
    first_user_message,
)

RECONCILE_S = 0.1
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_DRAIN_TIMEOUT_S = 60.0
DEFAULT_RETRY_S = 2.0
UPSTREAM_READ_TIMEOUT_S = 300.0
_SEPARATORS = (b"\r\n\r\n", b"\n\n")
# How much of an engine's error body a log line carries.
LOG_BODY_CHARS = 500
# What request_done says of an engine answer that is not strict JSON (a NaN or Infinity
# logprob, broken bytes): relayed as the engine wrote it, so the router and the oracle
# see it and count it as a broken canary; never re-written as if it were sound.
ENGINE_INVALID_JSON = "engine_invalid_json"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (C code writes there, below Python's logging)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class PromptCounter:
    """Counts prompt tokens with the engine's own tokenizer (a vocab-only llama.cpp load),
    the way llama_cpp.server tokenizes completions (BOS, special tokens parsed) and chat
    (the llama-2 template the child is started with)."""

    def __init__(self, model_path: Path) -> None:
        from llama_cpp import Llama

        with _quiet_stderr():  # llama.cpp prints a context warning even with verbose=False
            self._llama = Llama(str(model_path), vocab_only=True, verbose=False)

    def completion(self, prompt: str) -> int:
        if prompt == "":
            return 1  # the engine evaluates the BOS token alone
        return len(self._llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))

    def chat(self, messages: list[dict[str, str]]) -> int:
        from llama_cpp.llama_chat_format import format_llama2

        formatted = format_llama2(messages=messages)
        return len(
            self._llama.tokenize(
                formatted.prompt.encode("utf-8"),
                add_bos=not formatted.added_special,
                special=True,
            )
        )


@dataclass
class _Record(RequestRecord):
    """The shared request_done record plus the engine that served the request."""

    kv_cache_type: str | None = None
    engine_pid: int | None = None

    def extra_fields(self) -> JsonObject:
        return {"kv_cache_type": self.kv_cache_type, "engine_pid": self.engine_pid}


class _ClientGone(Exception):
    pass


@dataclass
class _StreamState:
    chat: bool
    include_usage: bool
    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    first_id: str | None = None
    created: int | None = None
    model: str | None = None
    invalid: str | None = None  # why an event was not strict JSON (the first one)


class EnginePod:
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
    ) -> None:
        self.settings = settings
        self.version = version
        self.component = component
        self.log = component.log or get_logger(component.name)
        self.default_max_tokens = default_max_tokens
        self.start_timeout_s = start_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.retry_s = retry_s
        self.active: EngineChild | None = None
        self.rolling_to: str | None = None
        self.retiring: set[EngineChild] = set()
        self.rollouts = 0
        self.last_error: str | None = None
        self._retry_at = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.counter = PromptCounter(settings.model_path)
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
        loop_task = asyncio.create_task(self._reconcile_forever())
        yield
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop_task
        for task in list(self._tasks):
            task.cancel()
        children = [c for c in (self.active, *self.retiring) if c is not None]
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        for c in children:
            self.log.info("engine_stopped", engine_pid=c.pid, kv_cache_type=c.cache_type)
        await self._session.close()
        if self.dependency is not None:
            await self.dependency.close()

    def health_extra(self) -> JsonObject:
        active = self.active
        extra: JsonObject = {
            "model": self.settings.served_model_name,
            "engine": "llama.cpp",
            "kv_cache_type": active.cache_type if active else None,
            "desired_kv_cache_type": self.desired_cache_type(),
            "rolling_out_to": self.rolling_to,
            "rollouts": self.rollouts,
            "engine_pid": active.pid if active else None,
            "inflight": self.inflight,
            "last_error": self.last_error,
        }
        # The pod serves without its dependency: /health says how it is (a degraded
        # dependency is shared, not this pod's failure), as the simulator's does.
        if self.dependency is not None:
            extra["dependency"] = self.dependency.health()
        if active is None:
            extra["status"] = "starting"
        return extra

    # -- the reconcile loop ---------------------------------------------------------
    def desired_cache_type(self) -> str:
        params = self.component.faults.get("kernel")
        if isinstance(params, EngineKernelParams):
            return params.cache_type
        return HEALTHY_CACHE

    async def _reconcile_forever(self) -> None:
        while True:
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must outlive any one failure
                self.log.error("reconcile_error", exc_info=True, error=str(exc))
            await asyncio.sleep(RECONCILE_S)

    async def reconcile_once(self) -> None:
        active = self.active
        if active is not None and not active.alive():
            self.log.error(
                "engine_exited",
                engine_pid=active.pid,
                exit_code=active.exit_code(),
                kv_cache_type=active.cache_type,
                log_tail=log_tail(self.settings.log_path),
            )
            self.active = None
            await active.stop()
        desired = self.desired_cache_type()
        if self.active is not None and self.active.cache_type == desired:
            return
        if time.monotonic() < self._retry_at:
            return
        await self._rollout(desired)

    async def _rollout(self, cache_type: str) -> None:
        assert self._session is not None
        old = self.active
        t0 = time.monotonic()
        fault = self.component.faults.active("kernel")
        self.rolling_to = cache_type
        self.log.info(
            "rollout_started",
            from_kv_cache_type=old.cache_type if old else None,
            to_kv_cache_type=cache_type,
            fault_id=fault[-1].id if fault else None,
        )
        new = EngineChild(self.settings, cache_type)
        try:
            new.start()
            await new.wait_ready(self._session, self.start_timeout_s)
            await new.warm_up(self._session)
        except Exception as exc:
            self.last_error = f"starting llama_cpp.server ({cache_type} KV cache) failed: {exc}"
            self.log.error(
                "rollout_failed",
                to_kv_cache_type=cache_type,
                error=str(exc),
                retry_in_s=self.retry_s,
                log_tail=log_tail(self.settings.log_path),
            )
            await new.stop()
            self._retry_at = time.monotonic() + self.retry_s
            return
        finally:
            self.rolling_to = None
        self.active = new
        self.rollouts += 1
        self.last_error = None
        self.log.info(
            "rollout_done",
            from_kv_cache_type=old.cache_type if old else None,
            to_kv_cache_type=cache_type,
            engine_pid=new.pid,
            engine_port=new.port,
            rollout_s=round(time.monotonic() - t0, 3),
        )
        if old is not None:
            self.retiring.add(old)
            task = asyncio.create_task(self._drain_and_stop(old))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain_and_stop(self, child: EngineChild) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while child.inflight > 0 and child.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = child.inflight
        await child.stop()
        self.retiring.discard(child)
        self.log.info(
            "engine_retired",
            engine_pid=child.pid,
            kv_cache_type=child.cache_type,
            cut_requests=left,
        )

    # -- HTTP -----------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return models_response(
            self.settings.served_model_name,
            created=self.created,
            max_model_len=self.settings.n_ctx,
            version=self.version,
            engine="llama.cpp",
        )

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

    def _upstream_body(
        self, parsed: Parsed, chat: bool, rec: _Record
    ) -> tuple[JsonObject, bool, bool]:
        """Count and build what the engine gets from a validated request: (body, stream,
        include_usage). Only the fields the contract validates are forwarded; unknown
        fields are dropped here, never passed to the engine unchecked."""
        req = parsed.req
        messages: list[dict[str, str]] = []
        if isinstance(req, CompletionRequest):
            prompt = req.prompt_text()
            if not prompt.strip():
                raise BadRequest(
                    "'prompt' is empty: send at least one token of text.", param="prompt"
                )
            rec.prompt_tokens = self.counter.completion(prompt)
        else:
            messages = [{"role": m.role, "content": str(m.content)} for m in req.messages]
            rec.prompt_tokens = self.counter.chat(messages)
        field = parsed.prompt_field
        rec.stream = req.stream
        served = self.settings.served_model_name
        check_model_name(req.model, served)
        max_tokens = resolve_max_tokens(
            parsed.max_tokens,
            rec.prompt_tokens,
            max_len=self.settings.n_ctx,
            default_max_tokens=self.default_max_tokens,
            prompt_field=field,
        )
        dropped = {"stream_options", "max_completion_tokens"}
        out = req.model_dump(mode="json", exclude_unset=True, exclude=dropped)
        out["model"] = served
        out["max_tokens"] = max_tokens
        if chat:
            out["messages"] = messages
        else:
            out["prompt"] = prompt
        return out, req.stream, req.include_usage

    async def _serve(
        self, request: web.Request, chat: bool, rec: _Record, headers: dict[str, str]
    ) -> web.StreamResponse:
        kind = "chat" if chat else "completion"
        parsed = await read_request(request, kind, self.limits)
        upstream, stream, include_usage = self._upstream_body(parsed, chat, rec)
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
                    state = _StreamState(chat, include_usage, rec.prompt_tokens)
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
        child = self.active
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
        upstream: JsonObject,
        rec: _Record,
        headers: dict[str, str],
    ) -> None:
        """Look the request up in the shared dependency (``DependencyClient.lookup``: the
        context GET and the prompt-prefix SETEX, each a ``redis`` hop of the request's
        colour) and put the retrieved context in front of what the engine gets: the
        system message of a chat (before its own system text, if any), a line before a
        completion's prompt. A context that would not fit ``n_ctx`` with the answer is
        left out. ``x-dependency`` says whether the dependency answered (``ok``) or the
        answer goes without it (``degraded``)."""
        assert self.dependency is not None
        colour = request.get(COLOUR_KEY)
        hops = request.app[COMPONENT].hops

        def on_call() -> None:
            if isinstance(colour, Colour):
                hops.record("redis", colour, time.time())

        req = parsed.req
        lookup = await self.dependency.lookup(
            first_user_message(req), req.prompt_text(), on_call=on_call
        )
        rec.dependency = lookup.result
        headers["x-dependency"] = lookup.header
        if lookup.context is None:
            return
        if isinstance(req, CompletionRequest):
            prompt = f"{lookup.context}\n{upstream['prompt']}"
            tokens = self.counter.completion(prompt)
            changed: JsonObject = {"prompt": prompt}
        else:
            messages: list[dict[str, str]] = list(upstream["messages"])
            if messages and messages[0]["role"] == "system":
                # llama-2's template keeps one system text: the context joins it.
                first = messages[0]
                messages[0] = {**first, "content": f"{lookup.context}\n{first['content']}"}
            else:
                messages.insert(0, {"role": "system", "content": lookup.context})
            tokens = self.counter.chat(messages)
            changed = {"messages": messages}
        if tokens + int(upstream["max_tokens"]) > self.settings.n_ctx:
            return
        upstream.update(changed)
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
        try:
            body: Any = strictjson.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {
                "error": {
                    "message": f"The llama.cpp engine answered HTTP {up.status} with a body "
                    "that is not a JSON object; see this pod's engine_error log line.",
                    "type": "engine_error",
                    "param": None,
                    "code": f"engine_http_{up.status}",
                }
            }
        return json_response(body, status=up.status, headers=headers)

    async def _relay_body(
        self, up: aiohttp.ClientResponse, rec: _Record, headers: dict[str, str]
    ) -> web.Response:
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
        state: _StreamState,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        buf = b""
        last_write = 0.0
        try:
            async for chunk in up.content.iter_any():
                buf += chunk
                out = b""
                content = False
                while True:
                    cut = min(
                        ((i, sep) for sep in _SEPARATORS if (i := buf.find(sep)) >= 0),
                        default=None,
                    )
                    if cut is None:
                        break
                    i, sep = cut
                    event, buf = buf[:i], buf[i + len(sep) :]
                    data, has_content = self._event(event, state)
                    out += data + (sep if data else b"")
                    content = content or has_content
                if not out:
                    continue
                try:
                    await resp.write(out)
                except (ConnectionError, RuntimeError) as exc:
                    raise _ClientGone(str(exc)) from None
                now = time.monotonic()
                if content:
                    if rec.ttft_s is None:
                        rec.ttft_s = now - rec.t_recv
                        self.metrics.ttft_s.observe(rec.ttft_s)
                    else:
                        self.metrics.itl_s.observe(now - last_write)
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

    @staticmethod
    def _event(event: bytes, state: _StreamState) -> tuple[bytes, bool]:
        """One SSE event from the engine -> (bytes to send, whether it carries a token)."""
        payload = None
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                payload = line[5:].strip()
        if payload is None:
            return event, False
        if payload == b"[DONE]":
            state.done = True
            if not state.include_usage:
                return event, False
            usage: JsonObject = {
                "id": state.first_id,
                "object": "chat.completion.chunk" if state.chat else "text_completion",
                "created": state.created,
                "model": state.model,
                "choices": [],
                "usage": {
                    "prompt_tokens": state.prompt_tokens,
                    "completion_tokens": state.completion_tokens,
                    "total_tokens": state.prompt_tokens + state.completion_tokens,
                },
            }
            return b"data: " + strictjson.dumps_bytes(usage) + b"\n\n" + event, False
        try:
            obj = strictjson.loads(payload)
        except ValueError as exc:  # StrictJsonError: relayed as is, and recorded
            if state.invalid is None:
                state.invalid = str(exc)
            try:  # read leniently only to count the token it may carry
                obj = json.loads(payload)
            except ValueError:
                return event, False
        if not isinstance(obj, dict):
            return event, False
        if state.first_id is None:
            state.first_id, state.created, state.model = (
                obj.get("id"),
                obj.get("created"),
                obj.get("model"),
            )
        has_token = False
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if state.chat:
                delta = choice.get("delta") or {}
                has_token = has_token or bool(delta.get("content"))
            else:
                has_token = has_token or bool(choice.get("text") or choice.get("logprobs"))
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]
        if has_token:
            state.completion_tokens += 1
        return event, has_token

    def _finish(self, rec: _Record) -> None:
        self.metrics.e2e_s.observe(time.monotonic() - rec.t_recv)
        self.metrics.generation_tokens.inc(rec.completion_tokens)
        reason = rec.finish_reason if rec.finish_reason in ("stop", "length") else "abort"
        self.metrics.success[reason].inc()
