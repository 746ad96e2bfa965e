"""An OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf), spans kept in memory."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypedDict

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from canary_contract.json import record_json

MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_SPANS = 100_000
PROTOBUF = "application/x-protobuf"
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class SpanJson(TypedDict):
    """A ``Span`` as ``GET /v1/spans`` answers it and the spans file holds it."""

    service: str | None
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, object]


@dataclass(frozen=True)
class Span:
    service: str | None
    name: str
    kind: int  # 1 internal, 2 server, 3 client (OTLP's SpanKind)
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, object]  # the span's own, as OTLP's AnyValues decode

    def as_json(self) -> SpanJson:
        return record_json(self, SpanJson)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def decode_spans(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``; ValueError if ``body`` is not one."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    spans: list[Span] = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    Span(
                        service=str(service) if service is not None else None,
                        name=s.name,
                        kind=int(s.kind),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() or None,
                        start_ns=int(s.start_time_unix_nano),
                        end_ns=int(s.end_time_unix_nano),
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                    )
                )
    return spans


class Store:
    """The spans received, bounded; optionally appended to a JSON-lines file.

    At most ``max_spans`` are kept (the oldest go first; ``dropped`` counts them). With
    ``--out FILE`` each span is also appended to FILE as one JSON line. It listens on loopback
    only. This module never imports ``canarystack``.
    """

    def __init__(self, max_spans: int = DEFAULT_MAX_SPANS, out: TextIO | None = None) -> None:
        self.spans: deque[Span] = deque(maxlen=max_spans)
        self.received = 0
        self.out = out

    @property
    def dropped(self) -> int:
        return self.received - len(self.spans)

    def add(self, spans: list[Span]) -> None:
        self.received += len(spans)
        self.spans.extend(spans)
        if self.out is not None:
            for span in spans:
                self.out.write(json.dumps(span.as_json(), sort_keys=True) + "\n")
            self.out.flush()


STORE: web.AppKey[Store] = web.AppKey("store", Store)


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param}}
    return web.json_response(body, status=status)


async def _traces(request: web.Request) -> web.Response:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return _error(413, f"The body is {request.content_length} bytes: at most {MAX_BODY_BYTES}.")
    ctype = request.content_type
    if ctype != PROTOBUF:
        return _error(
            415,
            f"Content-Type is {ctype!r}: this receiver takes OTLP/HTTP protobuf "
            f"({PROTOBUF}); set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf.",
        )
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "deflate"):
        return _error(415, f"Content-Encoding {encoding!r} is not supported: use gzip or none.")
    # aiohttp inflates gzip and deflate bodies itself, within client_max_size.
    body = await request.read()
    try:
        spans = decode_spans(body)
    except ValueError as exc:
        return _error(400, str(exc))
    request.app[STORE].add(spans)
    return web.Response(
        body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF
    )


async def _spans(request: web.Request) -> web.Response:
    store = request.app[STORE]
    trace_id = request.query.get("trace_id")
    if trace_id is not None and not _HEX32.match(trace_id):
        return _error(
            400, f"trace_id {trace_id[:40]!r}: give 32 lower-case hex digits.", "trace_id"
        )
    spans = [s for s in store.spans if trace_id is None or s.trace_id == trace_id]
    return web.json_response(
        {
            "spans": [s.as_json() for s in spans],
            "received": store.received,
            "dropped": store.dropped,
        }
    )


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "component": "otel-receiver"})


def build_app(store: Store | None = None) -> web.Application:
    """The receiver's routes:

    - ``POST /v1/traces``: an ``ExportTraceServiceRequest`` (``application/x-protobuf``,
      optionally gzip- or deflate-encoded), as the OpenTelemetry SDK's OTLP/HTTP exporter
      sends it; answers an empty ``ExportTraceServiceResponse``. A body that is not one is
      400 with a message; a body over ``MAX_BODY_BYTES`` is 413.
    - ``GET /v1/spans``: every span kept, oldest first, as JSON (``Span.as_json``);
      ``?trace_id=`` keeps one trace.
    - ``GET /health``.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STORE] = store or Store()
    app.router.add_post("/v1/traces", _traces)
    app.router.add_get("/v1/spans", _spans)
    app.router.add_get("/health", _health)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gameday.otel", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "::1"])
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--ready-file", help="write {'port': N} here once listening")
    parser.add_argument("--out", help="append every span to this file (JSON lines)")
    parser.add_argument("--max-spans", type=int, default=DEFAULT_MAX_SPANS)
    args = parser.parse_args(argv)
    if args.max_spans < 1:
        parser.error(f"--max-spans is {args.max_spans}: give at least 1.")
    out = open(args.out, "a", encoding="utf-8") if args.out else None  # noqa: SIM115
    app = build_app(Store(args.max_spans, out))

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = args.port
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            port = int(sockets[0].getsockname()[1])
        if args.ready_file:
            Path(args.ready_file).write_text(json.dumps({"port": port}))
        print(json.dumps({"event": "listening", "host": args.host, "port": port}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            if out is not None:
                out.close()

    asyncio.run(serve())
    return 0
