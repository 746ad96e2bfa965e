"""The strict JSON reader and writer every component uses for bytes from the wire."""

from __future__ import annotations

import math

import pytest

from canary_contract import strictjson


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"NaN", "NaN is not a JSON number"),
        (b'{"a": Infinity}', "Infinity is not a JSON number"),
        (b"[-Infinity]", "-Infinity is not a JSON number"),
        (b"1" + b"0" * 5000, "out of range"),
        (b"1" + b"0" * 40, "an integer of 41 digits is out of range"),
        (b"-" + b"9" * 33, "an integer of 33 digits is out of range"),
        (b"1e400", "overflows a double"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b"[" * 65 + b"]" * 65, "nested deeper than 64 levels"),
        (b'"hello \\ud800"', "lone surrogate"),
        (b'{"\\udfff": 1}', "lone surrogate"),
        (b'"\xff\xfe"', "not valid UTF-8"),
        (b'{"a": ', "Expecting value"),
    ],
)
def test_refuses_what_json_would_accept_or_crash_on(raw: bytes, says: str) -> None:
    with pytest.raises(strictjson.StrictJsonError, match=says):
        strictjson.loads(raw)


def test_reads_ordinary_json_as_json_does() -> None:
    raw = b'{"a": [1, -2.5, "x\\u00e9", true, null, 99999999999999999999999999999999]}'
    assert strictjson.loads(raw) == {
        "a": [1, -2.5, "xé", True, None, 99999999999999999999999999999999]
    }
    assert strictjson.loads("[" * 64 + "]" * 64) is not None


def test_writes_no_non_finite_number() -> None:
    assert strictjson.dumps({"a": [1, 2.5]}) == '{"a":[1,2.5]}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            strictjson.dumps({"kl": bad})
