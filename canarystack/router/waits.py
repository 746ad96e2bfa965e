"""One proxied request's waits, each with its deadline (#27 findings 1 and 2): on the
upstream (its answer's headers, its first body byte, the silence between two body bytes,
the whole request) and on the client (each write).

No user waits on a broken part: an upstream silent past its deadline raises
``UpstreamStalled`` (the caller cancels it and counts an error outcome: silence is
evidence); a client gone while the router waits raises ``ClientGone``, saying how long the
upstream had been silent then (a client that left during a stall left because of it); a
client that stops reading raises ``ClientStalled`` (its stream is cancelled and its
upstream released). ``canarystack.router.settings`` holds the defaults and why.

This module must never resend a request, read a body it was not asked to, or wait past a
deadline it was given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import StreamReader, web

from canarystack.common.error_fields import CanaryStackError
from canarystack.common.write_progress import WriteProgress
from canarystack.router.settings import CLIENT_CHECK_S, StreamDeadlines

T = TypeVar("T")

# The outcome errors a stall gives (what the gate sees).
UPSTREAM_STALL = "upstream_stall"
UPSTREAM_DEADLINE = "upstream_deadline"


class UpstreamStalled(CanaryStackError):
    """The upstream was silent past a deadline: ``what`` names it, ``limit_s`` its length."""

    def __init__(self, what: str, limit_s: float) -> None:
        super().__init__(f"{what} deadline of {limit_s:g} s")
        self.what = what
        self.limit_s = limit_s

    @property
    def error(self) -> str:
        """The outcome's error: the request's total deadline, or a stall."""
        return UPSTREAM_DEADLINE if self.what == "request" else UPSTREAM_STALL


class ClientGone(CanaryStackError):
    """The client hung up; ``silent_s``: how long the upstream had been silent then."""

    def __init__(self, silent_s: float) -> None:
        super().__init__(f"client gone after {silent_s:.1f} s of upstream silence")
        self.silent_s = silent_s


class ClientStalled(CanaryStackError):
    """The client took nothing of its answer for the write deadline (a blocked write, or
    bytes waiting in the buffers it never drains: ``common.write_progress``)."""


def client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned step's exception, so it is never reported as unretrieved."""
    if not task.cancelled():
        task.exception()


class RequestWaits:
    """The waits of one request, timed from its arrival (``start``, loop time)."""

    def __init__(
        self, request: web.BaseRequest, deadlines: StreamDeadlines, start: float | None = None
    ) -> None:
        self.request = request
        self.d = deadlines
        self.loop = asyncio.get_running_loop()
        now = self.loop.time()
        self.end = (start if start is not None else now) + deadlines.request_s
        self.heard = now  # the upstream's last byte (or the request's sending)
        self.first = True  # no body byte heard yet
        self.progress: WriteProgress | None = None

    def silent_s(self) -> float:
        return self.loop.time() - self.heard

    def sent(self) -> None:
        """The request is being sent now: its upstream's silence counts from here."""
        self.heard = self.loop.time()
        self.first = True

    def _limit(self, what: str, limit_s: float) -> tuple[str, float]:
        """(which deadline comes first, seconds left to it) for a wait on the upstream."""
        left = self.heard + limit_s - self.loop.time()
        total = self.end - self.loop.time()
        if total <= left:
            return "request", total
        return what, left

    async def answer(self, step: Awaitable[T], stream: bool) -> T:
        """``step`` (sending the request and reading its answer's headers, or reading a
        whole non-streamed body) within its deadline: a stream's first byte, else the
        request's; ``ClientGone`` as soon as the client leaves."""
        task = asyncio.ensure_future(step)
        try:
            while True:
                if stream:
                    name, left = self._limit("first_byte", self.d.first_byte_s)
                else:
                    name, left = "request", self._total()
                if left <= 0:
                    raise UpstreamStalled(name, self._length(name))
                done, _ = await asyncio.wait((task,), timeout=min(left, CLIENT_CHECK_S))
                if done:
                    return task.result()
                if client_gone(self.request):
                    raise ClientGone(self.silent_s())
        finally:
            if not task.done():
                task.cancel()
                task.add_done_callback(_consume)

    async def chunk(self, content: StreamReader) -> bytes:
        """The next body bytes of a stream (b"" at its end) within the idle deadline (the
        first-byte deadline before any came); ``ClientGone`` as soon as the client leaves."""
        what, limit = ("first_byte", self.d.first_byte_s) if self.first else ("idle", self.d.idle_s)
        while True:
            name, left = self._limit(what, limit)
            if left <= 0:
                raise UpstreamStalled(name, self._length(name))
            # A cancelled readany() loses nothing: its bytes stay in the reader's buffer.
            timer = asyncio.timeout(min(left, CLIENT_CHECK_S))
            try:
                async with timer:
                    data = await content.readany()
            except TimeoutError:
                if not timer.expired():
                    raise  # the session's own read timeout: a broken upstream
                if client_gone(self.request):
                    raise ClientGone(self.silent_s()) from None
                continue
            self.heard = self.loop.time()
            self.first = False
            return data

    async def to_client(self, step: Awaitable[object], size: int = 0) -> None:
        """One write (of ``size`` bytes) to the client: ``ClientStalled`` when it stays
        blocked past the write deadline or the client took nothing for that long,
        ``ClientGone`` when aiohttp says the client hung up."""
        timer = asyncio.timeout(self.d.client_write_s)
        try:
            async with timer:
                await step
        except TimeoutError:
            if timer.expired():
                raise ClientStalled from None
            raise
        except (ConnectionError, RuntimeError):
            raise ClientGone(self.silent_s()) from None
        if self.progress is None:
            self.progress = WriteProgress(self.request.transport, self.d.client_write_s)
        if self.progress.wrote(size):
            raise ClientStalled

    def _total(self) -> float:
        return self.end - self.loop.time()

    def _length(self, what: str) -> float:
        return {
            "request": self.d.request_s,
            "first_byte": self.d.first_byte_s,
            "idle": self.d.idle_s,
        }[what]
