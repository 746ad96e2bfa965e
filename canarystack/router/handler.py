"""The request path of ``/v1/completions`` and ``/v1/chat/completions``, step by step.

This module must never let shadow work, the gate or the broker delay or fail a user's
request, send a pinned request to a canary that is off, or answer a client's input with
a 5xx.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from canarystack.common.app import Component
from canarystack.common.colour import COLOUR_KEY, Colour, colour_of
from canarystack.common.errors import ApiError, Unavailable, error_response
from canarystack.router.forward import (
    CLIENT_STALLED,
    client_left,
    ident_headers,
    open_upstream,
    relay,
    stalled,
)
from canarystack.router.intake import bad_header, read_json_body, refuse_off_canary
from canarystack.router.proxy import Upstream
from canarystack.router.records import coloured
from canarystack.router.routing import (
    PIN_HEADER,
    USER_HEADER,
    Variant,
    choose_variant,
    parse_pin,
)
from canarystack.router.samples import outcome_record
from canarystack.router.settings import DEPENDENCY_DEGRADED, AbortFault, LatencyFault
from canarystack.router.shadow import DEPENDENCY_HEADER
from canarystack.router.shadow_session import ShadowSession
from canarystack.router.snapshot import Snapshot
from canarystack.router.state import STATE, RequestContext, RouterState
from canarystack.router.streams import TooManyStreams, client_key
from canarystack.router.waits import ClientGone, RequestWaits, UpstreamStalled

# Client headers forwarded upstream as they came (the colour's three are the router's own).
FORWARDED_HEADERS = ("authorization", "tracestate")


def request_colour(request: web.Request, comp: Component) -> Colour:
    """The request's colour: the one the colouring middleware (``common/colour_http.py``) put on
    the request, which also records the router's hop; else parsed here, and the hop is
    recorded here."""
    colour = request.get(COLOUR_KEY)
    if isinstance(colour, Colour):
        return colour
    colour = colour_of(request.headers)
    comp.hops.record("router", colour, time.time())
    return colour


def _logged_traceparent(colour: Colour) -> str:
    """The traceparent the client sent (when valid), else this hop's: what the log shows."""
    if colour.parent_span_id is None:
        return colour.traceparent
    return f"00-{colour.trace_id}-{colour.parent_span_id}-{colour.flags}"


async def handle_proxy(request: web.Request) -> web.StreamResponse:
    """One proxied request, step by step:

    1. faults (``latency`` sleeps, ``abort`` answers 503): a dict lookup when none is active;
    2. the body is read and parsed once (``intake``: prompt length, bucket, ``stream``); the
       variant is chosen (``routing``); a sampled request gets its ``ShadowSession``;
    3. the request goes to a replica of the variant's pool (``forward.open_upstream``), with
       the request's colour (``x-request-id``, ``traceparent``, ``x-traffic-tag``);
    4. the answer is relayed chunk by chunk (``forward.relay``);
    5. one JSON log line, metrics, and an outcome record for the gate (``_finish``).

    Each request holds a place under the per-client and per-pool caps (``streams``) until
    it ends, and every wait on the upstream or the client has a deadline (``waits``).
    """
    st = request.app[STATE]
    t0 = time.perf_counter()
    colour = request_colour(request, st.comp)
    ctx = RequestContext(colour=colour, traceparent=_logged_traceparent(colour), t0=t0)
    try:
        refusal = bad_header(request.headers)
        if refusal is not None:
            raise refusal
        return await _proxy(request, st, ctx)
    except TooManyStreams as err:
        st.metrics.streams_refused.labels(cap=err.code or "").inc()
        ctx.status = err.status
        ctx.error = err.code
        resp = error_response(err)
        resp.headers.update(ident_headers(st, ctx))
        return resp
    except ApiError as err:
        ctx.status = err.status
        ctx.error = ctx.error or err.code or "rejected"
        resp = error_response(err)
        resp.headers.update(ident_headers(st, ctx))
        if ctx.variant is not None and err.status >= 500:
            resp.headers["x-served-by"] = ctx.variant
        return resp
    finally:
        if ctx.place is not None:
            st.caps.give_back(ctx.place)
        _finish(st, ctx)


