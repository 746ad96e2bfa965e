"""The router's HTTP app: proxy ``/v1/completions`` and ``/v1/chat/completions`` to the
baseline or canary pool, stream responses through chunk by chunk, add the routing headers,
mirror sampled requests for shadow comparison, and report outcomes to the gate.

Per request (the hot path):

1. faults (``latency`` sleeps, ``abort`` answers 503) — a dict lookup when none is active;
2. the body is parsed once (prompt length, bucket, ``stream``); the variant is chosen
   (``routing.py``);
3. the request goes to a replica of the variant's pool; a replica that refuses the
   connection is marked down and the next one is tried (nothing was sent yet);
4. the response is relayed: SSE with ``iter_any()`` chunk by chunk, written as it comes;
   a non-streaming body is read whole (it is not a stream) and sent on. Only a request
   sampled for shadow comparison has its events parsed (``shadow.Collector``);
5. one JSON log line, metrics, and an outcome record for the gate.

When a whole pool is down (every replica refused the connection):

- an unpinned request for the canary goes to the baseline instead (users are protected;
  ``x-served-by: baseline``, logged with ``fallback: true``);
- a request pinned with ``x-canary-variant`` gets 503 naming the pool — a pin is a test
  asking for that variant and must not be answered by the other one;
- an unpinned baseline request gets 503: the router never moves all traffic to an
  unvetted canary on its own.

A stream that breaks after the headers were sent cannot change its status: the router
closes the client connection without the terminating chunk, so the client sees a broken
stream, not a short but "complete" one.

Pins and evidence. Any client can send ``x-canary-variant``, so a pinned request is never
gate evidence: it gets no outcome record and no shadow comparison. A pin to a canary
that is off because of the release phase (tripped, rolling back, rolled back), a
quarantined canary, no config or the fail-safe is answered 409 ``canary_off`` naming the
phase and never reaches the canary (a pin to a canary an operator holds at weight 0 still
passes: the oracle probes it before the ramp). A failure caused by the request is never
canary evidence either: a 4xx is not an outcome, and when a baseline-canary shadow pair
ran and both variants failed on the same input, the user's error outcome is not pushed.

Hostile input. The body is read up to ``--max-body-bytes`` (413 naming the limit beyond)
and parsed with ``canarystack.common.strictjson`` (400 naming what was wrong: ``NaN``, an
integer of 5000 digits, nesting 100k deep, a lone surrogate, ``1e400``); header values the
router forwards or echoes must be printable ASCII (400 naming the header).

This module must never buffer a stream, parse an unsampled stream's events, let shadow
work, the gate or the broker delay or fail a user's request, send a pinned request to a
canary that is off, or answer a client's input with a 5xx.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import random
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field

from canarystack.broker.client import BrokerClient
from canarystack.common import strictjson
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.buckets import DEFAULT_EDGES, bucket_labels
from canarystack.common.errors import (
    ApiError,
    BadRequest,
    Conflict,
    PayloadTooLarge,
    Unavailable,
    error_response,
    read_body,
)
from canarystack.common.faults import FaultParams, FaultRegistry, NoParams
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.router.api_spec import install as install_api_spec
from canarystack.router.config import WATCH_ERROR_FAILSAFE_S, ConfigWatcher, Snapshot
from canarystack.router.proxy import HOP_BY_HOP, Pool, Upstream
from canarystack.router.routing import (
    PIN_HEADER,
    USER_HEADER,
    Variant,
    choose_variant,
    parse_pin,
    prompt_tokens_of,
)
from canarystack.router.samples import GatePusher, SampleQueue, outcome_record
from canarystack.router.shadow import (
    PRIMARY_WAIT_S,
    Collector,
    LogprobRequest,
    ShadowManager,
    ShadowSettings,
    ShadowStats,
    SideResult,
    comparison_result,
    fetch_side,
    is_greedy,
    shadow_body,
    shadow_safe,
    user_logprobs_k,
    with_logprobs,
)

ROUTER_VERSION = "0.1.0"
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
# Long prompts on a slow engine can take a while before the first byte; a stream that
# stays silent this long is broken.
UPSTREAM_READ_TIMEOUT_S = 300.0
TTFT_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
PROXIED_PATHS = ("/v1/completions", "/v1/chat/completions")
# 4 MiB: about 128k tokens of English prompt (~4 bytes per token, ~8 for chat JSON), more
# than the simulator's and most engines' max_model_len; beyond it a body can only stall
# the event loop that parses it.
# 1 MiB: ~32k tokens of prompt as JSON. Parsing cost grows with the body (a 4 MiB body
# of small items held the loop ~100 ms, bench/results/event_loop_stall.json), so size it
# from the model's max_model_len rather than raising it blindly.
DEFAULT_MAX_BODY_BYTES = 1024**2
# Client headers the router forwards upstream or echoes back: printable ASCII only.
CHECKED_HEADERS = (
    "x-request-id",
    "traceparent",
    "tracestate",
    "x-traffic-tag",
    "authorization",
    "x-user-id",
    PIN_HEADER,
)
MAX_HEADER_CHARS = 4096
# Bodies above this are parsed and counted in a worker thread (a 3 MB prompt takes ~50 ms
# to count; in slices, the thread lets the loop in every switch interval).
OFF_LOOP_BYTES = 64 * 1024
# Arrays and objects in one body, counted outside strings before parsing: json.loads
# builds each in C without letting another thread in (~1 us each), so a million empty
# lists would hold the GIL for a second even in a worker thread. The model server reads
# at most as many (canarystack.model.body).
MAX_CONTAINERS = 20_000
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')


# ------------------------------------------------------------------------- faults


class LatencyFault(FaultParams):
    ms: float = Field(ge=0, le=60_000, description="milliseconds added before forwarding")


class AbortFault(FaultParams):
    rate: float = Field(ge=0, le=1, description="share of requests answered 503")


FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyFault,
    "abort": AbortFault,
    "stale_config": NoParams,
    # While active, sample batches go to the gate with a wrong credential (what a botched
    # secret rotation does): the gate refuses them, the router says gate_auth unauthorized.
    "wrong_gate_credential": NoParams,
}


# ------------------------------------------------------------------------ settings


@dataclass
class RouterSettings:
    router_id: str
    release: str
    baseline_urls: list[str]
    canary_urls: list[str] = field(default_factory=list)
    broker_url: str | None = None
    gate_url: str | None = None
    state_dir: str = ".stack"
    heartbeat_s: float = 1.0
    watch_timeout_s: float = 10.0
    edges: tuple[int, ...] = DEFAULT_EDGES
    max_canary_prompt_tokens: int | None = None
    shadow: ShadowSettings | None = None
    sample_queue_size: int = 10_000
    gate_flush_s: float = 0.2
    instance_port: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    watch_error_failsafe_s: float = WATCH_ERROR_FAILSAFE_S


# ------------------------------------------------------------------------- metrics


class RouterMetrics:
    def __init__(self, comp: Component) -> None:
        reg = comp.registry
        self.requests = Counter(
            "router_requests_total",
            "Requests answered, by variant and HTTP status",
            ["variant", "status"],
            registry=reg,
        )
        self.ttft = Histogram(
            "router_ttft_seconds",
            "Time from request arrival to the first response byte sent, by variant",
            ["variant"],
            buckets=TTFT_BUCKETS_S,
            registry=reg,
        )
        self.upstream_errors = Counter(
            "router_upstream_errors_total",
            "Upstream failures by variant and kind (connect, http_5xx, broken_stream, ...)",
            ["variant", "kind"],
            registry=reg,
        )
        self.fallbacks = Counter(
            "router_canary_fallbacks_total",
            "Unpinned canary requests served by the baseline because the canary pool was down",
            registry=reg,
        )
        self.config_revision = Gauge(
            "router_config_revision", "Revision of the applied release config", registry=reg
        )
        self.canary_weight = Gauge(
            "router_canary_weight_percent",
            "Effective canary weight applied (0 when fail-safe)",
            registry=reg,
        )
        self.config_from_cache = Gauge(
            "router_config_from_cache",
            "1 while the applied config came from the on-disk cache",
            registry=reg,
        )
        self.watch_errors = Counter(
            "router_broker_watch_errors_total",
            "Failed broker watch/get calls, by kind",
            ["kind"],
            registry=reg,
        )
        self.heartbeat_errors = Counter(
            "router_broker_heartbeat_errors_total", "Failed heartbeats", registry=reg
        )
        self.shadow_requests = Counter(
            "router_shadow_requests_total",
            "Shadow copies by pair and result (ok, error, dropped_cap, ...)",
            ["pair", "result"],
            registry=reg,
        )
        self.shadow_comparisons = Counter(
            "router_shadow_comparisons_total",
            "Comparisons computed, by pair and bucket",
            ["pair", "bucket"],
            registry=reg,
        )
        self.samples_dropped = Counter(
            "router_samples_dropped_total",
            "Records dropped because the sample queue was full, by kind",
            ["kind"],
            registry=reg,
        )
        self.gate_pushes = Counter(
            "router_gate_pushes_total",
            "Batch pushes to the gate, by result",
            ["result"],
            registry=reg,
        )
        self.sample_queue_len = Gauge(
            "router_sample_queue_length", "Records waiting for the gate", registry=reg
        )
        self.auth_errors = Counter(
            "router_auth_errors_total",
            "Calls the gate or the broker refused with 401/403, by peer and status",
            ["peer", "status"],
            registry=reg,
        )
        self.canary_off_pins = Counter(
            "router_canary_off_pins_total",
            "Requests pinned to a canary that is off, answered 409 canary_off",
            registry=reg,
        )
        self.both_failed = Counter(
            "router_both_failed_total",
            "Error outcomes not pushed because both variants failed on the same input",
            registry=reg,
        )
        # Pre-bound children for the hot path (labels() is a dict lookup plus a lock).
        self._req: dict[tuple[str, int], Any] = {}
        self._ttft = {v: self.ttft.labels(variant=v) for v in ("baseline", "canary")}

    def count_request(self, variant: str, status: int) -> None:
        key = (variant, status)
        child = self._req.get(key)
        if child is None:
            child = self._req[key] = self.requests.labels(variant=variant, status=str(status))
        child.inc()

    def observe_ttft(self, variant: str, seconds: float) -> None:
        self._ttft[variant].observe(seconds)

    def on_apply(self, snap: Snapshot) -> None:
        self.config_revision.set(snap.revision)
        self.canary_weight.set(snap.weight_pct)
        self.config_from_cache.set(1 if snap.source == "cache" else 0)


# --------------------------------------------------------------------------- state


@dataclass
class Attempt:
    """What the upstream answered for one request (after replica retries)."""

    resp: aiohttp.ClientResponse
    upstream: Upstream
    variant: Variant
    fallback: bool


@dataclass
class RequestContext:
    request_id: str
    traceparent: str
    traffic_tag: str | None
    t0: float
    variant: Variant | None = None
    pinned: bool = False
    fallback: bool = False
    upstream: str | None = None
    bucket: str | None = None
    prompt_tokens: int = 0
    stream: bool = False
    status: int = 0
    ttft_s: float | None = None  # from arrival, for users and metrics
    upstream_ttft_s: float | None = None  # from send, for the gate
    error: str | None = None
    shadow_pairs: list[str] = field(default_factory=list)
    # Set when a baseline-canary comparison runs: resolves True when the other variant
    # also failed on this input (the error outcome is then not pushed), else False.
    both_failed: asyncio.Future[bool] | None = None


class RouterState:
    def __init__(self, settings: RouterSettings, comp: Component) -> None:
        self.settings = settings
        self.comp = comp
        assert comp.log is not None
        self.log: JsonLogger = comp.log
        self.metrics = RouterMetrics(comp)
        self.pools: dict[str, Pool] = {
            "baseline": Pool.from_urls("baseline", settings.baseline_urls),
            "canary": Pool.from_urls("canary", settings.canary_urls),
        }
        self.session: aiohttp.ClientSession | None = None
        self.control: aiohttp.ClientSession | None = None
        self.queue: SampleQueue | None = None
        self.pusher: GatePusher | None = None
        self.shadow: ShadowManager | None = None
        if settings.shadow is not None:
            m = self.metrics
            self.shadow = ShadowManager(
                settings.shadow,
                ShadowStats(
                    on_request=lambda pair, result: m.shadow_requests.labels(
                        pair=pair, result=result
                    ).inc(),
                    on_comparison=lambda pair, bucket: m.shadow_comparisons.labels(
                        pair=pair, bucket=bucket
                    ).inc(),
                ),
            )
        self.config = ConfigWatcher(
            None,
            release=settings.release,
            router_id=settings.router_id,
            state_dir=settings.state_dir,
            heartbeat_s=settings.heartbeat_s,
            watch_timeout_s=settings.watch_timeout_s,
            is_stale=lambda: comp.faults.get("stale_config") is not None,
            on_error=lambda kind: self.metrics.watch_errors.labels(kind=kind).inc(),
            on_heartbeat_error=self.metrics.heartbeat_errors.inc,
            on_apply=self.metrics.on_apply,
            on_auth_error=lambda status: self.metrics.auth_errors.labels(
                peer="broker", status=str(status)
            ).inc(),
            failsafe_s=settings.watch_error_failsafe_s,
        )
        self.rng = random.Random()
        # Same labels as canarystack.common.buckets.bucket_of, computed once.
        self.bucket_labels = bucket_labels(settings.edges)

    @property
    def upstream_session(self) -> aiohttp.ClientSession:
        assert self.session is not None, "router not started"
        return self.session

    def health(self) -> dict[str, Any]:
        snap = self.config.current
        out: dict[str, Any] = {
            "router_id": self.settings.router_id,
            "release": self.settings.release,
            "config": snap.to_json(),
            "last_seen_revision": self.config.last_seen_revision,
            "broker_watch_errors": self.config.watch_errors,
            "pools": {v: p.to_json() for v, p in self.pools.items()},
            "instance_port": self.settings.instance_port,
        }
        if self.settings.broker_url:
            out["broker_auth"] = self.config.broker_auth
            out["broker_auth_error"] = (
                self.config.auth_error if self.config.broker_auth != "ok" else None
            )
        if self.pusher is not None:
            out["gate_auth"] = self.pusher.auth
            out["gate_auth_error"] = self.pusher.auth_error if self.pusher.auth != "ok" else None
        if self.shadow is not None:
            out["shadow_inflight"] = self.shadow.inflight
        if self.queue is not None:
            out["sample_queue"] = {
                "length": len(self.queue),
                "dropped_total": self.queue.dropped_total,
                "gate_error": self.pusher.last_error if self.pusher else None,
            }
        return out

    def push(self, kind: str, record: dict[str, Any]) -> None:
        if self.queue is not None:
            self.queue.put(kind, record)


STATE: web.AppKey[RouterState] = web.AppKey("router_state", RouterState)


# ------------------------------------------------------------------------ helpers


def make_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def _ident_headers(st: RouterState, ctx: RequestContext) -> dict[str, str]:
    return {
        "x-router-id": st.settings.router_id,
        "x-request-id": ctx.request_id,
        "x-config-revision": str(st.config.current.revision),
    }


async def _open_upstream(
    st: RouterState,
    variant: Variant,
    pinned: bool,
    path: str,
    payload: bytes,
    headers: dict[str, str],
    candidates: list[Upstream] | None = None,
    *,
    may_fall_back: bool = True,
) -> Attempt:
    """Send the request to a replica of ``variant``'s pool (see the module docstring for
    what happens when the whole pool refuses)."""
    session = st.upstream_session
    pool = st.pools[variant]
    for ups in candidates if candidates is not None else pool.candidates():
        try:
            resp = await session.post(ups.url + path, data=payload, headers=headers)
        except aiohttp.ClientConnectorError:
            # Nothing was sent: safe to try the next replica.
            pool.mark_down(ups)
            st.metrics.upstream_errors.labels(variant=variant, kind="connect").inc()
            continue
        pool.mark_up(ups)
        return Attempt(resp, ups, variant, fallback=False)
    if may_fall_back and not pinned and variant == "canary" and len(st.pools["baseline"]):
        st.metrics.fallbacks.inc()
        attempt = await _open_upstream(
            st, "baseline", False, path, payload, headers, may_fall_back=False
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


def _response_headers(
    st: RouterState, ctx: RequestContext, up: aiohttp.ClientResponse, variant: str
) -> CIMultiDict[str]:
    headers = CIMultiDict((k, v) for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP)
    headers.update(_ident_headers(st, ctx))
    headers["x-served-by"] = variant
    return headers


def _shadow_headers(base: dict[str, str], pair: str) -> dict[str, str]:
    h = dict(base)
    h["x-shadow"] = pair
    h["accept-encoding"] = "identity"
    return h


# ------------------------------------------------------------------------ handlers


async def handle_proxy(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    t0 = time.perf_counter()
    h = request.headers
    bad_header = _bad_header(h)
    ok = bad_header is None
    ctx = RequestContext(
        request_id=(h.get("x-request-id") if ok else None) or uuid.uuid4().hex,
        traceparent=(h.get("traceparent") if ok else None) or make_traceparent(),
        traffic_tag=h.get("x-traffic-tag") if ok else None,
        t0=t0,
    )
    try:
        if bad_header is not None:
            raise bad_header
        return await _proxy(request, st, ctx)
    except ApiError as err:
        ctx.status = err.status
        ctx.error = ctx.error or err.code or "rejected"
        resp = error_response(err)
        resp.headers.update(_ident_headers(st, ctx))
        if ctx.variant is not None and err.status >= 500:
            resp.headers["x-served-by"] = ctx.variant
        return resp
    finally:
        _finish(st, ctx)


def _bad_header(headers: Any) -> BadRequest | None:
    """A 400 for the first checked header that is not printable ASCII, else None."""
    for name in CHECKED_HEADERS:
        for value in headers.getall(name, ()):
            if len(value) > MAX_HEADER_CHARS:
                return BadRequest(
                    f"Header {name}: {len(value)} characters is too long (at most "
                    f"{MAX_HEADER_CHARS}); send a shorter value.",
                    param=name,
                )
            if not (value.isascii() and value.isprintable()):
                return BadRequest(
                    f"Header {name}: the value is not printable ASCII (undecodable or "
                    "control characters); send printable ASCII only.",
                    param=name,
                )
    return None


def _containers(raw: bytes) -> int:
    """How many JSON arrays and objects ``raw`` opens outside its strings (upper bound)."""
    n = raw.count(b"[") + raw.count(b"{")
    if n <= MAX_CONTAINERS:
        return n
    outside = _JSON_STRING.sub(b"", raw)
    return outside.count(b"[") + outside.count(b"{")


def _parse_body(raw: bytes) -> tuple[dict[str, Any], int]:
    """(strict JSON object, prompt tokens) or a 400 naming what is wrong. Plain
    synchronous work, so a big body can be parsed and counted off the event loop."""
    if not raw.strip():
        raise BadRequest("Request body is empty: send a JSON object.")
    containers = _containers(raw)
    if containers > MAX_CONTAINERS:
        raise BadRequest(
            f"Request body holds {containers} JSON arrays and objects; at most "
            f"{MAX_CONTAINERS} are read. Send a smaller document."
        )
    try:
        body = strictjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise BadRequest(f"Request body must be a JSON object, got {type(body).__name__}.")
    return body, prompt_tokens_of(body)


async def _read_body(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any], int]:
    """The request body (bytes, strict JSON object, prompt tokens): 413 above ``limit``
    bytes (``--max-body-bytes``), 400 naming what is wrong otherwise; a body above
    ``OFF_LOOP_BYTES`` is parsed and counted in a worker thread."""
    try:
        raw = await read_body(request, max_bytes=limit)
    except PayloadTooLarge as err:
        raise PayloadTooLarge(
            f"{err.message} (this router's --max-body-bytes)", code=err.code
        ) from None
    if len(raw) > OFF_LOOP_BYTES:
        body, tokens = await asyncio.get_running_loop().run_in_executor(None, _parse_body, raw)
    else:
        body, tokens = _parse_body(raw)
    return raw, body, tokens


def _refuse_off_canary(st: RouterState, snap: Snapshot) -> None:
    """409 ``canary_off`` for a pin to a canary that is off (module docstring)."""
    if snap.canary_off is None:
        return
    st.metrics.canary_off_pins.inc()
    raise Conflict(
        f"The canary of release {st.settings.release!r} is off ({snap.canary_off}); a "
        f"request pinned with {PIN_HEADER}: canary is not sent to it. Pin 'baseline' or "
        "leave the header out.",
        param=PIN_HEADER,
        code="canary_off",
        extra={"phase": snap.phase, "reason": snap.canary_off},
    )


async def _proxy(request: web.Request, st: RouterState, ctx: RequestContext) -> web.StreamResponse:
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

    h = request.headers
    pin = parse_pin(h.get(PIN_HEADER))
    if pin is not None:
        ctx.pinned = True
    # What goes upstream is exactly the bytes strict JSON accepted.
    raw, body, ctx.prompt_tokens = await _read_body(request, st.settings.max_body_bytes)

    settings = st.settings
    snap = st.config.current
    ctx.bucket = st.bucket_labels[bisect.bisect_right(settings.edges, ctx.prompt_tokens)]
    ctx.stream = body.get("stream") is True
    canary_live = snap.weight_pct > 0 and len(st.pools["canary"]) > 0
    if pin is not None:
        variant: Variant = pin
        if pin == "canary":
            _refuse_off_canary(st, snap)
    else:
        variant = choose_variant(
            release=settings.release,
            user_key=h.get(USER_HEADER),
            weight_pct=snap.weight_pct if canary_live else 0.0,
            prompt_tokens=ctx.prompt_tokens,
            max_canary_prompt_tokens=settings.max_canary_prompt_tokens,
            rng=st.rng,
        )
    ctx.variant = variant
    path = request.path
    chat = path.endswith("/chat/completions")

    up_headers = {
        "content-type": "application/json",
        "x-request-id": ctx.request_id,
        "traceparent": ctx.traceparent,
    }
    for name in ("authorization", "tracestate", "x-traffic-tag"):
        value = h.get(name)
        if value is not None:
            up_headers[name] = value

    payload = raw
    collector: Collector | None = None
    primary_done: asyncio.Future[SideResult] | None = None
    candidates: list[Upstream] | None = None
    if st.shadow is not None and not ctx.pinned and shadow_safe(body, chat):
        ctx.shadow_pairs = st.shadow.plan(
            ctx.bucket, variant, canary_live, len(st.pools["baseline"])
        )
    if ctx.shadow_pairs:
        assert st.shadow is not None
        shadow_settings = st.shadow.settings
        user_k = user_logprobs_k(body, chat)
        k = max(user_k or 0, shadow_settings.topk)
        lp = LogprobRequest(chat=chat, k=k, user_k=user_k)
        payload = strictjson.dumps_bytes(with_logprobs(body, chat, k))
        up_headers["accept-encoding"] = "identity"
        collector = Collector(lp, shadow_settings.max_tokens, time.perf_counter)
        primary_done = asyncio.get_running_loop().create_future()
        candidates = st.pools[variant].candidates()
        greedy = is_greedy(body)
        sbody = shadow_body(body, chat, k, shadow_settings.max_tokens if greedy else 1)
        if "baseline-canary" in ctx.shadow_pairs:
            ctx.both_failed = asyncio.get_running_loop().create_future()
        for pair in ctx.shadow_pairs:
            target: Variant
            if pair == "baseline-canary":
                target = "canary" if variant == "baseline" else "baseline"
                exclude = None
                primary_is_a = variant == "baseline"
            else:
                target, primary_is_a = "baseline", True
                exclude = candidates[0].url if candidates else None
            st.shadow.launch(
                _run_comparison(
                    st,
                    pair=pair,
                    target=target,
                    exclude=exclude,
                    url_path=path,
                    body=sbody,
                    headers=_shadow_headers(up_headers, pair),
                    primary=primary_done,
                    primary_is_a=primary_is_a,
                    greedy=greedy,
                    ctx=ctx,
                )
            )

    primary = SideResult()
    try:
        t_send = time.perf_counter()
        try:
            attempt = await _open_upstream(
                st, variant, ctx.pinned, path, payload, up_headers, candidates
            )
        except Unavailable:
            ctx.error = "connect"
            raise
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
        primary.version = attempt.resp.headers.get("x-model-version", "")
        try:
            resp = await _relay(request, st, ctx, attempt, collector, t_send)
        except BaseException:
            attempt.resp.close()  # never leave a half-read upstream connection in the pool
            raise
        primary.error = ctx.error
        if collector is not None and ctx.error is None:
            primary.positions = collector.positions
            primary.invalid = collector.broken
            if collector.first_content_t is not None:
                primary.ttft_s = collector.first_content_t - t_send
            if collector.invalid is not None:
                # The engine answered 200 with a broken body: an error of that variant
                # for the gate (the comparison still sees the side as answered, invalid).
                ctx.error = "bad_output"
                st.metrics.upstream_errors.labels(variant=ctx.variant, kind="bad_output").inc()
        return resp
    finally:
        if primary_done is not None and not primary_done.done():
            if primary.error is None and ctx.error is not None:
                primary.error = ctx.error
            if primary.error is None and ctx.status != 200:
                primary.error = f"http_{ctx.status}"
            primary_done.set_result(primary)


async def _relay(
    request: web.Request,
    st: RouterState,
    ctx: RequestContext,
    attempt: Attempt,
    collector: Collector | None,
    t_send: float,
) -> web.StreamResponse:
    up = attempt.resp
    variant = attempt.variant
    headers = _response_headers(st, ctx, up, variant)
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
            data = await up.read()
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
        if collector is not None:
            data = collector.feed_body(data)
        up.release()
        return web.Response(body=data, status=status, headers=headers)

    resp = web.StreamResponse(status=status, headers=headers)
    try:
        await resp.prepare(request)
    except (ConnectionError, RuntimeError):
        ctx.error = "client_abort"
        up.close()
        return resp
    prev = last = b""
    try:
        async for chunk in up.content.iter_any():
            if ctx.ttft_s is None:
                now = time.perf_counter()
                ctx.ttft_s = now - ctx.t0
                ctx.upstream_ttft_s = now - t_send
            prev, last = last, chunk
            if collector is not None:
                chunk = collector.feed_chunk(chunk)
                if not chunk:
                    continue
            try:
                await resp.write(chunk)
            except (ConnectionError, RuntimeError):
                ctx.error = "client_abort"
                up.close()
                return resp
        rest = collector.flush() if collector is not None else b""
        if rest:
            try:
                await resp.write(rest)
            except (ConnectionError, RuntimeError):
                ctx.error = "client_abort"
                up.close()
                return resp
    except (TimeoutError, aiohttp.ClientError, OSError):
        up.close()
        ctx.error = "broken_stream"
        st.metrics.upstream_errors.labels(variant=variant, kind="broken_stream").inc()
        _break_client(request)
        return resp
    up.release()
    if status == 200 and not (prev[-16:] + last)[-16:].rstrip().endswith(b"[DONE]"):
        # The upstream ended the stream cleanly but without its terminator: truncated.
        ctx.error = "broken_stream"
        st.metrics.upstream_errors.labels(variant=variant, kind="truncated").inc()
        _break_client(request)
        return resp
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write_eof()
    return resp


def _break_client(request: web.Request) -> None:
    """Close the client's connection without the final chunk: the stream reads as broken."""
    transport = request.transport
    if transport is not None:
        transport.close()


