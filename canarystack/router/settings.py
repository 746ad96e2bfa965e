"""The router's settings, limits and fault kinds: what an operator can set, in one place.

This module must never do I/O: it is data the other router modules read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from canary_contract.buckets import DEFAULT_EDGES
from canarystack.common.deadlines import REQUEST_DEADLINE_S as COMMON_REQUEST_DEADLINE_S
from canarystack.common.deadlines import WRITE_TIMEOUT_S
from canarystack.common.faults import FaultParams, NoParams
from canarystack.router.config import WATCH_ERROR_FAILSAFE_S
from canarystack.router.routing import PIN_HEADER
from canarystack.router.shadow import ShadowSettings

ROUTER_VERSION = "0.1.0"
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
# The deadlines of one proxied request (#27 findings 1 and 2; docs/stack.md, "Timeouts,
# deadlines and caps", says why each default). The whole request, arrival to last byte
# (common.deadlines says why 300 s); past it the upstream is cancelled, an error outcome.
REQUEST_DEADLINE_S = COMMON_REQUEST_DEADLINE_S
# A stream's first body byte (queue wait + prefill of the longest prompt under load).
UPSTREAM_FIRST_BYTE_S = 60.0
# Silence between two body bytes of a stream: inter-token gaps are tens of milliseconds,
# so 10 s silent is a hung engine, not a slow one.
UPSTREAM_IDLE_S = 10.0
# One write to the client blocked this long: the client stopped reading (common.deadlines).
CLIENT_WRITE_S = WRITE_TIMEOUT_S
# A client that leaves while its upstream has been silent this long left because of the
# stall: the outcome is ``upstream_stall`` evidence, not a client abort.
STALL_EVIDENCE_S = 5.0
# How often a request waiting on a silent upstream checks whether its client is gone.
CLIENT_CHECK_S = 0.5
# Concurrent proxied requests (streamed or not; each holds an engine slot) per client key
# (x-user-id, else the peer address) and per variant pool; above either, 429.
MAX_CLIENT_STREAMS = 8
MAX_POOL_STREAMS = 256
# Samples the gate has not accepted for this long (posts failing or timing out while
# samples wait): the canary goes to 0 % and /health says degraded (the dead-man switch).
GATE_DEADMAN_S = 10.0
# After such an outage the canary stays off this long once the gate accepts again, so a
# trip the backlog holds (the gate tests it first) reaches the routers before the canary
# takes traffic again: no flap back to a broken canary.
GATE_RECOVERY_S = 2.0
# The upstream session's socket read timeout: a backstop only, the deadlines above act first.
UPSTREAM_READ_TIMEOUT_S = REQUEST_DEADLINE_S
PROXIED_PATHS = ("/v1/completions", "/v1/chat/completions")
# 1 MiB: ~32k tokens of prompt as JSON. Parsing cost grows with the body (a 4 MiB body
# of small items held the loop ~100 ms, bench/results/event_loop_stall.json), so size it
# from the model's max_model_len rather than raising it blindly.
DEFAULT_MAX_BODY_BYTES = 1024**2
# Client headers the router forwards upstream or reads: printable ASCII only. The colour's
# three (x-request-id, traceparent, x-traffic-tag) are never forwarded as sent: a malformed
# one is replaced or dropped (canarystack.common.colour.colour_of), not refused.
CHECKED_HEADERS = (
    "tracestate",
    "authorization",
    "x-user-id",
    PIN_HEADER,
)
MAX_HEADER_CHARS = 4096
# Bodies above this are parsed and counted in a worker thread (a 3 MB prompt takes ~50 ms
# to count; in slices, the thread lets the loop in every switch interval).
OFF_LOOP_BYTES = 64 * 1024
# Bodies are read as the model server reads them (canarystack.model.body.json_object: at
# most MAX_CONTAINERS arrays and objects, then strict JSON).
# What a model server's x-dependency header (shadow.DEPENDENCY_HEADER) says when its shared
# dependency (the Redis context lookup) failed and it answered without it ("ok" otherwise).
DEPENDENCY_DEGRADED = "degraded"


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


@dataclass(frozen=True)
class StreamDeadlines:
    """The deadlines of one proxied request, in seconds (the constants above)."""

    request_s: float = REQUEST_DEADLINE_S
    first_byte_s: float = UPSTREAM_FIRST_BYTE_S
    idle_s: float = UPSTREAM_IDLE_S
    client_write_s: float = CLIENT_WRITE_S
    stall_evidence_s: float = STALL_EVIDENCE_S


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
    deadlines: StreamDeadlines = field(default_factory=StreamDeadlines)
    max_client_streams: int = MAX_CLIENT_STREAMS
    max_pool_streams: int = MAX_POOL_STREAMS
    gate_deadman_s: float = GATE_DEADMAN_S
