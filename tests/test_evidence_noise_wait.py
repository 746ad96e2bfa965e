"""``gameday.evidence.noise_floor.wait_record``: what ``probes.gate.wait_for_noise_floor``
writes, read back by the verdict's ``noise_wait_reasons``."""

from __future__ import annotations

from gameday.evidence.noise_floor import (
    FloorReading,
    floor_reading,
    noise_wait_reasons,
    unmeasured_message,
    wait_record,
)

READING = FloorReading(samples=40, source="all", kl=0.02, kl_mean=0.01, noise_comparisons=55)


def test_a_measured_floor_is_recorded_with_its_reading_and_judged_measured() -> None:
    doc = wait_record(READING, 30, 4.56789, read_at=1000.0)
    assert doc == {
        "measured": True,
        "min_samples": 30,
        "waited_s": 4.568,
        "read_at": 1000.0,
        "samples": 40,
        "source": "all",
        "kl": 0.02,
        "kl_mean": 0.01,
        "noise_comparisons": 55,
    }
    assert noise_wait_reasons(doc) == []


def test_an_unmeasured_floor_carries_its_message_to_the_verdict() -> None:
    doc = wait_record(None, 30, 30.0, read_at=1000.0, message="the gate could not be read")
    assert doc == {
        "measured": False,
        "min_samples": 30,
        "waited_s": 30.0,
        "read_at": 1000.0,
        "message": "the gate could not be read",
    }
    assert noise_wait_reasons(doc) == ["the gate could not be read"]


def test_under_the_release_test_its_own_floor_state_decides() -> None:
    """``--test release-eprocess``: the gate freezes a floor once it has its own
    ``min_samples``; the wait reads that state, not the harness's sample count."""
    state = {
        "noise_floor": {
            "all": {"state": "too_few", "kl": 1.0, "samples": 35, "min_samples": 50,
                    "source": "all", "kl_mean": 0.001}
        }
    }  # fmt: skip
    reading = floor_reading(state)
    assert reading.floor_state == "too_few" and reading.gate_min_samples == 50
    assert not reading.measured(20)  # 35 >= 20 would have passed the sample count
    message = unmeasured_message(reading, 20, 30.0)
    assert "too_few" in message and "35 baseline-baseline comparisons of the 50" in message
    state["noise_floor"]["all"].update(state="measured", kl=0.004, samples=50)
    assert floor_reading(state).measured(200)  # the test's count decides, not 200
    state["noise_floor"]["all"].update(state="frozen")
    doc = wait_record(floor_reading(state), 20, 1.0, read_at=1.0)
    assert doc["floor_state"] == "frozen" and doc["gate_min_samples"] == 50
    assert noise_wait_reasons(doc) == []
