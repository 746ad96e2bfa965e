"""OpenTelemetry tracing: one tracer provider per process, exported over OTLP/HTTP when asked.

This module must never export anywhere but a loopback address, nor let a slow or dead
collector slow a request.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from canarystack.common.colour import Colour
from canarystack.common.errors import StartupError

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
TRACES_PATH = "/v1/traces"
EXPORT_TIMEOUT_S = 2.0
MAX_QUEUE_SIZE = 2048
SCHEDULE_DELAY_MS = 500
TRACER_NAME = "canarystack"

_lock = threading.Lock()
_provider: TracerProvider | None = None
_endpoint: str | None = None


class OtelConfigError(StartupError):
    """The OTLP endpoint is not usable; the message names the variable and the fix."""


def traces_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The OTLP/HTTP traces URL from the environment, or None (no export).

    Raises ``OtelConfigError`` for a URL that is not http(s) or not on loopback."""
    env = os.environ if environ is None else environ
    name, url = ENV_TRACES_ENDPOINT, (env.get(ENV_TRACES_ENDPOINT) or "").strip()
    if not url:
        name, base = ENV_ENDPOINT, (env.get(ENV_ENDPOINT) or "").strip()
        if not base:
            return None
        url = base.rstrip("/") + TRACES_PATH
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise OtelConfigError(f"{name}={url!r}: not a URL ({exc}).") from None
    if parts.scheme not in ("http", "https"):
        raise OtelConfigError(
            f"{name}={url!r}: the OTLP/HTTP exporter needs an http:// URL, e.g. "
            "http://127.0.0.1:4318."
        )
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise OtelConfigError(
            f"{name}={url!r}: spans may only go to a collector on this machine; give a "
            "loopback address (http://127.0.0.1:PORT or http://[::1]:PORT), or unset it "
            "to export nothing."
        )
    return url


def setup(
    service: str,
    *,
    environ: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> TracerProvider:
    """The process's tracer provider, made on the first call (later calls return it;
    ``create_app`` calls it), with ``service.name`` = the component's role. Spans are
    always made (the colour middleware opens one server span per request, so trace and
    span ids are real W3C ids that tie the hops together); they leave the process only
    when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (a full URL) or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL; ``/v1/traces`` is added) is set, and only
    to 127.0.0.1 or [::1] (anything else refuses the start naming the variable). Export
    runs in the SDK's batch processor thread with a bounded queue
    (``OTEL_BSP_MAX_QUEUE_SIZE``, default 2048: spans past it are dropped and counted,
    never held) and a short export timeout.

    ``exporter`` (tests: an in-memory one) replaces the OTLP exporter the environment asks
    for."""
    global _provider, _endpoint
    with _lock:
        if _provider is not None:
            return _provider
        endpoint = traces_endpoint(environ)
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        if exporter is None and endpoint is not None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
        if exporter is not None:
            provider.add_span_processor(
                BatchSpanProcessor(
                    exporter,
                    max_queue_size=MAX_QUEUE_SIZE,
                    schedule_delay_millis=SCHEDULE_DELAY_MS,
                    export_timeout_millis=int(EXPORT_TIMEOUT_S * 1000),
                )
            )
        trace.set_tracer_provider(provider)
        _provider, _endpoint = provider, endpoint
        return provider


def exporting_to() -> str | None:
    """Where this process exports spans (None: nowhere)."""
    return _endpoint


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def parent_context(colour: Colour) -> Any:
    """The OpenTelemetry context of the caller's span (the incoming ``traceparent``), or
    None when the caller sent none (the span then starts a new trace, and ``with_span``
    gives the colour its ids)."""
    if colour.parent_span_id is None:
        return None
    ctx = SpanContext(
        trace_id=int(colour.trace_id, 16),
        span_id=int(colour.parent_span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(colour.flags, 16)),
    )
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def with_span(colour: Colour, span: trace.Span) -> Colour:
    """``colour`` naming ``span`` as this hop's span (so a call made as this hop carries
    the span's id in its ``traceparent``)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return colour
    return replace(colour, trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}")


def attributes(colour: Colour) -> dict[str, str]:
    out = {"request.id": colour.request_id}
    if colour.tag is not None:
        out["traffic.tag"] = colour.tag
    return out


@contextlib.contextmanager
def client_span(colour: Colour, name: str, **attrs: str) -> Iterator[Colour]:
    """A client span for a call made as ``colour``'s hop; yields the colour to send (its
    ``headers()`` carry the client span's id)."""
    child = colour.child()
    with tracer().start_as_current_span(
        name,
        context=trace.set_span_in_context(
            NonRecordingSpan(
                SpanContext(
                    trace_id=int(colour.trace_id, 16),
                    span_id=int(colour.span_id, 16),
                    is_remote=False,
                    trace_flags=TraceFlags(int(colour.flags, 16)),
                )
            )
        ),
        kind=SpanKind.CLIENT,
        attributes={**attributes(colour), **attrs},
    ) as span:
        yield with_span(child, span)
