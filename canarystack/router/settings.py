"""The router's settings, limits and fault kinds: what an operator can set, in one place.

This module must never do I/O: it is data the other router modules read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from canary_contract.buckets import DEFAULT_EDGES
from canarystack.common.faults import FaultParams, NoParams
from canarystack.router.config import WATCH_ERROR_FAILSAFE_S
from canarystack.router.routing import PIN_HEADER
from canarystack.router.shadow import ShadowSettings

ROUTER_VERSION = "0.1.0"
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
# Long prompts on a slow engine can take a while before the first byte; a stream that
# stays silent this long is broken.
UPSTREAM_READ_TIMEOUT_S = 300.0
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
