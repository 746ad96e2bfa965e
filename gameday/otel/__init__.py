"""A small OTLP/HTTP trace receiver the harness can run (``python -m gameday.otel``).

It stands where an OpenTelemetry collector would: components export their spans to it
(``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT``) and a test or a game day reads them
back (``GET /v1/spans``) or from the JSON-lines file it appends to (``--out``). See
``gameday.otel.receiver``.
"""

from gameday.otel.receiver import Span, build_app, decode_spans

__all__ = ["Span", "build_app", "decode_spans"]
