"""Whether an upstream's 2xx answer is an error in an OpenAI-shaped body: ``{"error":
{...}}`` sent whole, or an SSE event ``data: {"error": {...}}`` in a stream. vLLM and the
OpenAI API both send a stream's late failure that way, after the 200 went out, so the
status alone would count it as a success.

The check is cheap on the hot path: JSON is parsed only when the bytes hold ``"error"``
(quotes included, so text that merely mentions the word does not count: JSON escapes the
quotes inside a string), and only the event that holds it.

This module must never do I/O, change the bytes the user gets, or keep more than one
incomplete event of a stream (at most ``MAX_EVENT_BYTES``).
"""

from __future__ import annotations

import json
import re

# The outcome's error kind (and the router_upstream_errors_total kind) of such an answer.
ERROR_BODY = "error_body"
# An SSE event longer than this without its blank line is not kept whole: real events are
# one token or one error (a few hundred bytes), so this only bounds a hostile upstream.
MAX_EVENT_BYTES = 256 * 1024

_MARK = b'"error"'
_EVENT_END = re.compile(rb"\r?\n\r?\n")


def is_error_object(data: bytes) -> bool:
    """Whether ``data`` is a JSON object with a non-null top-level ``error``."""
    if _MARK not in data:
        return False
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("error") is not None


def is_error_event(event: bytes) -> bool:
    """Whether one SSE event (its lines, without the blank line) carries an error object."""
    if _MARK not in event:
        return False
    data = b"\n".join(
        line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
    )
    return is_error_object(data)


class ErrorEvents:
    """Watches a stream's raw chunks, in order, for an error event (``found``). Events may
    arrive split across chunks; only the bytes after the last complete event are kept."""

    def __init__(self) -> None:
        self.found = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.found:
            return
        buf = self._partial + chunk if self._partial else chunk
        ends = list(_EVENT_END.finditer(buf))
        if not ends:
            self._partial = buf if len(buf) <= MAX_EVENT_BYTES else b""
            return
        last = ends[-1]
        done, self._partial = buf[: last.start()], buf[last.end() :]
        if len(self._partial) > MAX_EVENT_BYTES:
            self._partial = b""
        if _MARK in done:
            self.found = any(is_error_event(event) for event in _EVENT_END.split(done))

    def finish(self) -> bool:
        """The stream ended: checks a last event sent without its blank line; ``found``."""
        if not self.found and self._partial:
            self.found = is_error_event(self._partial)
        self._partial = b""
        return self.found
