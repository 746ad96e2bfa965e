"""Forwarding: send a request to a replica of the chosen pool, and relay its answer.

This module must never buffer a stream, resend a request that was sent, or parse an
unsampled stream's events (but the one that holds ``"error"``, ``error_body``).
"""

from __future__ import annotations

import contextlib
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from canarystack.common.errors import Unavailable
from canarystack.router.collector import Collector
from canarystack.router.error_body import ERROR_BODY, ErrorEvents, is_error_object
from canarystack.router.proxy import HOP_BY_HOP, Upstream
from canarystack.router.routing import PIN_HEADER, Variant
from canarystack.router.state import Attempt, RequestContext, RouterState
from canarystack.router.waits import (
    UPSTREAM_STALL,
    ClientGone,
    ClientStalled,
    RequestWaits,
    UpstreamStalled,
)

# The outcome error of a client that stopped reading: its own doing, never evidence.
CLIENT_STALLED = "client_stalled"


def ident_headers(st: RouterState, ctx: RequestContext) -> dict[str, str]:
    return {
        "x-router-id": st.settings.router_id,
        "x-request-id": ctx.request_id,
        "x-config-revision": str(st.config.current.revision),
    }


async def open_upstream(
    st: RouterState,
    variant: Variant,
    pinned: bool,
    path: str,
    payload: bytes,
    headers: dict[str, str],
    candidates: list[Upstream] | None = None,
    *,
    waits: RequestWaits,
    stream: bool,
    may_fall_back: bool = True,
) -> Attempt:
    """Send the request to a replica of ``variant``'s pool (below: what happens when the
    whole pool refuses).

    ``open_upstream`` tries the pool's replicas in order; a replica that refuses the
    connection is marked down and the next one is tried (nothing was sent yet). When the
    whole pool refused, an unpinned canary request falls back to the baseline, a pinned one
    gets 503 naming the pool, and an unpinned baseline request gets 503 (the router never
    moves all traffic to an unvetted canary on its own).

    The answer's headers are awaited within the request's deadlines (``waits.answer``: a
    stream's first byte, a non-streamed answer's whole request); a replica that stays
    silent past them raises ``UpstreamStalled`` and is never retried (the request was sent).
    """
    session = st.upstream_session
    pool = st.pools[variant]
    for ups in candidates if candidates is not None else pool.candidates():
        waits.sent()
        try:
            resp = await waits.answer(
                session.post(ups.url + path, data=payload, headers=headers), stream
            )
        except aiohttp.ClientConnectorError:
            # Nothing was sent: safe to try the next replica.
            pool.mark_down(ups)
            st.metrics.upstream_errors.labels(variant=variant, kind="connect").inc()
            continue
        pool.mark_up(ups)
        return Attempt(resp, ups, variant, fallback=False)
    if may_fall_back and not pinned and variant == "canary" and len(st.pools["baseline"]):
        st.metrics.fallbacks.inc()
        attempt = await open_upstream(
            st,
            "baseline",
            False,
            path,
            payload,
            headers,
            waits=waits,
            stream=stream,
            may_fall_back=False,
        )
        attempt.fallback = True
        return attempt
    n = len(pool)
    if n == 0:
        raise Unavailable(
            f"No {variant} pool is configured on this router (start it with --{variant} URL).",
            param=PIN_HEADER if pinned else None,
            code="no_pool",
        )
    what = f"All {n} {variant} replica(s) refused the connection"
    hint = (
        f"; the request was pinned with {PIN_HEADER}: {variant}, so it was not sent to the "
        "other variant. Retry shortly or pin the other variant."
        if pinned
        else "; retry shortly."
    )
    raise Unavailable(what + hint, code="pool_down")


def response_headers(
    st: RouterState, ctx: RequestContext, up: aiohttp.ClientResponse, variant: str
) -> CIMultiDict[str]:
    headers = CIMultiDict((k, v) for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP)
    headers.update(ident_headers(st, ctx))
    headers["x-served-by"] = variant
    return headers


