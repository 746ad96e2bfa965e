"""Splitting a relayed SSE stream into whole events, for the faults that act per event
(latency between events, truncation, a kernel fault rewriting each event's JSON).

A stream no fault acts on is never split: it is relayed chunk by chunk as it comes.
This module must never reorder, drop or merge events; it only cuts at their boundaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_BOUNDARY = re.compile(rb"\r?\n\r?\n")
DONE = b"data: [DONE]"


class EventSplitter:
    """Feed bytes as they come; get back the whole events they complete (each with its
    blank-line terminator), the rest kept for the next feed."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        events: list[bytes] = []
        start = 0
        for m in _BOUNDARY.finditer(self._buf):
            events.append(self._buf[start : m.end()])
            start = m.end()
        self._buf = self._buf[start:]
        return events

    def rest(self) -> bytes:
        """What is left unterminated when the stream ends."""
        rest, self._buf = self._buf, b""
        return rest


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object of a single-line ``data: {...}`` event, else None (comments,
    ``[DONE]``, anything else: relayed as is). NaN/Infinity are read as floats."""
    line = event.strip()
    if not line.startswith(b"data:") or b"\n" in line:
        return None
    payload = line[5:].strip()
    if not payload.startswith(b"{"):
        return None
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def is_done(event: bytes) -> bool:
    return event.strip() == DONE


def dumps(obj: Any) -> bytes:
    """Compact JSON as engines write it; a broken kernel's NaN/-Infinity written bare, as
    Python's ``json`` (and so vLLM) writes them."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()


def data_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def rewrite(event: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``event`` with its JSON changed in place by ``change``; other events unchanged."""
    obj = event_json(event)
    if obj is None:
        return event
    change(obj)
    return data_event(obj)
