"""``gameday.evidence.checks``' pin evidence: what answered each request pinned to the
canary after a trip (``pin_answer``, a row ``probes.hostile.pin_canary_after_trip``
writes) and the SLO over those rows (``pinned_requests_on_tripped_canary``)."""

from __future__ import annotations

from typing import Any

import pytest

from gameday.evidence.checks import PinsAfterTrip, pin_answer, pinned_requests_on_tripped_canary

REFUSED: dict[str, Any] = {"error": {"code": "canary_off", "message": "the canary is off"}}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (REFUSED, "canary_off"),
        ({"error": None}, None),
        ({"error": "a string"}, None),
        ({"choices": []}, None),
        (["not", "an", "object"], None),
        (None, None),  # no JSON at all
    ],
)
def test_an_answers_error_code_is_read_when_it_has_one(body: object, code: str | None) -> None:
    assert pin_answer(409, body, "router") == {"status": 409, "served_by": "router", "code": code}


def test_every_pin_must_be_refused_and_none_reach_the_canary() -> None:
    refused = [pin_answer(409, REFUSED, None) for _ in range(3)]
    doc: PinsAfterTrip = {
        "sent": 3, "answers": [*refused], "canary_requests_before": 5, "canary_requests_after": 5
    }  # fmt: skip
    ok = pinned_requests_on_tripped_canary(doc)
    assert ok["ok"] is True and ok["measured"] == 0
    served = [*doc["answers"], pin_answer(200, {"choices": []}, "canary")]
    bad = pinned_requests_on_tripped_canary({**doc, "answers": served})
    assert bad["ok"] is False and bad["measured"] == 1
    moved = pinned_requests_on_tripped_canary({**doc, "canary_requests_after": 7})
    assert moved["ok"] is False and moved["measured"] == 2
    assert pinned_requests_on_tripped_canary(None)["detail"]["status"] == "not_measured"
