"""Reading an OpenAI-compatible SSE stream and measuring what the user felt.

Pure code: no sockets, no clock of its own, no imports of Locust or gevent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from gameday.oracle.wire import loads as wire_loads

ERROR_KINDS = ("connect", "http_status", "broken_stream", "empty_completion", "timeout")
DONE = "[DONE]"


class SSEDecoder:
    """Feed raw lines (with or without their line ending); get complete event payloads."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed_line(self, raw: bytes | str) -> str | None:
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            payload = "\n".join(self._data)
            self._data = []
            return payload
        if line.startswith(":"):  # comment / keep-alive
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        # event:, id:, retry: carry nothing the measurement needs
        return None

    def flush(self) -> str | None:
        """A payload left without its blank line (the stream ended right after it)."""
        if not self._data:
            return None
        payload = "\n".join(self._data)
        self._data = []
        return payload


def _content_of(event: Mapping[str, object]) -> str:
    parts: list[str] = []
    # Not checked here: the loop raises TypeError on a non-iterable, as it always did.
    for choice in cast("Iterable[object]", event.get("choices") or ()):
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if isinstance(text, str):
            parts.append(text)
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            parts.append(delta["content"])
    return "".join(parts)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class StreamMeasurement:
    """Measurements of one streamed response; times are on the caller's clock (seconds).

    ``SSEDecoder`` turns lines into event payloads (``data:`` lines, joined, dispatched on a
    blank line). ``StreamMeasurement`` takes each payload with the clock time it was read and
    keeps:

    - TTFT: from just before the request was sent to the first event that *carries content*
      (a completions ``choices[].text`` or a chat ``choices[].delta.content`` that is not
      empty) — not to the response headers, and not to a role-only or usage-only chunk;
    - inter-token gaps between consecutive content events (mean, p99, max);
    - prompt and completion tokens from the usage chunk (``stream_options.include_usage``);
    - whether ``data: [DONE]`` arrived: a stream that ends without it is broken, whatever
      the transport said (some clients end an interrupted body silently).

    Error kinds (the records' ``error_kind``): ``connect`` (no response), ``http_status``
    (a 4xx/5xx), ``broken_stream`` (cut or malformed mid-way), ``empty_completion`` (a clean
    stream with no content), ``timeout`` (the request outlived its deadline, or the run's
    stop timeout cut it).
    """

    t_sent: float
    content_times: list[float] = field(default_factory=list)
    events: int = 0
    done: bool = False
    malformed: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text_chars: int = 0

    def on_payload(self, payload: str, now: float) -> None:
        if self.done:
            return
        if payload.strip() == DONE:
            self.done = True
            return
        self.events += 1
        try:
            event = wire_loads(payload, keep_non_finite=True)
        except ValueError as exc:  # not JSON, nested too deep, a 5000-digit integer, ...
            self.malformed = self.malformed or f"event {self.events} is not JSON we read: {exc}"
            return
        if not isinstance(event, dict):
            self.malformed = self.malformed or f"event {self.events} is not a JSON object"
            return
        if "error" in event and not event.get("choices"):
            self.malformed = self.malformed or f"error event: {str(event['error'])[:200]}"
            return
        content = _content_of(event)
        if content:
            self.content_times.append(now)
            self.text_chars += len(content)
        usage = event.get("usage")
        if isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int):
                self.prompt_tokens = pt
            if isinstance(ct, int):
                self.completion_tokens = ct

    @property
    def ttft_s(self) -> float | None:
        return self.content_times[0] - self.t_sent if self.content_times else None

    def gaps_s(self) -> list[float]:
        t = self.content_times
        return [b - a for a, b in itertools.pairwise(t)]

    def itl(self) -> tuple[float | None, float | None, float | None]:
        """(mean, p99, max) of the inter-token gaps; None when fewer than two tokens."""
        gaps = self.gaps_s()
        if not gaps:
            return None, None, None
        return sum(gaps) / len(gaps), percentile(gaps, 99), max(gaps)

    def error_kind(self) -> tuple[str | None, str | None]:
        """(kind, detail) once the stream has ended; (None, None) when it was fine."""
        if self.malformed is not None:
            return "broken_stream", self.malformed
        if not self.done:
            return "broken_stream", "stream ended without data: [DONE]"
        if not self.content_times:
            return "empty_completion", "stream finished with no content"
        return None, None


def parse_full_response(body: bytes) -> tuple[str, int | None, int | None]:
    """(content, prompt_tokens, completion_tokens) of a non-streamed completion.

    Raises ValueError when the body is not a completion object.
    """
    try:
        obj = wire_loads(body, keep_non_finite=True)
    except ValueError as exc:
        raise ValueError(f"response body is not JSON we read: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        raise ValueError("response has no 'choices' list")
    parts: list[str] = []
    for choice in obj["choices"]:
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            parts.append(choice["text"])
        msg = choice.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            parts.append(msg["content"])
    raw_usage = obj.get("usage")
    usage: Mapping[str, object] = raw_usage if isinstance(raw_usage, dict) else {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        "".join(parts),
        pt if isinstance(pt, int) else None,
        ct if isinstance(ct, int) else None,
    )