async def _proxy(request: web.Request, st: RouterState, ctx: RequestContext) -> web.StreamResponse:
    await _apply_faults(st, ctx)
    h = request.headers
    pin = parse_pin(h.get(PIN_HEADER))
    ctx.pinned = pin is not None
    # What goes upstream is exactly the bytes strict JSON accepted.
    raw, body, ctx.prompt_tokens = await read_json_body(request, st.settings.max_body_bytes)
    ctx.bucket = st.bucket_of(ctx.prompt_tokens)
    ctx.stream = body.get("stream") is True
    snap = st.snapshot()
    canary_live = snap.weight_pct > 0 and len(st.pools["canary"]) > 0
    ctx.variant = _choose(st, ctx, snap, pin, h.get(USER_HEADER), canary_live)
    ctx.place = st.caps.take(client_key(h.get(USER_HEADER), request.remote), ctx.variant)
    headers = _upstream_headers(h, ctx.colour)
    candidates = st.pools[ctx.variant].candidates()
    payload = raw
    shadow = ctx.shadow = ShadowSession.plan(
        st,
        ctx,
        body=body,
        chat=request.path.endswith("/chat/completions"),
        path=request.path,
        headers=headers,
        canary_live=canary_live,
        candidates=candidates,
        user=h.get(USER_HEADER),
    )
    if shadow is not None:
        payload = shadow.payload
        headers["accept-encoding"] = "identity"
        shadow.start()
    return await _forward(request, st, ctx, payload, headers, candidates)


async def _apply_faults(st: RouterState, ctx: RequestContext) -> None:
    faults = st.comp.faults
    latency = faults.get("latency")
    if isinstance(latency, LatencyFault):
        await faults.delay("latency", latency.ms / 1000.0)
    abort = faults.get("abort")
    if isinstance(abort, AbortFault) and st.rng.random() < abort.rate:
        ctx.error = "router_abort"
        raise Unavailable(
            "Request aborted by the router's injected 'abort' fault (chaos testing); retry.",
            code="fault_abort",
        )


def _choose(
    st: RouterState,
    ctx: RequestContext,
    snap: Snapshot,
    pin: Variant | None,
    user_key: str | None,
    canary_live: bool,
) -> Variant:
    """The variant that answers: the pin when there is one, else the split.

    Pins and evidence. Any client can send ``x-canary-variant``, so a pinned request is never
    gate evidence: it gets no outcome record and no shadow comparison. A pin to a canary
    that is off because of the release phase (tripped, rolling back, rolled back), a
    quarantined canary, no config or the fail-safe is answered 409 ``canary_off`` naming the
    phase and never reaches the canary (a pin to a canary an operator holds at weight 0 still
    passes: the oracle probes it before the ramp). A failure caused by the request is never
    canary evidence either: a 4xx is not an outcome, and when a baseline-canary shadow pair
    ran and both variants failed on the same input, the user's error outcome is not pushed.
    Nor is an answer the model server made without its shared dependency (``x-dependency:
    degraded``): both variants share it, so its outage says nothing about the canary.
    """
    if pin is not None:
        if pin == "canary":
            refuse_off_canary(st, snap)
        return pin
    return choose_variant(
        release=st.settings.release,
        user_key=user_key,
        weight_pct=snap.weight_pct if canary_live else 0.0,
        prompt_tokens=ctx.prompt_tokens,
        max_canary_prompt_tokens=st.settings.max_canary_prompt_tokens,
        rng=st.rng,
    )


def _upstream_headers(h: Mapping[str, str], colour: Colour) -> dict[str, str]:
    """The headers of the call to the model server: a child span of the request's colour."""
    out = {"content-type": "application/json", **colour.child().headers()}
    for name in FORWARDED_HEADERS:
        value = h.get(name)
        if value is not None:
            out[name] = value
    return out


async def _forward(
    request: web.Request,
    st: RouterState,
    ctx: RequestContext,
    payload: bytes,
    headers: dict[str, str],
    candidates: list[Upstream],
) -> web.StreamResponse:
    assert ctx.variant is not None
    variant = ctx.variant
    relayed = False
    t_send = time.perf_counter()
    loop = asyncio.get_running_loop()
    waits = RequestWaits(request, st.settings.deadlines, loop.time() - (t_send - ctx.t0))
    try:
        try:
            attempt = await open_upstream(
                st,
                variant,
                ctx.pinned,
                request.path,
                payload,
                headers,
                candidates,
                waits=waits,
                stream=ctx.stream,
            )
        except Unavailable:
            ctx.error = "connect"
            raise
        except UpstreamStalled as stall:
            raise stalled(st, ctx, variant, stall) from None
        except ClientGone as gone:
            return _client_gone(st, ctx, variant, gone)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # The request was sent (or partly): never resend it to another replica.
            ctx.error = "timeout" if isinstance(exc, TimeoutError) else "broken_stream"
            st.metrics.upstream_errors.labels(variant=variant, kind=ctx.error).inc()
            raise Unavailable(
                f"The {variant} upstream failed before answering ({type(exc).__name__}); retry.",
                status=502,
                code="upstream_failed",
            ) from None
        ctx.variant = attempt.variant
        ctx.fallback = attempt.fallback
        ctx.upstream = attempt.upstream.url
        ctx.model_version = attempt.resp.headers.get("x-model-version", "")
        ctx.dependency = attempt.resp.headers.get(DEPENDENCY_HEADER)
        collector = None
        if ctx.shadow is not None:
            collector = ctx.shadow.collector
            ctx.shadow.answer_started(t_send)
        try:
            resp = await relay(request, st, ctx, attempt, collector, t_send, waits)
        except ClientGone as gone:
            attempt.resp.close()
            return _client_gone(st, ctx, attempt.variant, gone)
        except BaseException:
            attempt.resp.close()  # never leave a half-read upstream connection in the pool
            raise
        relayed = True
        return resp
    finally:
        if ctx.shadow is not None:
            ctx.shadow.primary_finished(relayed=relayed, t_send=t_send)


