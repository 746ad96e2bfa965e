"""JSON as it crosses the wire: the one spelling of "a decoded JSON object" in the project."""

from __future__ import annotations

from typing import Any, TypeAlias

# A decoded JSON object whose shape the caller checks itself (a pydantic model or the
# typed records of this package are preferred wherever a shape is fixed).
JsonObject: TypeAlias = dict[str, Any]
# Any decoded JSON value.
JsonValue: TypeAlias = Any
