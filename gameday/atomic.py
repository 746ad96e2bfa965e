"""Files of a run replaced whole: a reader (the report, a probe, a second run) sees the old
file or the new one, never half of one. Every writer of the run folder goes through here.

Not durable against a power cut (no fsync): the load records, which are, have their own
writer (``gameday.load.records``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_whole(path: Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` to a temporary name beside ``path`` (same suffix, so writers that go
    by it, e.g. matplotlib, still know the format), then rename it over ``path``. The
    temporary file is gone afterwards, also when ``write`` fails; the parent folder is
    made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def write_text(path: Path, text: str) -> Path:
    """``text`` (UTF-8) as ``path``, replaced whole."""
    return replace_whole(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, doc: Any) -> Path:
    """``doc`` as indented JSON (anything else as its ``str``), replaced whole."""
    return write_text(path, json.dumps(doc, indent=2, default=str) + "\n")
