"""summary.json's numbers and text: figures rounded, any value made JSON every parser reads.

The shapes are the report's TypedDicts (``*Json``, each built by its record's
``to_json``, in the TypedDict's key order: ``canary_contract.json.record_json``); this
module only makes values safe.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


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
