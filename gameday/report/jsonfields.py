"""A report dataclass as the JSON object summary.json holds: its fields, in order.

Must never invent a key: every key is a field (or its ``rename``), so the shape of
summary.json is the dataclass's shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from canary_contract.json import JsonObject


def fields_json(
    obj: Any,
    *,
    rename: Mapping[str, str] | None = None,
    convert: Mapping[str, Callable[[Any], Any]] | None = None,
    skip: Collection[str] = (),
) -> JsonObject:
    """The fields of the dataclass ``obj`` in declaration order, as a JSON object.

    ``rename``: field -> the key it is written under; ``convert``: field -> what makes
    its value JSON (rounding, ``each_json`` for a list of records); ``skip``: fields left
    out (what only the HTML or the text shows). Other values are written as they are.
    """
    rename = rename or {}
    convert = convert or {}
    out: JsonObject = {}
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if f.name in convert:
            value = convert[f.name](value)
        out[rename.get(f.name, f.name)] = value
    return out


def each_json(items: list[Any]) -> list[JsonObject]:
    """A list of records (each with ``to_json()``) as a list of JSON objects."""
    return [item.to_json() for item in items]


def rounded(x: Any) -> float | None:
    """A finite number rounded to 6 digits, else None (summary.json's figures)."""
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return round(v, 6) if math.isfinite(v) else None


def json_safe(value: Any) -> Any:
    """JSON that any parser reads: NaN and infinities (which probe details and broker
    events may carry) become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    return str(value)


def dumps_json(doc: Any) -> str:
    """summary.json's text: indented, ``json_safe`` first."""
    return json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"
