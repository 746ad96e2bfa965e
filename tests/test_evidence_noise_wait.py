"""``gameday.evidence.noise_floor.wait_record``: what ``probes.gate.wait_for_noise_floor``
writes, read back by the verdict's ``noise_wait_reasons``."""

from __future__ import annotations

from gameday.evidence.noise_floor import FloorReading, noise_wait_reasons, wait_record

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
