"""Stalled readers: a hostile client that opens many streaming completions and never reads
them (#27 finding 1), and the check that the stack cut them.

Each stream is a plain socket with a small receive buffer: it sends one streaming request
with a large ``max_tokens`` and reads nothing, so the answer piles up in the server's
buffers while the request holds an engine slot. After ``hold_s`` the harness reads every
socket at once (for at most ``DRAIN_S``): a stream the stack cut ends (EOF or reset), one
it left open does not. A stack that protects its users answers the streams above its
per-client cap 429 and cuts the admitted ones; one that does not lets them fill the model
pool while every other user waits.

This module must never send to anything but the target's router URL, nor keep a socket
open past its own call.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import TypedDict
from urllib.parse import urlsplit

from gameday.evidence.slo import Slo, failed_result, not_measured, result

RCVBUF_BYTES = 4096
HEAD_BYTES = 4096
# After the hold: how long the harness reads, all sockets at once, to see which the stack
# closed (a cut stream still holds what the kernels buffered), and with what buffer.
DRAIN_S = 15.0
HEAD_WAIT_S = 2.0
DRAIN_RCVBUF_BYTES = 1024 * 1024
PROMPT = "a stalled reader asks for a very long answer and never reads it"


class StalledStreamJson(TypedDict):
    status: int
    cut: bool
    error: str | None


class StalledReadersJson(TypedDict):
    """``stalled_readers.json``: what ``stall`` sent and what the stack did with it (the
    first 100 streams listed)."""

    router: str
    hold_s: float
    sent: int
    admitted: int
    refused_429: int
    admitted_cut: int
    drain_s: float
    other: list[int]
    streams: list[StalledStreamJson]


class StalledReadersRun(StalledReadersJson):
    """``stalled_readers.json`` as ``stall_readers`` writes it (and answers): when it
    began (written first), then ``StalledReadersJson``'s keys."""

    started_at: float


@dataclass
class StalledStream:
    """One stalled stream: the status it got (0: none read) and whether the stack closed
    it (a 429 answer stays open for the next request: refused, not cut)."""

    status: int = 0
    cut: bool = False
    error: str | None = None

    def to_json(self) -> StalledStreamJson:
        return {"status": self.status, "cut": self.cut, "error": self.error}


@dataclass
class StalledReaders:
    router: str
    hold_s: float
    streams: list[StalledStream] = field(default_factory=list)

    def to_json(self) -> StalledReadersJson:
        admitted = [s for s in self.streams if s.status == 200]
        return {
            "router": self.router,
            "hold_s": self.hold_s,
            "sent": len(self.streams),
            "admitted": len(admitted),
            "refused_429": sum(1 for s in self.streams if s.status == 429),
            "admitted_cut": sum(1 for s in admitted if s.cut),
            "drain_s": DRAIN_S,
            "other": sorted({s.status for s in self.streams} - {200, 429}),
            "streams": [s.to_json() for s in self.streams[:100]],
        }


def _request(host: str, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": "default",
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _open(host: str, port: int, request: bytes) -> tuple[socket.socket | None, str | None]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.settimeout(10)
    try:
        sock.connect((host, port))
        sock.sendall(request)
    except OSError as exc:
        sock.close()
        return None, f"{type(exc).__name__}: {exc}"
    return sock, None


def _status(head: bytes) -> int:
    """The status of an HTTP answer from its first bytes (0 when there is none)."""
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _head(sock: socket.socket) -> bytes:
    """The first bytes the socket holds (its answer's status line), or b""."""
    sock.settimeout(HEAD_WAIT_S)
    try:
        return sock.recv(HEAD_BYTES)
    except OSError:
        return b""


def _drain(socks: list[socket.socket | None], drain_s: float) -> list[tuple[bytes, bool]]:
    """Read every socket at once for at most ``drain_s``: (its first bytes, whether the
    stack closed it: EOF or reset).

    A cut stream may still hold a few hundred KiB in the kernels' buffers, which the
    server's kernel resends only at its zero-window probes (backed off to tens of seconds
    after a long stall). So, once its status line is read, each socket gets a bigger
    receive buffer and sends an empty line (which HTTP lets a server ignore between
    requests): a connection the stack still holds takes it, one it closed answers with a
    reset at once."""
    out: list[tuple[bytes, bool]] = [(b"", False) for _ in socks]
    sel = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        if sock is None:
            continue
        head = _head(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, DRAIN_RCVBUF_BYTES)
        try:
            sock.sendall(b"\r\n")
        except OSError:
            out[i] = (head, True)
            continue
        out[i] = (head, False)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, i)
    end = time.monotonic() + drain_s
    while sel.get_map() and (left := end - time.monotonic()) > 0:
        for key, _ in sel.select(timeout=left):
            i = key.data
            conn = socks[i]
            assert conn is not None
            try:
                closed = not conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:  # reset: the stack closed it
                closed = True
            if closed:
                out[i] = (out[i][0], True)
                sel.unregister(conn)
    sel.close()
    return out


def stall(router_url: str, streams: int, max_tokens: int, hold_s: float) -> StalledReaders:
    """Open ``streams`` stalled streams to ``router_url``, hold them ``hold_s`` seconds
    without reading, then read what each holds (status, and whether the stack cut it)."""
    url = urlsplit(router_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    request = _request(host, max_tokens)
    out = StalledReaders(router=router_url, hold_s=hold_s)
    socks: list[socket.socket | None] = []
    try:
        for _ in range(streams):
            sock, error = _open(host, port, request)
            socks.append(sock)
            out.streams.append(StalledStream(error=error))
        time.sleep(hold_s)
        for (head, closed), rec in zip(_drain(socks, DRAIN_S), out.streams, strict=True):
            rec.status = _status(head)
            rec.cut = closed
    finally:
        for sock in socks:
            if sock is not None:
                sock.close()
    return out


def stalled_streams_cut(data: StalledReadersJson | None) -> Slo:
    """``stalled_streams_left_open``: admitted stalled streams the stack had not cut after
    the hold (from ``stalled_readers.json``); allowed 0. A stack that cuts none of them
    leaves their engine slots to a client that reads nothing."""
    check, unit = "stalled_streams_left_open", "streams"
    if data is None:
        return not_measured(check, 0, unit, "no stalled readers have run in this experiment")
    admitted = int(data.get("admitted") or 0)
    if int(data.get("sent") or 0) == 0:
        return failed_result(check, 0, unit, "no stalled stream could be opened")
    left_open = admitted - int(data.get("admitted_cut") or 0)
    return result(
        check,
        left_open,
        0,
        unit,
        left_open == 0,
        sent=data.get("sent"),
        admitted=admitted,
        refused_429=data.get("refused_429"),
        hold_s=data.get("hold_s"),
        why=None
        if left_open == 0
        else f"{left_open} of {admitted} admitted streams were still open after "
        f"{data.get('hold_s')} s of their client reading nothing: the stack never cut a "
        "stream whose client stopped reading, and their engine slots stayed taken",
    )