async def _run_comparison(
    st: RouterState,
    *,
    pair: str,
    target: Variant,
    exclude: str | None,
    url_path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    primary: asyncio.Future[SideResult],
    primary_is_a: bool,
    greedy: bool,
    ctx: RequestContext,
) -> None:
    """One shadow copy and its comparison. Runs detached; every failure is counted."""
    both_failed = ctx.both_failed if pair == "baseline-canary" else None
    try:
        await _compare(
            st,
            pair=pair,
            target=target,
            exclude=exclude,
            url_path=url_path,
            body=body,
            headers=headers,
            primary=primary,
            primary_is_a=primary_is_a,
            greedy=greedy,
            ctx=ctx,
            both_failed=both_failed,
        )
    finally:
        if both_failed is not None and not both_failed.done():
            both_failed.set_result(False)


async def _compare(
    st: RouterState,
    *,
    pair: str,
    target: Variant,
    exclude: str | None,
    url_path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    primary: asyncio.Future[SideResult],
    primary_is_a: bool,
    greedy: bool,
    ctx: RequestContext,
    both_failed: asyncio.Future[bool] | None,
) -> None:
    assert st.shadow is not None
    stats = st.shadow.stats
    pool = st.pools[target]
    side = SideResult(error="connect")
    max_positions = st.shadow.settings.max_tokens
    for ups in pool.candidates(exclude=exclude):
        side = await fetch_side(
            st.upstream_session, ups.url + url_path, body, headers, max_positions
        )
        if side.error == "connect":
            pool.mark_down(ups)
            continue
        break
    try:
        main = await asyncio.wait_for(asyncio.shield(primary), PRIMARY_WAIT_S)
    except TimeoutError:
        stats.on_request(pair, "primary_timeout")
        return
    if both_failed is not None and not both_failed.done():
        # Both variants failed on the same input (a refused connection says nothing about
        # the input): the input's fault, not the canary's.
        both_failed.set_result(
            main.error not in (None, "client_abort", "connect")
            and side.error not in (None, "connect")
        )
    if side.error is not None:
        stats.on_request(pair, "error")
        st.log.debug("shadow_failed", request_id=ctx.request_id, pair=pair, error=side.error)
        return
    if main.error is not None and main.error != "bad_output":
        stats.on_request(pair, "primary_failed")
        return
    if ctx.fallback:
        # The canary pool was down and the baseline served the user: not the pair planned.
        stats.on_request(pair, "primary_fallback")
        return
    a, b = (main, side) if primary_is_a else (side, main)
    assert ctx.bucket is not None
    result, record = comparison_result(
        pair=pair,
        a=a,
        b=b,
        greedy=greedy,
        bucket=ctx.bucket,
        prompt_tokens=ctx.prompt_tokens,
        request_id=ctx.request_id,
    )
    stats.on_request(pair, result)
    if record is None:
        if result != "not_comparable":
            st.log.warning(
                "shadow_side_invalid",
                request_id=ctx.request_id,
                pair=pair,
                result=result,
                a=a.invalid,
                b=b.invalid,
            )
        return
    if result != "ok":
        st.log.warning(
            "shadow_canary_invalid", request_id=ctx.request_id, reason=record.get("invalid")
        )
    stats.on_comparison(pair, ctx.bucket)
    st.push("comparison", record)


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
        traffic_tag=ctx.traffic_tag,
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
        shadow=ctx.shadow_pairs or None,
        config_revision=st.config.current.revision,
    )
    # Only the models' behaviour goes to the gate: a client's own mistake (4xx), a client
    # that hung up, the router's injected abort, or a pinned request (any client can pin)
    # say nothing about baseline vs canary.
    if (
        st.queue is None
        or ctx.pinned
        or ctx.variant is None
        or ctx.bucket is None
        or ctx.error in ("client_abort", "router_abort")
        or 400 <= ctx.status < 500
    ):
        return
    record = outcome_record(
        variant=ctx.variant,
        bucket=ctx.bucket,
        prompt_tokens=ctx.prompt_tokens,
        ttft_s=ctx.upstream_ttft_s,
        error=ctx.error,
        request_id=ctx.request_id,
    )
    hold = ctx.both_failed
    if ctx.error is None or hold is None:
        st.push("outcome", record)
        return

    def decide(fut: asyncio.Future[bool]) -> None:
        if not fut.cancelled() and fut.result():
            st.metrics.both_failed.inc()
            st.log.info("outcome_not_pushed", request_id=ctx.request_id, reason="both_failed")
            return
        st.push("outcome", record)

    # The error outcome waits for the shadow copy to say whether the other variant failed
    # on this input too (the comparison task always resolves it).
    if hold.done():
        decide(hold)
    else:
        hold.add_done_callback(decide)


