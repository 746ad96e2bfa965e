"""``canary_contract.json.record_json``: a record as its TypedDict, in the TypedDict's key
order, with the keys checked at run time (a type checker cannot see them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypedDict

import pytest

from canary_contract.json import record_json


class PointJson(TypedDict):
    label: str
    y_s: float
    x: int


@dataclass
class Point:
    x: int
    y: float
    label: str = "p"


def test_the_keys_are_the_typeddicts_in_its_order_values_given_or_the_records() -> None:
    doc = record_json(Point(1, 2.5), PointJson, y_s=2.5)
    assert json.dumps(doc) == '{"label": "p", "y_s": 2.5, "x": 1}'


def test_a_key_the_typeddict_lacks_is_refused() -> None:
    with pytest.raises(TypeError, match="no key"):
        record_json(Point(1, 2.5), PointJson, y_s=2.5, z=3)


def test_a_key_neither_given_nor_on_the_record_is_refused() -> None:
    with pytest.raises(AttributeError):
        record_json(Point(1, 2.5), PointJson)
