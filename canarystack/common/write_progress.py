"""Whether a client still takes what a server writes to it (#27 finding 1), and
backpressure when it does not.

A write deadline alone does not see a client that stopped reading: the kernel's send
buffer autotunes up to 4 MiB on Linux, so a never-read stream of tokens is absorbed for
tens of seconds before a write blocks, while the request holds an engine slot and the
engine keeps generating for nobody. So a stream's send buffer is bounded
(``SEND_BUFFER_BYTES``: a write then blocks within a few hundred KiB, and the generation
behind it waits), and the server also watches progress: the bytes written minus those
still waiting for the client (the transport's buffer plus the kernel's send queue,
``SIOCOUTQ``) are the bytes it took; when that has not grown for the write deadline while
bytes wait, the client stopped reading. A slow client that reads at all keeps making
progress and is never cut.

This module must never block or do I/O but the one ``ioctl`` that reads the send queue;
where that is not available (not Linux), ``stalled`` says False and only the blocked-write
deadline acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
import time
from collections.abc import Callable

# TIOCOUTQ is SIOCOUTQ on Linux: a TCP socket's bytes not yet acknowledged by the peer.
_OUTQ = getattr(termios, "TIOCOUTQ", None)
# A stream's kernel send buffer (Linux doubles it): token streams run at tens of KiB/s,
# and 128 KiB per round trip carries over 1 MiB/s at 100 ms, so no reader is slowed.
SEND_BUFFER_BYTES = 64 * 1024


def _fd_of(transport: asyncio.BaseTransport | None) -> int | None:
    if transport is None or _OUTQ is None:
        return None
    sock = transport.get_extra_info("socket")
    try:
        return int(sock.fileno()) if sock is not None else None
    except (OSError, ValueError):
        return None


class WriteProgress:
    """Bytes written to one client and when it last took some (module docstring)."""

    def __init__(
        self,
        transport: asyncio.WriteTransport | None,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.fd = _fd_of(transport)
        if transport is not None:
            sock = transport.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self.timeout_s = timeout_s
        self.clock = clock
        self.written = 0
        self.taken = 0
        self.since = clock()

    def _waiting(self) -> int | None:
        """Bytes written that the client has not taken yet, or None when unknown."""
        if self.fd is None or self.transport is None or self.transport.is_closing():
            return None
        try:
            raw = fcntl.ioctl(self.fd, _OUTQ, b"\0\0\0\0")  # type: ignore[arg-type]
        except OSError:
            return None
        queued: int = struct.unpack("i", raw)[0]
        return int(self.transport.get_write_buffer_size()) + queued

    def wrote(self, n: int) -> bool:
        """``n`` more bytes were written; True when the client has taken none of what waits
        for it for ``timeout_s`` (it stopped reading)."""
        self.written += n
        waiting = self._waiting()
        if waiting is None:
            return False
        taken = self.written - waiting
        now = self.clock()
        if waiting == 0 or taken > self.taken:
            self.taken = max(self.taken, taken)
            self.since = now
            return False
        return now - self.since >= self.timeout_s
