"""Passing a request to the upstream and its answer back, with the active faults applied.

With no fault acting on a request, the bytes pass untouched: the status, the headers but
the hop-by-hop ones, the body, and a stream relayed chunk by chunk as it comes
(``iter_any()``). Only a request a fault acts on is read (``prompt``) and only its stream
is split into events (``sse``). The order of the faults on one request: ``hang`` (no
upstream while it lasts), ``errors`` (http_500/http_503 answered at once), ``latency``'s
``ttft_ms``, ``errors``' made-up answers (error_body, empty), then the upstream's answer
relayed with ``kernel``'s rewrite, ``latency``'s ``itl_ms`` and ``errors``' truncation.

This module must never change an answer no fault acts on, nor send ``[DONE]`` after a
stream it cut.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gameday.faultproxy import answers
from gameday.faultproxy.drift import KernelEffect
from gameday.faultproxy.errors import UpstreamError
from gameday.faultproxy.kinds import ErrorsParams, HangParams, KernelParams, LatencyParams
from gameday.faultproxy.logs import JsonLog
from gameday.faultproxy.metrics import ProxyMetrics
from gameday.faultproxy.prompt import ROUTES, RequestFacts, read_request
from gameday.faultproxy.registry import Fault, FaultRegistry
from gameday.faultproxy.sse import EventSplitter, event_json, is_done, rewrite

# Headers that belong to one connection, not to the message (RFC 9110 §7.6.1), plus the
# ones aiohttp writes itself for the hop it makes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
# Also written by the proxy's own server for its answer.
_OWN_RESPONSE_HEADERS = frozenset({"date", "server"})
# How often a hang checks that its fault still acts and its client is still there.
HANG_POLL_S = 0.05
SSE_COMMENT = b": fault-proxy hang\n\n"


@dataclass
class ProxyState:
    upstream: URL
    registry: FaultRegistry
    metrics: ProxyMetrics
    log: JsonLog
    session: aiohttp.ClientSession | None = None  # made on the running loop (app.py)


@dataclass
class Plan:
    """The faults acting on one request."""

    hang: Fault | None = None
    errors: str | None = None  # the error_kind drawn for this request
    latency: Fault | None = None
    kernel: Fault | None = None

    def __bool__(self) -> bool:
        return any((self.hang, self.errors, self.latency, self.kernel))


def plan_for(registry: FaultRegistry, facts: RequestFacts) -> Plan:
    plan = Plan()

    def acting(kind: str) -> Fault | None:
        fault = registry.get(kind)
        if fault is None:
            return None
        threshold = getattr(fault.params, "min_prompt_tokens", 0)
        return fault if facts.prompt_tokens >= threshold else None

    plan.hang = acting("hang")
    errors = acting("errors")
    if errors is not None:
        params = errors.params
        assert isinstance(params, ErrorsParams)
        if errors.rng.random() < params.rate:
            plan.errors = params.error_kind
    plan.latency = acting("latency")
    plan.kernel = acting("kernel")
    return plan


def forward_headers(headers: CIMultiDictProxy[str], identity: bool) -> CIMultiDict[str]:
    out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)
    if identity:  # an answer the proxy rewrites must come uncompressed
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(up: aiohttp.ClientResponse) -> CIMultiDict[str]:
    drop = HOP_BY_HOP | _OWN_RESPONSE_HEADERS
    return CIMultiDict((k, v) for k, v in up.headers.items() if k.lower() not in drop)


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def cut(request: web.Request) -> None:
    """Drop the client's connection mid-answer: no terminating chunk, no ``[DONE]``."""
    if request.transport is not None:
        request.transport.abort()


def _streams(up: aiohttp.ClientResponse) -> bool:
    return up.content_type == "text/event-stream" or up.content_length is None


def _plain_encoding(up: aiohttp.ClientResponse) -> bool:
    return up.headers.get("Content-Encoding", "identity").lower() in ("", "identity")


# Answers larger than this are rewritten in a worker thread (Relay._body).
_INLINE_BODY_BYTES = 64 * 1024


