"""The base of every record: frozen, read with ``from_wire``, written with ``to_wire``."""

from __future__ import annotations

import enum
from typing import Annotated, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictInt, ValidationError

from canary_contract.errors import ContractError
from canary_contract.json import JsonObject, JsonValue

# Scalar types as the wire carries them: no coercion ("5" is not 5, true is not 1), every
# float finite. A float field takes a JSON integer (5 is 5.0).
Int = StrictInt
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]
# Integers and numbers the broker writes back as it read them (a weight of 5 stays 5).
IntOrNumber = StrictInt | Number


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in item or item in {"int", "float", "str", "bool", "none"}:
            continue  # pydantic's union and type tags, not fields
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


class Record(BaseModel):
    """Unknown fields are ignored (a sender may add fields before a reader knows them);
    every field a record names is checked."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # Top-level fields the sender leaves out while they are null (``to_wire`` does too).
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_wire(cls, obj: object) -> Self:
        """``obj`` (decoded JSON) as this record, or ``ContractError`` naming the field."""
        if not isinstance(obj, dict):
            raise ContractError(
                cls.__name__, "", f"expected a JSON object, got {type(obj).__name__}"
            )
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            first = exc.errors()[0]
            problem = first.get("msg", "invalid value")
            if "input" in first and first.get("type") != "missing":
                problem += f" (got {first['input']!r:.80})"
            raise ContractError(
                cls.__name__, _where(tuple(first.get("loc", ()))), problem
            ) from None

    def to_wire(self) -> JsonObject:
        """This record as the JSON object its sender writes (nested records likewise)."""
        out: JsonObject = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None and name in self.omitted_when_none:
                continue
            out[name] = _wire(value)
        return out


def _wire(value: object) -> JsonValue:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value
