"""Traffic colouring: the request id, the W3C trace context and the traffic tag of a request.

This module must never do I/O: it parses and renders headers (the middleware and the
spans are ``canarystack.common.colour_http`` and ``canarystack.common.otel``).
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from aiohttp import web

REQUEST_ID = "x-request-id"
TRACEPARENT = "traceparent"
TRAFFIC_TAG = "x-traffic-tag"
HEADERS = (REQUEST_ID, TRACEPARENT, TRAFFIC_TAG)

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# A request id or tag a client may send: printable, no spaces, bounded (it lands in logs,
# samples and SQLite).
_TOKEN = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")


@dataclass(frozen=True)
class Colour:
    """What every hop (router, model server, shadow copy, Redis call, gate sample, broker
    trip evidence) must carry on, so a request can be followed end to end:
    ``x-request-id`` (made up at the first hop when absent), ``traceparent`` (W3C trace
    context; the trace id is kept, each hop is a new span) and ``x-traffic-tag`` (a
    client's label, e.g. ``gameday`` or ``shadow``; never invented, never changed)."""

    request_id: str
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # this hop's span (16 hex digits)
    parent_span_id: str | None  # the caller's span, when the caller sent a traceparent
    tag: str | None  # the client's traffic tag; None when it sent none
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> Colour:
        """The colour of a call this hop makes: same trace, request id and tag; new span."""
        return replace(self, span_id=secrets.token_hex(8), parent_span_id=self.span_id)

    def headers(self) -> dict[str, str]:
        """Headers for an outgoing call made as this hop (call ``child()`` first for a new span)."""
        out = {REQUEST_ID: self.request_id, TRACEPARENT: self.traceparent}
        if self.tag is not None:
            out[TRAFFIC_TAG] = self.tag
        return out

    def as_record(self) -> dict[str, str | None]:
        """The fields a sample, a record or trip evidence keeps."""
        return {"request_id": self.request_id, "trace_id": self.trace_id, "tag": self.tag}


# The key under which the middleware stores a request's Colour (``request[COLOUR_KEY]``;
# ``request.get(COLOUR_KEY)`` outside the middleware's reach). A typed aiohttp request key:
# a name, not I/O.
COLOUR_KEY: web.RequestKey[Colour] = web.RequestKey("canarystack.colour", Colour)


def _valid_token(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return value if _TOKEN.match(value) else None


def colour_of(headers: Mapping[str, str]) -> Colour:
    """The colour of an incoming request. Missing or malformed values are replaced (request id,
    trace context: a new one) or dropped (tag): a hostile header never reaches a log as is."""
    request_id = _valid_token(headers.get(REQUEST_ID)) or secrets.token_hex(16)
    parent = None
    trace_id = None
    flags = "01"
    m = _TRACEPARENT.match((headers.get(TRACEPARENT) or "").strip())
    if m and m.group(1) != "0" * 32 and m.group(2) != "0" * 16:
        trace_id, parent, flags = m.group(1), m.group(2), m.group(3)
    return Colour(
        request_id=request_id,
        trace_id=trace_id or secrets.token_hex(16),
        span_id=secrets.token_hex(8),
        parent_span_id=parent,
        tag=_valid_token(headers.get(TRAFFIC_TAG)),
        flags=flags,
    )


@dataclass(frozen=True)
class Hop:
    """One hop's sighting of a coloured request: which hop, and the colour it saw."""

    hop: str  # e.g. "router", "model", "shadow", "redis", "gate_sample", "trip_evidence"
    request_id: str
    trace_id: str
    tag: str | None
    at: float  # wall-clock seconds
    # The HTTP status the hop answered with, and its route (the middleware's hops); None for
    # hops a component records itself (a shadow copy, a Redis call, a gate sample).
    status: int | None = None
    path: str | None = None

    def as_json(self, seq: int) -> dict[str, str | int | float | None]:
        return {
            "seq": seq,
            "hop": self.hop,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "tag": self.tag,
            "at": self.at,
            "status": self.status,
            "path": self.path,
        }


class HopLog:
    """The last ``capacity`` hops a component saw, in order, for the colouring probe.

    Bounded (a flood cannot grow it) and numbered (``seq``), so a reader pages with
    ``since(seq)`` and can tell when it fell behind (``dropped_before``)."""

    def __init__(self, capacity: int = 20000) -> None:
        self.capacity = capacity
        self._hops: deque[tuple[int, Hop]] = deque(maxlen=capacity)
        self._seq = 0

    def record(
        self,
        hop: str,
        colour: Colour,
        at: float,
        *,
        status: int | None = None,
        path: str | None = None,
    ) -> int:
        """Record a hop; its seq (for ``complete``)."""
        self._seq += 1
        self._hops.append(
            (
                self._seq,
                Hop(hop, colour.request_id, colour.trace_id, colour.tag, at, status, path),
            )
        )
        return self._seq

    def complete(self, seq: int, status: int) -> None:
        """Set the status of hop ``seq`` once its request is answered (a hop is recorded
        when the request arrives, so a reader sees a request still in flight; one already
        overwritten is left alone)."""
        if not self._hops:
            return
        index = seq - self._hops[0][0]
        if 0 <= index < len(self._hops):
            held_seq, hop = self._hops[index]
            if held_seq == seq:
                self._hops[index] = (seq, replace(hop, status=status))

    @property
    def last_seq(self) -> int:
        return self._seq

    def since(self, after_seq: int, limit: int = 10000) -> tuple[list[tuple[int, Hop]], int]:
        """Hops with seq > after_seq (oldest first, at most ``limit``) and the first seq still
        held (a reader whose ``after_seq`` is below it lost hops)."""
        first = self._hops[0][0] if self._hops else self._seq + 1
        if not self._hops or after_seq >= self._seq:
            return [], first
        # seqs are consecutive: jump to the first wanted one instead of scanning the deque.
        start = max(0, after_seq + 1 - first)
        out = list(itertools.islice(self._hops, start, start + max(0, limit)))
        return out, first
