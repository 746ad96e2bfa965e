"""The ledger's record of a canary rolled out to a bad build
(``gameday.evidence.faults.bad_build_entries``), as ``probes.kubernetes`` books it and the
evidence core reads it back."""

from __future__ import annotations

from dataclasses import asdict

from canary_contract.faults import FaultAction
from gameday.evidence.faults import bad_build_entries, is_bad_build, reference_fault
from gameday.evidence.ledger import FaultEntry

PARAMS = {"mode": "fp8-kv-scale", "min_prompt_tokens": 2048, "build": "kernel-fault=fp8-kv-scale"}


def _entries() -> list[FaultEntry]:
    return bad_build_entries(
        [("model-canary-a", "uid-a"), ("model-canary-b", "uid-b")],
        {"model-canary-a": "http://127.0.0.1:9001"},
        PARAMS,
        {"rollout": "deployment/model-canary"},
        served_at=100.0,
    )


def _injected(component: str, kind: str, fault_id: str, at: float) -> FaultEntry:
    """A fault injected on a component's API (not a rollout)."""
    return FaultEntry(
        action="inject",
        time=at,
        component=component,
        replica=f"{component}-0",
        url="http://127.0.0.1:9",
        kind=kind,
        fault_id=fault_id,
        ttl_s=60.0,
    )


def test_one_kernel_injection_per_pod_at_the_time_it_could_serve() -> None:
    a, b = _entries()
    assert (a.action, a.kind, a.component, a.time, a.ttl_s) == (
        FaultAction.INJECT,
        "kernel",
        "model-canary",
        100.0,
        None,
    )
    assert (a.replica, a.url, a.fault_id) == (
        "model-canary-a",
        "http://127.0.0.1:9001",
        "build-uid-a",
    )
    assert (b.replica, b.url, b.fault_id) == ("model-canary-b", "", "build-uid-b")
    assert a.params == PARAMS and a.detail == {"rollout": "deployment/model-canary"}


def test_bad_build_entries_are_told_from_a_model_servers_kernel_fault() -> None:
    served = _injected("model-canary", "kernel", "f-123", 1.0)
    assert [is_bad_build(e) for e in _entries()] == [True, True]
    assert not is_bad_build(served)


def test_the_reference_fault_of_a_bad_build_rollout_is_its_first_entry() -> None:
    latency = _injected("router", "latency", "l-1", 50.0)
    rows = [asdict(latency), *(asdict(e) for e in _entries())]
    ref = reference_fault(rows)
    assert ref is not None and ref.entry["fault_id"] == "build-uid-a" and ref.time == 100.0