async def relay(
    request: web.Request,
    st: RouterState,
    ctx: RequestContext,
    attempt: Attempt,
    collector: Collector | None,
    t_send: float,
    waits: RequestWaits,
) -> web.StreamResponse:
    """The upstream's answer, relayed to the client.

    ``relay`` streams SSE chunk by chunk as it comes (``iter_any()``) and sends a
    non-streaming body on whole; only a request sampled for shadow comparison has its events
    parsed (``shadow.Collector``). A stream that breaks after the headers were sent cannot
    change its status: the client connection is closed without the terminating chunk, so the
    client sees a broken stream, not a short but "complete" one. A 2xx whose body is an
    OpenAI-shaped error (``{"error": ...}`` whole, or a ``data: {"error": ...}`` event in the
    stream) is relayed as it came but counted as an error (``error_body``), never a success.

    Every wait has its deadline (``waits``): an upstream silent past one is cancelled and
    the outcome is ``upstream_stall`` (or ``upstream_deadline``), an error the gate sees; a
    client that stops reading is cut (``client_stalled``) and its upstream released; a
    client that leaves while the upstream has been silent ``stall_evidence_s`` left because
    of the stall (``upstream_stall``), else it is a ``client_abort``.
    """
    up = attempt.resp
    variant = attempt.variant
    headers = response_headers(st, ctx, up, variant)
    status = up.status
    ctx.status = status
    if status >= 500:
        ctx.error = "http_5xx"
        st.metrics.upstream_errors.labels(variant=variant, kind="http_5xx").inc()
    if status != 200:
        collector = None  # nothing to compare in an error body
    is_sse = up.headers.get("content-type", "").startswith("text/event-stream")
    if not is_sse:
        try:
            data = await waits.answer(up.read(), stream=False)
        except UpstreamStalled as stall:
            up.close()
            raise stalled(st, ctx, variant, stall) from None
        except (TimeoutError, aiohttp.ClientError, OSError):
            up.close()
            ctx.error = "broken_stream"
            st.metrics.upstream_errors.labels(variant=variant, kind="broken_stream").inc()
            raise Unavailable(
                f"The {variant} upstream broke off its answer; retry.",
                status=502,
                code="broken_stream",
            ) from None
        now = time.perf_counter()
        ctx.ttft_s = now - ctx.t0
        ctx.upstream_ttft_s = now - t_send
        if 200 <= status < 300 and is_error_object(data):
            _error_body(st, ctx, variant)
        if collector is not None:
            data = collector.feed_body(data)
        up.release()
        return web.Response(body=data, status=status, headers=headers)

    resp = web.StreamResponse(status=status, headers=headers)
    errors = ErrorEvents() if 200 <= status < 300 else None
    prev = last = b""
    try:
        await waits.to_client(resp.prepare(request))
        try:
            while chunk := await waits.chunk(up.content):
                if ctx.ttft_s is None:
                    now = time.perf_counter()
                    ctx.ttft_s = now - ctx.t0
                    ctx.upstream_ttft_s = now - t_send
                prev, last = last, chunk
                if errors is not None:
                    errors.feed(chunk)
                if collector is not None:
                    chunk = collector.feed_chunk(chunk)
                    if not chunk:
                        continue
                await waits.to_client(resp.write(chunk), len(chunk))
            rest = collector.flush() if collector is not None else b""
            if rest:
                await waits.to_client(resp.write(rest), len(rest))
        except UpstreamStalled as stall:
            up.close()
            stalled(st, ctx, variant, stall)
            _break_client(request)
            return resp
        except (TimeoutError, aiohttp.ClientError, OSError):
            up.close()
            ctx.error = "broken_stream"
            st.metrics.upstream_errors.labels(variant=variant, kind="broken_stream").inc()
            _break_client(request)
            return resp
    except ClientGone as gone:
        up.close()
        client_left(st, ctx, variant, gone)
        return resp
    except ClientStalled:
        up.close()  # its engine slot is released now, not when the generation ends
        ctx.error = CLIENT_STALLED
        st.metrics.client_stalls.inc()
        if request.transport is not None:
            request.transport.abort()  # its buffered answer goes too: it reads nothing
        return resp
    up.release()
    if errors is not None and errors.finish():
        _error_body(st, ctx, variant)
    if status == 200 and not (prev[-16:] + last)[-16:].rstrip().endswith(b"[DONE]"):
        # The upstream ended the stream cleanly but without its terminator: truncated
        # (an error event before the end stays the outcome's error: it says more).
        ctx.error = ctx.error or "broken_stream"
        st.metrics.upstream_errors.labels(variant=variant, kind="truncated").inc()
        _break_client(request)
        return resp
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write_eof()
    return resp


def _error_body(st: RouterState, ctx: RequestContext, variant: str) -> None:
    """A 2xx that carried an error: an error outcome, counted, like a 5xx."""
    ctx.error = ERROR_BODY
    st.metrics.upstream_errors.labels(variant=variant, kind=ERROR_BODY).inc()


def stalled(
    st: RouterState, ctx: RequestContext, variant: str, stall: UpstreamStalled
) -> Unavailable:
    """An upstream silent past a deadline: an error outcome (silence is evidence), and the
    504 to answer when no header has gone to the client yet."""
    ctx.error = stall.error
    st.metrics.upstream_errors.labels(variant=variant, kind=stall.error).inc()
    return Unavailable(
        f"The {variant} upstream was silent past the router's {stall.what} deadline "
        f"({stall.limit_s:g} s) and was cancelled; retry.",
        status=504,
        code=stall.error,
    )


def client_left(st: RouterState, ctx: RequestContext, variant: str, gone: ClientGone) -> None:
    """The client hung up: because of a stall when its upstream had been silent at least
    ``stall_evidence_s`` (an error outcome), else a client abort (no evidence)."""
    if gone.silent_s >= st.settings.deadlines.stall_evidence_s:
        ctx.error = UPSTREAM_STALL
        ctx.status = ctx.status or 504
        st.metrics.upstream_errors.labels(variant=variant, kind="client_left_stall").inc()
    else:
        ctx.error = "client_abort"


def _break_client(request: web.Request) -> None:
    """Close the client's connection without the final chunk: the stream reads as broken."""
    transport = request.transport
    if transport is not None:
        transport.close()
