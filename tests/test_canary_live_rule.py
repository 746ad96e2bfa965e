"""One canary-live rule (#30): router, gate, rollback executor and the contract's typed
release agree, for every phase x quarantine x weight x canary-present combination, on
whether a release sends its canary traffic (``canary_contract.phases.canary_live``).

Before, the gate took a canary for live whenever the phase was ``progressing``, its
quarantine ignored, while the router sent a quarantined canary nothing: with baseline
traffic and no canary sample the gate then took itself for blind and tripped a release
whose canary served nobody (a false trip; the last test).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from canary_contract.broker import Release
from canary_contract.phases import Phase, canary_live, canary_share
from canarystack.gate.samples import SampleBatch
from canarystack.gate.state import GateConfig, ReleaseGate
from canarystack.rollback.executor import ExecutorConfig, RollbackRunner
from canarystack.rollback.situation import Observed, classify
from canarystack.router.snapshot import canary_off_reason, effective_weight
from tests.test_gate_service import batch, outcome

# Every combination the broker can answer (a promoted release has no canary: promotion
# makes it the stable version).
COMBOS = [
    c
    for c in itertools.product(Phase, (False, True), (0, 5, 100), (True, False))
    if not (c[0] is Phase.PROMOTED and c[3])
]


def release(phase: Phase, quarantined: bool, weight: float, has_canary: bool) -> dict[str, Any]:
    canary = {"version": "v2", "digest": "sha256:" + "b" * 64, "quarantined": quarantined}
    return {
        "name": "default",
        "phase": phase.value,
        "revision": 3,
        "stable": {"version": "v1", "digest": "sha256:" + "a" * 64},
        "canary": canary if has_canary else None,
        "weights": {"canary": weight if has_canary else 0},
        "trip": None,
        "created_at": 1.0,
        "updated_at": 2.0,
    }


@pytest.mark.parametrize(("phase", "quarantined", "weight", "has_canary"), COMBOS)
def test_router_gate_and_contract_agree_on_canary_live(
    phase: Phase, quarantined: bool, weight: float, has_canary: bool
) -> None:
    rel = release(phase, quarantined, weight, has_canary)
    live = canary_live(rel)
    # The only live combination: progressing, a canary that is not quarantined, weight > 0.
    assert live == (phase is Phase.PROGRESSING and has_canary and not quarantined and weight > 0)
    assert (effective_weight(rel) > 0) == live  # the router
    gate = ReleaseGate("default", GateConfig())
    gate.on_release(Release.from_wire(rel), now_mono=0.0)
    assert gate.canary_live() == live  # the gate
    assert Release.from_wire(rel).canary_live == live  # the typed release
    # The rollback executor: its status reports the same, and it never calls a rollback
    # under way or done (or a trip awaiting step 1) while the canary is live.
    sit = classify(Release.from_wire(rel), [])
    runner = RollbackRunner(None, "default", ExecutorConfig())  # type: ignore[arg-type]
    assert runner.status(sit)["canary_live"] == live
    if sit.observed is not Observed.IDLE:
        assert not live, sit.observed
    assert canary_share(rel) == (float(weight) if live else 0.0)
    # A pin to the canary is refused naming why exactly when it is off for a reason other
    # than the operator's weight.
    off_by_weight = phase is Phase.PROGRESSING and has_canary and not quarantined
    assert (canary_off_reason(rel) is None) == off_by_weight


def test_a_quarantined_canary_takes_no_traffic_so_its_silence_is_not_a_blind_gate() -> None:
    gate = ReleaseGate("default", GateConfig(no_data_timeout_s=10, blind_failsafe_s=20))
    gate.on_release(Release.from_wire(release(Phase.PROGRESSING, True, 5, True)), now_mono=0.0)
    baseline = SampleBatch.model_validate(batch(outcomes=[outcome("baseline")] * 200))
    gate.ingest(baseline, now_mono=1.0, now_wall=1.0)
    assert not gate.check_blind(100.0)
    assert gate.trip is None
    # The same traffic with the canary live is blind after the fail-safe time.
    live = ReleaseGate("default", GateConfig(no_data_timeout_s=10, blind_failsafe_s=20))
    live.on_release(Release.from_wire(release(Phase.PROGRESSING, False, 5, True)), now_mono=0.0)
    live.ingest(baseline, now_mono=1.0, now_wall=1.0)
    assert live.check_blind(21.0)
