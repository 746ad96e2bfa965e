"""``canary_contract.bounds``: each bound refuses the edge it excludes and accepts the edge
it includes, NaN never passes, ``finite`` refuses infinities, ``None`` passes, and the
message names the field (or its label), the bound and the value."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from canary_contract.bounds import bounded, check_bounds


@dataclass(frozen=True)
class Config:
    at_least: int = bounded(1, ge=1)
    share: float = bounded(0.5, ge=0, lt=1)
    above: float = bounded(1.0, gt=0)
    positive: float = bounded(1.0, gt=0, finite=True)
    at_most: float = bounded(0.0, le=60)
    below: float = bounded(0.0, lt=1)
    optional: float | None = bounded(None, gt=0)
    free: float = -1.0  # no bound

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass
class Required:
    size: int = bounded(ge=1)


class OptionError(ValueError):
    pass


def config(field: str, value: object) -> Config:
    kwargs: dict[str, Any] = {field: value}
    return Config(**kwargs)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("at_least", 1),
        ("above", 1e-12),
        ("at_most", 60),
        ("below", 0.999),
        ("share", 0.0),
        ("positive", 1e308),
        ("optional", None),
        ("optional", 0.5),
        ("above", math.inf),  # not finite=True: an infinity passes a lower bound
        ("free", math.nan),
    ],
)
def test_values_in_bounds_pass(field: str, value: float | None) -> None:
    config(field, value)  # no error


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("at_least", 0, "at_least must be >= 1, got 0"),
        ("above", 0.0, "above must be > 0, got 0.0"),
        ("at_most", 60.5, "at_most must be <= 60, got 60.5"),
        ("below", 1.0, "below must be < 1, got 1.0"),
        ("share", -0.1, "share must be >= 0 and < 1, got -0.1"),
        ("share", 1.0, "share must be >= 0 and < 1, got 1.0"),
        ("positive", math.inf, "positive must be > 0 and finite, got inf"),
        ("positive", 0.0, "positive must be > 0 and finite, got 0.0"),
        ("optional", 0.0, "optional must be > 0, got 0.0"),
        ("at_most", -math.inf, None),
    ],
)
def test_values_out_of_bounds_are_refused_by_name(
    field: str, value: float, message: str | None
) -> None:
    if message is None:  # an infinity passes an upper bound without finite=True
        config(field, value)
        return
    with pytest.raises(ValueError) as info:
        config(field, value)
    assert str(info.value) == message


@pytest.mark.parametrize("field", ["at_least", "above", "at_most", "below", "positive"])
def test_nan_never_passes_a_bound(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be .*, got nan$"):
        config(field, math.nan)


def test_a_bound_without_a_default_makes_a_required_field() -> None:
    assert Required(1).size == 1
    with pytest.raises(TypeError):
        Required()  # mypy's dataclass plugin cannot see it is required
    with pytest.raises(ValueError) as info:
        check_bounds(Required(0))
    assert str(info.value) == "size must be >= 1, got 0"


def test_the_first_field_out_of_bounds_is_named() -> None:
    with pytest.raises(ValueError) as info:
        Config(at_least=0, above=0.0)
    assert str(info.value).startswith("at_least ")


def test_the_error_class_and_the_label_are_the_callers() -> None:
    with pytest.raises(OptionError) as info:
        check_bounds(Required(0), OptionError, lambda name: "--" + name)
    assert str(info.value) == "--size must be >= 1, got 0"


def test_only_a_dataclass_can_be_checked() -> None:
    with pytest.raises(TypeError, match="needs a dataclass"):
        check_bounds(object())
