"""The gate-blind fail-safe (#27 finding 2): a gate that sees no canary sample while the
baseline traffic says the canary takes its share trips after ``--blind-failsafe-s``
(test ``no_data``, reason ``gate_blind``), so the canary goes to 0 % instead of serving
unguarded; a gate that sees no traffic at all (an idle stack) is only inconclusive.

The rule itself is checked on ``ReleaseGate`` (which takes ``now`` as a parameter); the
trip end to end against a real gate and broker, fed baseline-only batches over HTTP the way
a router whose canary went silent would send them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from canarystack.gate.samples import SampleBatch
from canarystack.gate.state import GateConfig, ReleaseGate, release_record
from tests.procs import Spawner, wait_for
from tests.test_gate_service import batch, outcome, post, setup_stack

RELEASE = release_record("default", 3, "v1", "v2", 5)


def _gate() -> ReleaseGate:
    gate = ReleaseGate("default", GateConfig(no_data_timeout_s=10, blind_failsafe_s=20))
    gate.on_release(RELEASE, now_mono=0.0)
    return gate


def _baseline_batch(n: int) -> SampleBatch:
    return SampleBatch.model_validate(batch(outcomes=[outcome("baseline") for _ in range(n)]))


def test_baseline_traffic_without_canary_samples_is_blind_after_the_failsafe_time() -> None:
    gate = _gate()
    gate.ingest(_baseline_batch(200), now_mono=1.0, now_wall=1.0)  # ~10 canary expected
    assert gate.state(15.0) == "inconclusive"
    assert not gate.check_blind(15.0)  # inconclusive, not yet blind
    assert gate.check_blind(21.0)
    gate.decide_blind(21.0, 1000.0)
    assert gate.state(21.0) == "tripped"
    assert gate.trip is not None
    assert gate.trip["test"] == "no_data"
    assert gate.trip["detail"]["reason"] == "gate_blind"
    message = gate.trip["detail"]["message"]
    assert isinstance(message, str) and message.startswith("gate blind: canary weight 5 %")


def test_an_idle_stack_or_a_canary_sample_is_not_blind() -> None:
    idle = _gate()
    assert idle.state(100.0) == "inconclusive"
    assert not idle.check_blind(100.0)  # no traffic at all: nothing says the canary served
    few = _gate()
    few.ingest(_baseline_batch(50), now_mono=1.0, now_wall=1.0)  # ~2.6 canary expected
    assert not few.check_blind(100.0)
    seen = _gate()
    seen.ingest(_baseline_batch(200), now_mono=1.0, now_wall=1.0)
    canary = SampleBatch.model_validate(batch(outcomes=[outcome("canary")]))
    seen.ingest(canary, now_mono=12.0, now_wall=12.0)
    assert not seen.check_blind(25.0)  # the canary sample restarted the count


def _tripped(api: Any) -> dict[str, Any] | None:
    release = api.get("/v1/releases/default").json()
    return release if release["phase"] == "tripped" else None


def test_a_blind_gate_trips_the_release_with_the_reason_gate_blind(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, gate = setup_stack(
        spawn, tmp_path, "--no-data-timeout-s", "1", "--blind-failsafe-s", "2"
    )

    def feed_baseline_only() -> dict[str, Any] | None:
        assert post(gate, batch(outcomes=[outcome("baseline") for _ in range(50)])).ok
        return _tripped(api)

    release = wait_for(feed_baseline_only, timeout=30, interval=0.2, what="a gate_blind trip")
    assert isinstance(release, dict)
    trip = release["trip"]
    assert trip["test"] == "no_data"
    assert trip["detail"]["reason"] == "gate_blind"
    events = api.get("/v1/releases/default/events").json()["events"]
    tripped = [e for e in events if (e["change"].get("phase") or {}).get("new") == "tripped"]
    assert [e["reason"][:30] for e in tripped] == ["gate blind: canary weight 5 % "]
