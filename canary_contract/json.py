"""JSON as it crosses the wire: the one spelling of "a decoded JSON object" in the project."""

from __future__ import annotations

from typing import Any, TypeAlias, TypeVar, cast

# A decoded JSON object whose shape the caller checks itself (a pydantic model or the
# typed records of this package are preferred wherever a shape is fixed).
JsonObject: TypeAlias = dict[str, Any]
# Any decoded JSON value.
JsonValue: TypeAlias = Any
# A TypedDict that ``record_json`` builds.
_Shape = TypeVar("_Shape")


def record_json(record: object, shape: type[_Shape], **values: object) -> _Shape:
    """``record`` as the JSON object ``shape`` (a TypedDict whose keys are all required):
    ``shape``'s keys in the order it declares them, each the value given in ``values``,
    else ``record``'s attribute of that name.

    For a record whose ``to_json`` is its TypedDict filled key by key from its fields,
    only some of them renamed or computed. A type checker cannot see the keys here, so
    they are checked on every call: a key of ``values`` that ``shape`` lacks is a
    TypeError, a key neither ``values`` nor ``record`` has an AttributeError."""
    keys = list(shape.__annotations__)
    unknown = [k for k in values if k not in keys]
    if unknown:
        raise TypeError(f"{shape.__name__} has no key(s) {unknown}")
    return cast(_Shape, {k: values[k] if k in values else getattr(record, k) for k in keys})