def _rewritten(body: bytes, kernel: KernelParams | None, echo_chars: int) -> tuple[Any, bytes]:
    """(the answer parsed, or None when it is not JSON; the body to send): rewritten by
    ``kernel`` when it is a JSON object."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, body
    if isinstance(obj, dict) and kernel is not None:
        KernelEffect(kernel, echo_chars).apply(obj)
        body = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    return obj, body


class Relay:
    """The catch-all handler: every path the proxy does not own goes upstream."""

    def __init__(self, state: ProxyState) -> None:
        self.st = state

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        st = self.st
        raw = await request.read()
        route = ROUTES.get(request.path) if request.method == "POST" else None
        st.metrics.requests.labels(route=route or "other").inc()
        if route is not None and st.registry.any_active():
            facts = read_request(route, raw)
            if facts is not None:
                plan = plan_for(st.registry, facts)
                if plan:
                    return await self._faulted(request, raw, facts, plan)
        up = await self._open(request, raw, identity=False)
        try:
            return await self._send_back(request, up)
        finally:
            up.release()

    # -- the upstream -----------------------------------------------------------------
    async def _open(self, request: web.Request, raw: bytes, identity: bool) -> Any:
        st = self.st
        url = URL(str(st.upstream).rstrip("/") + request.raw_path, encoded=True)
        assert st.session is not None, "the app's cleanup_ctx opens the session"
        try:
            return await st.session.request(
                request.method,
                url,
                headers=forward_headers(request.headers, identity),
                data=raw or None,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            st.metrics.upstream_errors.labels(reason="connect").inc()
            raise UpstreamError(
                f"The upstream {st.upstream} could not be reached for {request.method} "
                f"{request.path} ({type(exc).__name__}: {exc}); check that it runs and that "
                "the proxy's --upstream names it.",
                code="upstream_unreachable",
            ) from None

    def _broken(self, request: web.Request) -> None:
        self.st.metrics.upstream_errors.labels(reason="broken").inc()
        cut(request)

    async def _send_back(
        self, request: web.Request, up: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        """The upstream's answer, untouched: a stream chunk by chunk, a body whole."""
        headers = response_headers(up)
        if not _streams(up):
            try:
                body = await up.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                self.st.metrics.upstream_errors.labels(reason="broken").inc()
                raise UpstreamError(
                    f"The upstream {self.st.upstream} broke off its answer to "
                    f"{request.method} {request.path}; retry.",
                    code="broken_stream",
                ) from None
            return web.Response(body=body, status=up.status, reason=up.reason, headers=headers)
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
        await resp.prepare(request)
        try:
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
        except (aiohttp.ClientError, TimeoutError):
            self._broken(request)  # the client must see a broken stream, not a short one
            return resp
        except ConnectionError:  # the client left
            return resp
        await resp.write_eof()
        return resp

    # -- faults -----------------------------------------------------------------------
    async def _faulted(
        self, request: web.Request, raw: bytes, facts: RequestFacts, plan: Plan
    ) -> web.StreamResponse:
        st = self.st
        if plan.hang is not None:
            st.metrics.faults_applied.labels(kind="hang").inc()
            if facts.stream:
                return await self._hang_stream(request, facts, plan.hang)
            await self._hang_wait(request, plan.hang)
        if plan.errors is not None:
            st.metrics.faults_applied.labels(kind="errors").inc()
            if plan.errors in ("http_500", "http_503"):
                status = 500 if plan.errors == "http_500" else 503
                return web.Response(
                    body=answers.error_body(status), status=status, content_type="application/json"
                )
        if plan.latency is not None:
            st.metrics.faults_applied.labels(kind="latency").inc()
            latency = plan.latency.params
            assert isinstance(latency, LatencyParams)
            if latency.ttft_ms > 0:
                await st.registry.delay(plan.latency, latency.ttft_ms / 1000.0)
        if plan.errors in ("error_body", "empty"):
            return await self._made_up(request, facts, plan.errors)
        if plan.kernel is not None:
            st.metrics.faults_applied.labels(kind="kernel").inc()
        rewrites = plan.kernel is not None
        up = await self._open(request, raw, identity=rewrites)
        try:
            if up.status != 200 or not _plain_encoding(up):
                return await self._send_back(request, up)
            if up.content_type == "text/event-stream":
                return await self._events(request, up, facts, plan)
            return await self._body(request, up, plan, facts.echo_chars)
        finally:
            up.release()

    async def _made_up(
        self, request: web.Request, facts: RequestFacts, kind: str
    ) -> web.StreamResponse:
        if kind == "empty":
            body = answers.empty_answer(facts)
        else:
            body = answers.error_stream() if facts.stream else answers.error_body(200)
        ctype = "text/event-stream" if facts.stream else "application/json"
        return web.Response(body=body, status=200, content_type=ctype)

    async def _hang_wait(self, request: web.Request, fault: Fault) -> None:
        while self.st.registry.is_active(fault) and not client_gone(request):
            await asyncio.sleep(HANG_POLL_S)

    async def _hang_stream(
        self, request: web.Request, facts: RequestFacts, fault: Fault
    ) -> web.StreamResponse:
        params = fault.params
        assert isinstance(params, HangParams)
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        try:
            await resp.write(answers.opening_event(facts))
            beat = time.monotonic() + params.interval_s
            while self.st.registry.is_active(fault) and not client_gone(request):
                wait = HANG_POLL_S
                if params.mode == "trickle":
                    wait = min(wait, max(0.0, beat - time.monotonic()))
                await asyncio.sleep(wait)
                if params.mode == "trickle" and time.monotonic() >= beat:
                    await resp.write(SSE_COMMENT)
                    beat += params.interval_s
        except ConnectionError:
            return resp
        cut(request)  # the fault ended: the stream it held can only break
        return resp

    async def _events(
        self, request: web.Request, up: aiohttp.ClientResponse, facts: RequestFacts, plan: Plan
    ) -> web.StreamResponse:
        """A stream relayed event by event: rewritten by a kernel fault, slowed by a latency
        fault's ``itl_ms``, cut by a truncating errors fault."""
        st = self.st
        effect = None
        if plan.kernel is not None:
            assert isinstance(plan.kernel.params, KernelParams)
            effect = KernelEffect(plan.kernel.params)
        itl_s = 0.0
        if plan.latency is not None:
            assert isinstance(plan.latency.params, LatencyParams)
            itl_s = plan.latency.params.itl_ms / 1000.0
        truncate = plan.errors == "truncate"
        cut_after = max(1, facts.max_tokens // 2)
        token_events = 0
        splitter = EventSplitter()
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=response_headers(up))
        await resp.prepare(request)
        try:
            async for chunk in up.content.iter_any():
                for event in splitter.feed(chunk):
                    obj = event_json(event)
                    if truncate and (is_done(event) or token_events >= cut_after or _last(obj)):
                        cut(request)
                        return resp
                    if effect is not None:
                        event = rewrite(event, effect.apply)
                    tokens = _has_text(obj)
                    if itl_s and tokens and token_events and plan.latency is not None:
                        await st.registry.delay(plan.latency, itl_s)
                    await resp.write(event)
                    token_events += tokens
            rest = splitter.rest()
            if truncate:
                cut(request)
                return resp
            if rest:
                await resp.write(rest)
        except (aiohttp.ClientError, TimeoutError):
            self._broken(request)
            return resp
        except ConnectionError:
            return resp
        await resp.write_eof()
        return resp

    async def _body(
        self, request: web.Request, up: aiohttp.ClientResponse, plan: Plan, echo_chars: int = 0
    ) -> web.StreamResponse:
        """A whole answer: rewritten by a kernel fault, delayed by ``itl_ms`` per token
        after the first, cut half way by a truncating errors fault."""
        st = self.st
        try:
            body = await up.read()
        except (aiohttp.ClientError, OSError, TimeoutError):
            st.metrics.upstream_errors.labels(reason="broken").inc()
            raise UpstreamError(
                f"The upstream {st.upstream} broke off its answer; retry.", code="broken_stream"
            ) from None
        obj: Any = None
        kernel = plan.kernel.params if plan.kernel is not None else None
        assert kernel is None or isinstance(kernel, KernelParams)
        if kernel is not None or plan.latency is not None:
            # A large answer (an echoed prompt's thousands of positions: ~50-90 ms of
            # Python) is parsed and rewritten off the event loop, so the other answers this
            # proxy relays meanwhile (users' canary streams) are not held up behind it: a
            # real kernel fault costs its engine nothing per answer, and this stand-in must
            # not either.
            if len(body) > _INLINE_BODY_BYTES:
                obj, body = await asyncio.to_thread(_rewritten, body, kernel, echo_chars)
            else:
                obj, body = _rewritten(body, kernel, echo_chars)
        if isinstance(obj, dict) and plan.latency is not None:
            assert isinstance(plan.latency.params, LatencyParams)
            usage = obj.get("usage")
            n = usage.get("completion_tokens") if isinstance(usage, dict) else None
            if isinstance(n, int) and n > 1 and plan.latency.params.itl_ms > 0:
                await st.registry.delay(plan.latency, plan.latency.params.itl_ms * (n - 1) / 1e3)
        headers = response_headers(up)
        if plan.errors == "truncate":
            resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            resp.content_length = len(body)
            await resp.prepare(request)
            try:
                await resp.write(body[: len(body) // 2])
            except ConnectionError:
                return resp
            cut(request)
            return resp
        return web.Response(body=body, status=up.status, reason=up.reason, headers=headers)


def _choices(obj: dict[str, Any] | None) -> list[Any]:
    choices = obj.get("choices") if obj is not None else None
    return choices if isinstance(choices, list) else []


def _has_text(obj: dict[str, Any] | None) -> bool:
    for c in _choices(obj):
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else c.get("text")
        if isinstance(text, str) and text:
            return True
    return False


def _last(obj: dict[str, Any] | None) -> bool:
    """Whether an event ends its stream's tokens: a finish_reason, or the usage chunk."""
    if obj is None:
        return False
    choices = _choices(obj)
    if not choices and "usage" in obj:
        return True
    return any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