async def handle_models(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models`` from a baseline replica (what clients may ask for)."""
    st = request.app[STATE]
    pool = st.pools["baseline"]
    for ups in pool.candidates():
        try:
            async with st.upstream_session.get(ups.url + "/v1/models") as up:
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


# ------------------------------------------------------------------------- the app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    settings = st.settings
    st.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=UPSTREAM_CONNECT_TIMEOUT_S, sock_read=UPSTREAM_READ_TIMEOUT_S
        ),
    )
    st.control = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16))
    if settings.broker_url:
        st.config.broker = BrokerClient(
            st.control,
            settings.broker_url,
            app[BROKER_TOKEN],
            actor=settings.router_id,
            capability="heartbeat",
        )
    if settings.gate_url:
        queue = SampleQueue(
            settings.sample_queue_size,
            on_drop=lambda kind: st.metrics.samples_dropped.labels(kind=kind).inc(),
        )
        st.queue = queue
        st.metrics.sample_queue_len.set_function(lambda: float(len(queue)))
        st.pusher = GatePusher(
            st.control,
            settings.gate_url,
            queue,
            router_id=settings.router_id,
            release=settings.release,
            admin_token=app[GATE_TOKEN],
            wrong_credential=lambda: st.comp.faults.get("wrong_gate_credential") is not None,
            on_push=lambda result: st.metrics.gate_pushes.labels(result=result).inc(),
            on_auth_error=lambda status: st.metrics.auth_errors.labels(
                peer="gate", status=str(status)
            ).inc(),
            on_drop=lambda kind: st.metrics.samples_dropped.labels(kind=kind).inc(),
            flush_interval_s=settings.gate_flush_s,
        )
        st.pusher.start()
    await st.config.start()
    yield
    if st.shadow is not None:
        await st.shadow.close()
    if st.pusher is not None:
        await st.pusher.stop()
    await st.config.stop()
    await st.session.close()
    await st.control.close()


BROKER_TOKEN: web.AppKey[str | None] = web.AppKey("router_broker_token", str)
GATE_TOKEN: web.AppKey[str | None] = web.AppKey("router_gate_token", str)


def build_app(
    settings: RouterSettings,
    admin_token: str | None,
    max_fault_ttl_s: float = 600.0,
    *,
    broker_token: str | None = None,
    gate_token: str | None = None,
) -> web.Application:
    """``admin_token``: the router's fault credential; ``broker_token``: its heartbeat
    credential; ``gate_token``: its samples credential. The last two fall back to
    ``admin_token`` (single-credential mode)."""
    log = get_logger("router")
    faults = FaultRegistry("router", FAULT_KINDS, max_ttl_s=max_fault_ttl_s, log=log)
    comp = Component(
        name="router",
        version=ROUTER_VERSION,
        admin_token=admin_token,
        faults=faults,
        log=log,
    )
    state = RouterState(settings, comp)
    comp.health_extra = state.health
    app = create_app(comp, client_max_size=settings.max_body_bytes)
    app[STATE] = state
    app[BROKER_TOKEN] = admin_token if broker_token is None else broker_token
    app[GATE_TOKEN] = admin_token if gate_token is None else gate_token
    for path in PROXIED_PATHS:
        app.router.add_post(path, handle_proxy)
    app.router.add_get("/v1/models", handle_models)
    install_api_spec(app)
    app.cleanup_ctx.append(_lifecycle)
    assert app[COMPONENT] is comp
    return app
