"""JSON-lines logging on stderr: one object per line, with ``ts``, ``level``,
``component``, ``event`` and any extra fields (``get_logger(component).info("event",
key=value)``).

This module must never write a line a strict JSON reader cannot read.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "component": getattr(record, "component", record.name),
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            payload.update(fields)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        try:
            line = json.dumps(payload, default=str, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a non-finite float (or a circular value)
            line = ""
        if not line or "\\ud" in line:
            line = json.dumps(_clean(payload), default=str, separators=(",", ":"))
        return line


def _clean(value: Any, depth: int = 0) -> Any:
    """``value`` with non-finite floats as strings and lone surrogates escaped."""
    if depth > 32:
        return repr(value)[:200]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_clean(str(k), depth + 1): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, depth + 1) for v in value]
    return value


class JsonLogger:
    """A thin wrapper that turns keyword arguments into JSON fields. Every line is strict
    JSON whatever the fields hold: a non-finite float is written as its name in a string
    (``"nan"``, ``"inf"``) and text that is not valid Unicode (an undecodable header
    arrives with lone surrogates) has those characters backslash-escaped."""

    def __init__(self, component: str, logger: logging.Logger) -> None:
        self.component = component
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(
                level,
                event,
                exc_info=exc_info,
                extra={"component": self.component, "fields": fields},
            )

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info=exc_info, **fields)


_configured = False


def configure(level: str = "info") -> None:
    """Install the JSON handler on the root logger (once per process)."""
    global _configured
    root = logging.getLogger()
    root.setLevel(level.upper())
    if _configured:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    root.handlers[:] = [handler]
    # aiohttp's access log is per request; it costs CPU on the hot path.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    _configured = True


def get_logger(component: str) -> JsonLogger:
    return JsonLogger(component, logging.getLogger(f"canarystack.{component}"))


def now() -> float:
    """Wall-clock seconds since the epoch (for timestamps a person reads)."""
    return time.time()
