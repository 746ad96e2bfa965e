"""The JSON objects of a JSON-lines file the run wrote (the probes' own records: coloured
requests sent, dependency watch ticks), read the same way wherever they are read.

A line that is not one strict JSON object (blank, torn by a kill mid-write, not UTF-8,
``NaN``) is passed over: the rest of the file still counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from gameday.oracle.wire import loads


def json_objects(raw: bytes) -> list[Mapping[str, object]]:
    """The lines of ``raw`` (a file's bytes) that are JSON objects, parsed strictly, in
    file order."""
    out: list[Mapping[str, object]] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            value = loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out
