"""Bounded faults (#27, finding 8b): every component's ``/admin/faults`` holds at most
``max_faults`` active faults (429 beyond, naming the cap and what to do), and a newer fault
of a kind replaces the older one for good: when the newer one expires or is cleared, the
older one does not come back into force.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from canarystack.common.errors import ApiError
from canarystack.common.faults import DEFAULT_MAX_FAULTS, FaultParams, FaultRegistry, NoParams
from tests.clock_support import ManualClock
from tests.procs import ADMIN_TOKEN, Spawner, inject_fault, post_fault

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class Slow(FaultParams):
    ms: float = 100.0


def registry(clock: ManualClock, max_faults: int = DEFAULT_MAX_FAULTS) -> FaultRegistry:
    kinds: dict[str, type[FaultParams]] = {"latency": Slow, "a": NoParams, "b": NoParams}
    return FaultRegistry("test", kinds, max_ttl_s=60, max_faults=max_faults, clock=clock)


def test_a_newer_fault_of_a_kind_replaces_the_older_for_good() -> None:
    clock = ManualClock(1000.0)
    reg = registry(clock)
    older = reg.inject({"kind": "latency", "ttl_s": 30, "ms": 1})
    newer = reg.inject({"kind": "latency", "ttl_s": 5, "ms": 2})
    assert newer.replaced == (older.id,)
    assert [f.id for f in reg.active()] == [newer.id]
    clock.now += 6  # the newer one expires; the older must not come back
    assert reg.get("latency") is None
    assert reg.active() == []


def test_clearing_the_newer_fault_does_not_bring_back_the_older() -> None:
    reg = registry(ManualClock(1000.0))
    reg.inject({"kind": "latency", "ttl_s": 30, "ms": 1})
    newer = reg.inject({"kind": "latency", "ttl_s": 30, "ms": 2})
    reg.clear(newer.id)
    assert reg.get("latency") is None


def test_faults_of_other_kinds_are_not_replaced() -> None:
    reg = registry(ManualClock(1000.0))
    a = reg.inject({"kind": "a", "ttl_s": 30})
    lat = reg.inject({"kind": "latency", "ttl_s": 30})
    assert lat.replaced == ()
    assert {f.id for f in reg.active()} == {a.id, lat.id}


def test_the_cap_refuses_a_new_fault_with_429_naming_the_cap() -> None:
    reg = registry(ManualClock(1000.0), max_faults=2)
    reg.inject({"kind": "a", "ttl_s": 30})
    reg.inject({"kind": "b", "ttl_s": 30})
    with pytest.raises(ApiError) as info:
        reg.inject({"kind": "latency", "ttl_s": 30})
    assert info.value.status == 429
    assert "cap" in info.value.message and "2" in info.value.message
    assert "DELETE /admin/faults" in info.value.message
    # Replacing a fault of a kind already active is not over the cap.
    again = reg.inject({"kind": "a", "ttl_s": 30})
    assert len(again.replaced) == 1
    assert len(reg.active()) == 2


def test_the_default_cap_is_stated_and_a_bad_cap_is_refused() -> None:
    assert DEFAULT_MAX_FAULTS == 16
    with pytest.raises(ValueError, match="max_faults"):
        registry(ManualClock(), max_faults=0)


def test_a_component_holds_one_fault_per_kind_and_the_answer_lists_what_it_replaced(
    spawn: Spawner, tmp_path: Path
) -> None:
    gate = spawn("canarystack.broker", "--state-dir", str(tmp_path / "broker"))
    ids: list[str] = []
    for ms in range(1, 41):
        body = inject_fault(gate.url, {"kind": "latency", "ttl_s": 60, "ms": ms})
        assert body["replaced"] == ids[-1:]
        ids.append(body["id"])
    listed = requests.get(gate.url + "/admin/faults", headers=ADMIN, timeout=5).json()["faults"]
    assert [(f["id"], f["params"]["ms"]) for f in listed] == [(ids[-1], 40.0)]
    replaced = [e for e in gate.log_events() if e.get("event") == "fault_replaced"]
    assert len(replaced) == 39
    assert replaced[-1]["fault_id"] == ids[-2] and replaced[-1]["by"] == ids[-1]
    # Clearing the one active fault leaves none: nothing older comes back.
    cleared = requests.delete(gate.url + f"/admin/faults/{ids[-1]}", headers=ADMIN, timeout=5)
    assert cleared.status_code == 200
    listed = requests.get(gate.url + "/admin/faults", headers=ADMIN, timeout=5).json()["faults"]
    assert listed == []
    assert post_fault(gate.url, {"kind": "latency", "ttl_s": 1, "ms": 1}).status_code == 201
