"""Harness fault arguments (#12 item 7): ``params`` cannot override the fault's ``kind``
or ``ttl_s``, and a fault always has a finite, positive lifetime."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gameday.evidence.ledger import FaultError
from gameday.faults import fault_body, inject
from gameday.targets.base import parse_target


def test_params_are_the_faults_own_settings_beside_kind_and_ttl() -> None:
    body = fault_body("kernel", 30, {"mode": "nan-logits", "min_prompt_tokens": 2048})
    assert body == {"kind": "kernel", "ttl_s": 30, "mode": "nan-logits", "min_prompt_tokens": 2048}


@pytest.mark.parametrize("key", ["kind", "ttl_s"])
def test_params_that_would_override_kind_or_ttl_are_refused_naming_the_key(key: str) -> None:
    # before: {"kind": kind, "ttl_s": ttl_s, **params} let params win
    with pytest.raises(FaultError, match=f"params holds '{key}'.*'kind' and 'ttl_s' arguments"):
        fault_body("latency", 30, {"ms": 200, key: 1e9 if key == "ttl_s" else "kernel"})


@pytest.mark.parametrize("ttl", [math.inf, -math.inf, math.nan, 0, -5, "60", True, None])
def test_a_fault_without_a_finite_positive_ttl_is_refused(ttl: Any) -> None:
    with pytest.raises(FaultError, match=r"fault 'latency': ttl_s is .*seconds"):
        fault_body("latency", ttl, {"ms": 1})
    assert issubclass(FaultError, ValueError)


def test_inject_refuses_bad_params_before_touching_the_target(tmp_path: Path) -> None:
    # no stack in tmp_path: any request (or replica lookup) would raise TargetError instead
    target = parse_target({"kind": "local", "state_dir": str(tmp_path)})
    with pytest.raises(FaultError, match="params holds 'ttl_s'"):
        inject(target, "model-canary", "kernel", 30, {"ttl_s": math.inf})
    with pytest.raises(FaultError, match="ttl_s is inf"):
        inject(target, "router", "latency", math.inf, {"ms": 5})


def test_the_ledger_reads_its_actions_as_the_contracts_and_refuses_others(tmp_path: Path) -> None:
    from canary_contract.faults import FaultAction
    from gameday.evidence.ledger import FaultEntry
    from gameday.faults import FaultLedger

    ledger = FaultLedger(tmp_path / "faults.jsonl")
    for action in ("inject", "dependency", "clear"):  # as older callers still write them
        ledger.append(FaultEntry(action, 1.0, "router", "r0", "http://r0", "latency", "f1"))
    read = ledger.entries()
    assert [e.action for e in read] == [
        FaultAction.INJECT,
        FaultAction.DEPENDENCY,
        FaultAction.CLEAR,
    ]
    assert all(isinstance(e.action, FaultAction) for e in read)
    assert ledger.outstanding() == []  # the clear matches the inject by url and id
    with (tmp_path / "faults.jsonl").open("a") as fh:
        fh.write('{"action": "nudge", "time": 2.0, "component": "router", "replica": "r0", '
                 '"url": "http://r0", "kind": "latency"}\n')  # fmt: skip
    with pytest.raises(FaultError, match=r"action 'nudge' is not one of inject, clear, kill"):
        ledger.entries()
