"""``gameday.hostile_pins``: pins sent to the canary after a trip, against a faked
``StackApi`` (the live game day: experiments/hostile/).

- every pin's answer is recorded, one the router could not be reached for as its cause;
- the canary's request counter is read once nothing is in flight there, before and after;
- a canary counter that is not a number is a PinError naming the canary.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from gameday import hostile
from gameday import hostile_pins as pins
from gameday.api import ApiError


@dataclass
class Rep:
    url: str


@dataclass
class FakeApi:
    metrics: list[str]
    statuses: list[int | None]
    sent: list[Any] = field(default_factory=list)

    @property
    def target(self) -> FakeApi:
        return self

    def replicas(self, role: str) -> list[Rep]:
        assert role == "model-canary"
        return [Rep("http://canary-0")]

    def metrics_text(self, url: str) -> str:
        return self.metrics.pop(0) if len(self.metrics) > 1 else self.metrics[0]

    def completion(self, body: Any, headers: dict[str, str]) -> requests.Response:
        self.sent.append((body, headers))
        status = self.statuses.pop(0)
        if status is None:
            raise ApiError("cannot reach the router", "http://router", cause="ConnectTimeout")
        resp = requests.Response()
        resp.status_code = status
        resp._content = json.dumps({"choices": []}).encode()
        resp.headers["x-served-by"] = "baseline"
        return resp


def counters(running: float, done: float) -> str:
    return (
        f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
        f"vllm:e2e_request_latency_seconds_count {done}\n"
    )


def test_each_pin_is_recorded_and_the_counter_read_once_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pins, "LAND_S", 0.0)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    # in flight at first (drained on the next read), then the counters before and after
    api = FakeApi([counters(1, 5), counters(0, 5), counters(0, 5), counters(0, 5)],
                  [200, None, 503])  # fmt: skip
    out = pins.pins_after_trip(api, 3)  # type: ignore[arg-type]
    assert out["sent"] == 3 and len(out["answers"]) == 3
    assert out["answers"][1] == {"status": None, "error": "ConnectTimeout"}
    assert out["canary_requests_before"] == out["canary_requests_after"] == 5.0
    body, headers = api.sent[0]
    assert headers == {hostile.PIN_HEADER: "canary"} and body["prompt"] == "pinned 0"


def test_a_counter_that_is_no_number_names_the_canary() -> None:
    api = FakeApi(["vllm:num_requests_running lots\n"], [])
    with pytest.raises(pins.PinError, match=r"^the canary's the /metrics line"):
        pins.pins_after_trip(api, 1)  # type: ignore[arg-type]