def _client_gone(
    st: RouterState, ctx: RequestContext, variant: str, gone: ClientGone
) -> web.StreamResponse:
    """The client left before any answer went to it (``forward.client_left`` says whether
    because of a stall); the answer is for the log, nobody reads it."""
    client_left(st, ctx, variant, gone)
    ctx.status = ctx.status or (504 if ctx.error != "client_abort" else 499)
    return web.Response(status=ctx.status)


def _finish(st: RouterState, ctx: RequestContext) -> None:
    """Metrics, the per-request log line, and the outcome for the gate."""
    variant = ctx.variant or "none"
    st.metrics.count_request(variant, ctx.status)
    if ctx.ttft_s is not None and ctx.variant is not None:
        st.metrics.observe_ttft(ctx.variant, ctx.ttft_s)
    e2e_s = time.perf_counter() - ctx.t0
    st.log.info(
        "request_done",
        request_id=ctx.request_id,
        traceparent=ctx.traceparent,
        trace_id=ctx.colour.trace_id,
        traffic_tag=ctx.colour.tag,
        variant=ctx.variant,
        pinned=ctx.pinned,
        fallback=ctx.fallback,
        upstream=ctx.upstream,
        status=ctx.status,
        bucket=ctx.bucket,
        prompt_tokens=ctx.prompt_tokens,
        stream=ctx.stream,
        ttft_s=None if ctx.ttft_s is None else round(ctx.ttft_s, 6),
        upstream_ttft_s=None if ctx.upstream_ttft_s is None else round(ctx.upstream_ttft_s, 6),
        e2e_s=round(e2e_s, 6),
        error=ctx.error,
        dependency=ctx.dependency,
        shadow=ctx.shadow_pairs or None,
        config_revision=st.config.current.revision,
    )
    # Only the models' behaviour goes to the gate: a client's own mistake (4xx), a client
    # that hung up or stopped reading, the router's injected abort, or a pinned request
    # (any client can pin) say nothing about baseline vs canary. A client that left during
    # an upstream stall is ``upstream_stall``: silence is evidence.
    if (
        st.queue is None
        or ctx.pinned
        or ctx.variant is None
        or ctx.bucket is None
        or ctx.error in ("client_abort", "router_abort", CLIENT_STALLED)
        or 400 <= ctx.status < 500
    ):
        return
    if ctx.dependency == DEPENDENCY_DEGRADED:
        # Made without the dependency both variants share: no evidence about the canary.
        st.metrics.outcomes_skipped.labels(reason="dependency_degraded").inc()
        st.log.info("outcome_not_pushed", request_id=ctx.request_id, reason="dependency_degraded")
        return
    record = outcome_record(
        variant=ctx.variant,
        bucket=ctx.bucket,
        prompt_tokens=ctx.prompt_tokens,
        ttft_s=ctx.upstream_ttft_s,
        error=ctx.error,
        request_id=ctx.request_id,
    )
    coloured(record, ctx.colour)
    if ctx.shadow is not None:
        ctx.shadow.outcome(record)  # an error may wait for the shadow copy's verdict
    else:
        st.push("outcome", record)


async def handle_models(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models`` from a baseline replica (what clients may ask for)."""
    st = request.app[STATE]
    colour = request_colour(request, st.comp)
    pool = st.pools["baseline"]
    for ups in pool.candidates():
        try:
            async with st.upstream_session.get(
                ups.url + "/v1/models", headers=colour.child().headers()
            ) as up:
                data = await up.read()
                return web.Response(
                    body=data,
                    status=up.status,
                    content_type="application/json",
                    headers={"x-router-id": st.settings.router_id},
                )
        except aiohttp.ClientConnectorError:
            pool.mark_down(ups)
    raise Unavailable("No baseline replica answered GET /v1/models; retry shortly.")
