"""A small OpenAI-compatible HTTP client for gevent, built to measure streams honestly.

Never used outside a gevent-patched process (Locust's); it does not fire Locust events.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict
from urllib.parse import urlsplit

import gevent
from geventhttpclient import HTTPClient

from gameday.load.sse import SSEDecoder, StreamMeasurement, parse_full_response
from gameday.oracle.wire import loads as wire_loads

CONNECT_TIMEOUT_S = 10.0
# The tag every load request carries (x-traffic-tag), so colouring fidelity is judged on the
# whole load, not only on the probe's own requests.
TRAFFIC_TAG = "gameday"
MAX_ERROR_BODY_BYTES = 64 * 1024

# headers a router adds (docs/ARCHITECTURE.md §3); the model server adds the version
ROUTING_HEADERS = ("x-served-by", "x-model-version", "x-config-revision", "x-router-id")


class StreamOptions(TypedDict):
    include_usage: bool


class CompletionBody(TypedDict):
    """A request the load sends (``rows.build_body``, the oracle's ``_body``): OpenAI's
    completions or chat completions body, with only the fields the load sets."""

    model: str
    max_tokens: int
    stream: bool
    prompt: NotRequired[str]
    messages: NotRequired[list[Mapping[str, Any]]]
    stream_options: NotRequired[StreamOptions]
    temperature: NotRequired[float]
    seed: NotRequired[int]
    user: NotRequired[str]
    logprobs: NotRequired[bool | int]  # chat: a flag; completions: how many
    top_logprobs: NotRequired[int]


@dataclass
class Attempt:
    """One request and what was measured about it (times from ``time.perf_counter``).

    ``Attempt`` is filled in step by step, so that when the user's greenlet is killed (the
    run's stop timeout) the caller still holds what was measured so far and records it.
    """

    request_id: str
    path: str
    stream: bool
    start_time: float = 0.0  # epoch seconds, just before sending
    t_sent: float = 0.0
    t_end: float | None = None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    measurement: StreamMeasurement | None = None
    body_json: Any = None  # non-streamed responses
    error_kind: str | None = None
    error_detail: str | None = None
    error_code: str | None = None  # the server's ``error.code`` of a 4xx/5xx answer
    body_received: bool = False  # a non-streamed 2xx body arrived whole (maybe garbage)
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return self.t_end is not None and self.error_kind is None

    @property
    def e2e_s(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_sent

    @property
    def ttft_s(self) -> float | None:
        if self.measurement is None:
            return None
        return self.measurement.ttft_s

    def fail(self, kind: str, detail: str) -> None:
        if self.error_kind is None:
            self.error_kind, self.error_detail = kind, detail
        if self.t_end is None:
            self.t_end = time.perf_counter()


def _error_message(body: bytes) -> str:
    try:
        obj = wire_loads(body)
        msg = obj["error"]["message"] if isinstance(obj.get("error"), dict) else obj.get("error")
        return str(msg)[:300]
    except Exception:
        return body[:300].decode("utf-8", errors="replace")


def error_code(body: bytes) -> str | None:
    """``error.code`` of an error body (``{"error": {"code": ...}}``), if it has one."""
    try:
        obj = wire_loads(body)
    except ValueError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


class OpenAIClient:
    """One keep-alive connection to one server (one per Locust user).

    It talks through geventhttpclient directly rather than through Locust's HttpSession or
    FastHttpSession, because those fire their own request events with the time to the
    response headers (the wrong number for a stream) and their ``iter_content(n)`` waits for
    n bytes before returning. ``HTTPSocketResponse.readline`` returns as soon as one line has
    arrived (its socket ``recv`` hands over whatever is there), so each SSE line is timed
    when it reaches the process.
    """

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        traffic_tag: str | None = TRAFFIC_TAG,
        variant_header: str = "x-served-by",
        variant_values: dict[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        # How the router names the variant that served: read into x-served-by, mapped.
        self.variant_header = variant_header
        self.variant_values = dict(variant_values or {})
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.traffic_tag = traffic_tag
        self._http = HTTPClient.from_url(
            base_url,
            concurrency=1,
            connection_timeout=connect_timeout_s,
            network_timeout=timeout_s,
            headers={"User-Agent": "gameday-load"},
        )

    def close(self) -> None:
        self._http.close()

    def new_attempt(self, path: str, stream: bool, request_id: str | None = None) -> Attempt:
        return Attempt(request_id=request_id or uuid.uuid4().hex, path=path, stream=stream)

    def send(
        self,
        attempt: Attempt,
        body: Mapping[str, object],
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send ``body`` (a ``CompletionBody``; any JSON object, only serialised) and fill
        ``attempt``; never raises for network or server trouble."""
        payload = json.dumps(body, allow_nan=False).encode()
        # Coloured as a traced client would: a trace of its own per request and the game
        # day's traffic tag, which every hop of the stack must carry (#16; probes.colouring).
        colour = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
        if self.traffic_tag:
            colour["x-traffic-tag"] = self.traffic_tag
        all_headers = {
            **colour,
            **self.headers,
            **(headers or {}),
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if attempt.stream else "application/json",
            "x-request-id": attempt.request_id,
        }
        timer = gevent.Timeout(self.timeout_s)
        timer.start()
        try:
            self._send(attempt, payload, all_headers)
        except gevent.Timeout as t:
            if t is not timer:
                raise
            attempt.fail("timeout", f"no complete response within {self.timeout_s:g} s")
        finally:
            timer.close()

    def _send(self, attempt: Attempt, payload: bytes, headers: dict[str, str]) -> None:
        attempt.start_time = time.time()
        attempt.t_sent = time.perf_counter()
        try:
            resp = self._http.request(
                "POST", self.prefix + attempt.path, body=payload, headers=headers
            )
        except OSError as exc:
            attempt.fail("connect", f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # geventhttpclient's parse/closed errors before a response
            attempt.fail("connect", f"{type(exc).__name__}: {exc}")
            return
        try:
            attempt.status = resp.status_code
            for name in ROUTING_HEADERS:
                value = resp.get(name)  # case-insensitive; a list if repeated
                if isinstance(value, list):
                    value = value[0] if value else None
                if value is not None:
                    attempt.headers[name] = str(value)
            if self.variant_header != "x-served-by" or self.variant_values:
                raw = resp.get(self.variant_header)
                raw = (raw[0] if raw else None) if isinstance(raw, list) else raw
                if raw is not None:
                    attempt.headers["x-served-by"] = self.variant_values.get(str(raw), str(raw))
                else:
                    attempt.headers.pop("x-served-by", None)
            if attempt.status >= 400:
                body = resp.read(MAX_ERROR_BODY_BYTES)
                attempt.error_code = error_code(body)
                attempt.fail("http_status", f"HTTP {attempt.status}: {_error_message(body)}")
                return
            if attempt.stream:
                self._read_stream(attempt, resp)
            else:
                self._read_body(attempt, resp)
        finally:
            resp.release()

    def _read_stream(self, attempt: Attempt, resp: Any) -> None:
        m = attempt.measurement = StreamMeasurement(t_sent=attempt.t_sent)
        decoder = SSEDecoder()
        try:
            while not m.done:
                line = resp.readline(b"\n")
                now = time.perf_counter()
                if not line:
                    tail = decoder.flush()
                    if tail is not None:
                        m.on_payload(tail, now)
                    break
                attempt.bytes_read += len(line)
                payload = decoder.feed_line(line)
                if payload is not None:
                    m.on_payload(payload, now)
            if m.done and not resp.message_complete:
                resp.read()  # the end of the chunked body, so the connection can be reused
        except OSError as exc:
            attempt.fail("broken_stream", f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # HTTPParseError: "Incomplete response" when the peer cut
            if type(exc).__name__ not in ("HTTPParseError", "HTTPConnectionClosed"):
                raise
            attempt.fail("broken_stream", f"{type(exc).__name__}: {exc}")
            return
        attempt.t_end = time.perf_counter()
        kind, detail = m.error_kind()
        if kind is not None:
            attempt.fail(kind, detail or kind)

    def _read_body(self, attempt: Attempt, resp: Any) -> None:
        try:
            body = resp.read()
        except OSError as exc:
            attempt.fail("broken_stream", f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:
            if type(exc).__name__ not in ("HTTPParseError", "HTTPConnectionClosed"):
                raise
            attempt.fail("broken_stream", f"{type(exc).__name__}: {exc}")
            return
        now = time.perf_counter()
        attempt.bytes_read = len(body)
        attempt.t_end = now
        attempt.body_received = True
        try:
            # NaN/Infinity kept as floats: the oracle judges a canary that sends them;
            # read first, so a body nested too deep is refused before anything recurses
            attempt.body_json = wire_loads(body, keep_non_finite=True)
            content, pt, ct = parse_full_response(body)
        except ValueError as exc:
            attempt.fail("broken_stream", str(exc))
            return
        m = attempt.measurement = StreamMeasurement(t_sent=attempt.t_sent)
        m.done = True
        m.prompt_tokens, m.completion_tokens = pt, ct
        if content:
            m.content_times.append(now)  # a whole body: first content = end
        else:
            attempt.fail("empty_completion", "response has no content")
