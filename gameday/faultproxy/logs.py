"""JSON lines on stderr: one object per event (``{"ts", "level", "component", "event",
...fields}``), what every component of the stack writes.

This module must never raise on a field it cannot write (it is written as text).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

COMPONENT = "fault-proxy"


class JsonLog:
    def __init__(self, stream: TextIO | None = None, component: str = COMPONENT) -> None:
        self._stream = stream
        self.component = component

    def _write(self, level: str, event: str, fields: dict[str, Any]) -> None:
        line = {
            "ts": round(time.time(), 6),
            "level": level,
            "component": self.component,
            "event": event,
            **fields,
        }
        out = self._stream or sys.stderr
        out.write(json.dumps(line, default=str) + "\n")
        out.flush()

    def info(self, event: str, **fields: Any) -> None:
        self._write("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._write("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._write("error", event, fields)
