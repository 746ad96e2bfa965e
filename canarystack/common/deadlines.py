"""Read deadlines on every component's server side, so a client that sends slowly (or not
at all) cannot hold a connection for good (slowloris, #27 finding 8a).

aiohttp (3.x) has no request-header timeout of its own: a connection that never completes
its headers is closed only by ``keepalive_timeout`` (an hour by default), counted from the
connection's start. Three deadlines instead, each with a flag on every component:

- **headers** (``--header-timeout-s``, ``HEADER_TIMEOUT_S``): a request's line and headers
  must be complete within this time from the connection's start (first request) or from
  the first byte of the next request on a kept-alive connection (hyper's rule, so a client
  pool's idle connections are not taken for slow ones). Enforced by ``DeadlineHandler``.
- **idle** (``--idle-timeout-s``, ``IDLE_TIMEOUT_S``): a kept-alive connection that sends
  nothing after its last answer is closed after this (aiohttp's ``keepalive_timeout``).
- **body** (``--body-timeout-s``, ``BODY_TIMEOUT_S``): once a handler starts reading a
  body, the whole body must arrive within this; else 408 and the connection is closed
  (``body_deadline``, used by ``errors.read_capped``, which every body reader goes
  through). Counting from the first read, not from the headers, keeps the server's own
  waits (a latency fault, a queue) out of the client's time.

``deadline_runner`` is how a component serves its app with them. This module must never
close a connection that is answering a request, nor one whose client is waiting on us.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from canarystack.common.logs import get_logger

# Real clients send a request's headers in one write (well under 1 ms on a LAN, under a
# round trip on a WAN); 10 s covers a stalled link and a long GC pause and is Go's
# customary ReadHeaderTimeout. A slowloris connection lives at most this long.
HEADER_TIMEOUT_S = 10.0
# Longer than the aiohttp client's 15 s pool keep-alive (the router, gate and rollback
# executor use it) and common load balancers' 60 s, so the client always closes an idle
# connection first and never sends a request on one the server is closing; 75 s is
# aiohttp's own web.run_app default.
IDLE_TIMEOUT_S = 75.0
# The largest body a component takes is the router's and model server's (a few MiB at
# most, sized from the context length); 30 s is ~100 KiB/s for 3 MiB, far below any real
# client, and bounds how long a trickled body holds a request slot.
BODY_TIMEOUT_S = 30.0

# The response side (#27 finding 1). One write to a client blocked this long means the
# client stopped reading (a reading client drains aiohttp's 64 KiB write buffer in
# milliseconds): the router and the model server cut its stream and free what it held.
WRITE_TIMEOUT_S = 10.0
# A whole proxied or generated request: a 16k-token generation at ~60 tokens/s takes
# ~270 s, the longest answer a healthy engine gives; past it the request is cut.
REQUEST_DEADLINE_S = 300.0

_log = get_logger("http")


@dataclass(frozen=True)
class ReadDeadlines:
    """The three deadlines, in seconds (module docstring)."""

    header_s: float = HEADER_TIMEOUT_S
    idle_s: float = IDLE_TIMEOUT_S
    body_s: float = BODY_TIMEOUT_S

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReadDeadlines:
        return cls(
            header_s=getattr(args, "header_timeout_s", HEADER_TIMEOUT_S),
            idle_s=getattr(args, "idle_timeout_s", IDLE_TIMEOUT_S),
            body_s=getattr(args, "body_timeout_s", BODY_TIMEOUT_S),
        )


DEADLINES: web.AppKey[ReadDeadlines] = web.AppKey("read_deadlines", ReadDeadlines)


def body_deadline(request: web.BaseRequest) -> float:
    """Seconds the request's body may take to arrive (its app's ``ReadDeadlines``)."""
    app = getattr(request, "app", None)
    deadlines = app.get(DEADLINES) if app is not None else None
    return (deadlines or ReadDeadlines()).body_s


def close_after_answer(request: web.BaseRequest) -> None:
    """Close ``request``'s connection once its answer is written (its body missed its
    deadline: the rest of it must not be read as a next request, nor waited for)."""
    protocol = request.protocol
    if isinstance(protocol, DeadlineHandler):
        protocol.close_after_answer = True


class DeadlineHandler(RequestHandler):
    """aiohttp's connection protocol with a deadline on reading a request's headers: armed
    when the connection starts, and again at the first byte of each later request; cleared
    once the headers are parsed; when it fires on a connection that is neither answering
    nor holding a parsed request, the connection is closed (logged ``header_timeout``).
    After a 408 for a late body, the connection is closed at once instead of lingering."""

    def __init__(self, manager: Any, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_handle: asyncio.TimerHandle | None = None
        self._awaiting_headers = True
        self.close_after_answer = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a request's headers are in
            self._awaiting_headers = False
            self._disarm_header_deadline()
        elif self._awaiting_headers and self._header_handle is None:
            self._arm_header_deadline()  # the first byte of the next request

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._awaiting_headers = True  # what comes next is a new request
            if self.close_after_answer:
                self.force_close()

    def _arm_header_deadline(self) -> None:
        if self._header_timeout_s > 0:
            self._header_handle = self._loop.call_later(
                self._header_timeout_s, self._header_deadline
            )

    def _disarm_header_deadline(self) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None

    def _header_deadline(self) -> None:
        self._header_handle = None
        busy = self._request_in_progress or bool(self._messages)
        if not self._awaiting_headers or busy or self.transport is None:
            return
        peer = self.transport.get_extra_info("peername")
        _log.info("header_timeout", timeout_s=self._header_timeout_s, peer=str(peer))
        self.force_close()


class _DeadlineServer(web.Server):
    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s

    def __call__(self) -> RequestHandler:
        return DeadlineHandler(
            self, loop=self._loop, header_timeout_s=self._header_timeout_s, **self._kwargs
        )


class DeadlineRunner(web.AppRunner):
    """An ``AppRunner`` whose connections are ``DeadlineHandler`` s."""

    def __init__(self, app: web.Application, deadlines: ReadDeadlines, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=deadlines.idle_s, **kwargs)
        self._deadlines = deadlines

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # runs the app's startup, as AppRunner does
        return _DeadlineServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            header_timeout_s=self._deadlines.header_s,
            **plain._kwargs,
        )


def deadline_runner(app: web.Application, args: argparse.Namespace) -> web.AppRunner:
    """The runner every component serves ``app`` with: the read deadlines of ``args``
    (``--header-timeout-s``, ``--idle-timeout-s``, ``--body-timeout-s``), no access log, no
    signal handlers (the component handles SIGTERM)."""
    deadlines = ReadDeadlines.from_args(args)
    app[DEADLINES] = deadlines
    return DeadlineRunner(app, deadlines, access_log=None, handle_signals=False)
