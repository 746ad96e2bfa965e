"""Probes over a run folder (records, ledger, load.json) and the checks that need no stack:
SLO results measured right, fail-closed when data is missing, blast radius refused before
any request, bad arguments named, a load that cannot start interrupts the experiment; the
weights-applied SLO read from a real broker's history (canary_off_at, else the
annotation's time)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import ActivityFailed, InterruptExecution

from gameday.evidence.slo import Slo
from gameday.faults import FaultLedger
from probes import faults, load, slo
from tests.broker_support import broker_with_versions
from tests.procs import Spawner
from tests.run_support import (
    ledger_entry,
    record,
    slo_detail,
    write_load_state,
    write_records,
    write_target,
)

T0 = 1_800_000_000.0


def config(run_dir: Path, target: Path | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"gameday_run_dir": str(run_dir)}
    if target is not None:
        cfg["gameday_target"] = str(target)
    return cfg


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def test_before_anything_the_slo_probes_say_not_measured(run_dir: Path) -> None:
    cfg = config(run_dir)
    for result in (
        slo.baseline_ttft_p99_below(1.0, configuration=cfg),
        slo.error_rate_below(0.0, configuration=cfg),
        slo.no_canary_served_after(5, configuration=cfg),
        slo.drifted_responses_at_most(3, configuration=cfg),
        slo.trip_within(5, configuration=cfg),
    ):
        assert result["ok"] is True and result["measured"] is None
        assert result["detail"]["status"] == "not_measured"
        assert slo.slo_met(dict(result))


def test_a_fault_without_load_records_fails_closed(run_dir: Path) -> None:
    ledger_entry(run_dir, time=T0)
    result = slo.error_rate_below(0.0, configuration=config(run_dir))
    assert result["ok"] is False and "probes.load control" in slo_detail(result)["why"]
    assert not slo.slo_met(dict(result))


def test_a_load_that_did_not_stop_fails_closed(run_dir: Path) -> None:
    write_load_state(run_dir, state="running")
    result = slo.error_rate_below(0.0, configuration=config(run_dir))
    assert result["ok"] is False and "'running'" in slo_detail(result)["why"]


def test_empty_records_fail_closed(run_dir: Path) -> None:
    write_load_state(run_dir)
    write_records(run_dir, [])
    result = slo.baseline_ttft_p99_below(1.0, configuration=config(run_dir))
    assert result["ok"] is False and "no rows" in slo_detail(result)["why"]


def test_baseline_ttft_p99(run_dir: Path) -> None:
    write_load_state(run_dir)
    rows = [record(start_time=T0 + i, ttft_s=0.1) for i in range(99)]
    rows.append(record(start_time=T0 + 100, ttft_s=3.0))
    rows += [record(start_time=T0, ttft_s=9.0, served_by="canary")]  # not baseline
    rows += [record(start_time=T0, ttft_s=9.0, ok=False, error_kind="timeout")]  # failed
    write_records(run_dir, rows)
    cfg = config(run_dir)
    ok = slo.baseline_ttft_p99_below(0.2, configuration=cfg)
    assert ok["check"] == "baseline_ttft_p99_s" and ok["unit"] == "s"
    assert ok["detail"]["requests"] == 100
    assert ok["measured"] is not None and 0.1 <= ok["measured"] <= 3.0
    tight = slo.baseline_ttft_p99_below(ok["measured"] - 0.01, configuration=cfg)
    assert tight["ok"] is False
    few = slo.baseline_ttft_p99_below(5.0, min_requests=500, configuration=cfg)
    assert few["ok"] is False and "fewer than the 500" in slo_detail(few)["why"]


def test_error_rate(run_dir: Path) -> None:
    write_load_state(run_dir)
    rows = [record(start_time=T0 + i) for i in range(8)]
    rows += [record(start_time=T0, ok=False, error_kind="broken_stream", served_by="canary")]
    rows += [record(start_time=T0, ok=None, error_kind=None)]  # unknown: counts as failed
    write_records(run_dir, rows)
    result = slo.error_rate_below(0.25, configuration=config(run_dir))
    assert result["measured"] == pytest.approx(0.2) and result["ok"] is True
    assert result["detail"]["by_error_kind"] == {"broken_stream": 1, "unknown": 1}
    assert slo.error_rate_below(0.0, configuration=config(run_dir))["ok"] is False


def test_no_canary_served_after_and_drifted_responses(run_dir: Path) -> None:
    write_load_state(run_dir)
    ledger_entry(run_dir, time=T0)
    rows = [
        record(start_time=T0 - 5, served_by="canary", prompt_tokens=4000),  # before the fault
        record(start_time=T0 + 0.5, served_by="canary", prompt_tokens=100),  # short: no drift
        record(start_time=T0 + 1.0, served_by="canary", prompt_tokens=3000),
        record(start_time=T0 + 2.5, served_by="canary", prompt_tokens=2048),
        record(start_time=T0 + 9.0, served_by="baseline", prompt_tokens=5000),
    ]
    write_records(run_dir, rows)
    cfg = config(run_dir)
    last = slo.no_canary_served_after(3.0, configuration=cfg)
    assert last["check"] == "rollback_s"
    assert last["measured"] == pytest.approx(2.5) and last["ok"] is True
    assert last["detail"]["canary_requests_after_fault"] == 3
    assert slo.no_canary_served_after(2.0, configuration=cfg)["ok"] is False
    drifted = slo.drifted_responses_at_most(2, configuration=cfg)
    assert drifted["measured"] == 2 and drifted["ok"] is True
    assert drifted["detail"]["min_prompt_tokens"] == 2048
    assert slo.drifted_responses_at_most(1, configuration=cfg)["ok"] is False


def test_no_canary_after_the_fault_measures_zero(run_dir: Path) -> None:
    write_load_state(run_dir)
    ledger_entry(run_dir, time=T0)
    write_records(run_dir, [record(start_time=T0 + 1)])
    result = slo.no_canary_served_after(1.0, configuration=config(run_dir))
    assert result["measured"] == 0.0 and result["ok"] is True


def test_errors_only_in_flight_at_kill(run_dir: Path) -> None:
    write_load_state(run_dir)
    ledger_entry(run_dir, time=T0 - 3)
    ledger_entry(
        run_dir, action="kill", time=T0, component="router", replica="router-0", kind="pod-kill"
    )
    rows = [record(start_time=T0 - 10 + i) for i in range(10)]
    rows += [
        record(start_time=T0 - 0.4, e2e_s=0.4, ok=False, error_kind="broken_stream"),
        record(start_time=T0 + 0.3, e2e_s=None, ok=False, error_kind="connect"),  # stale conn
    ]
    write_records(run_dir, rows)
    cfg = config(run_dir)
    result = slo.errors_only_in_flight_at_kill(1.0, configuration=cfg)
    assert result["ok"] is True and result["measured"] == 0
    assert result["detail"]["in_flight_at_kill"] == 2
    rows.append(record(start_time=T0 + 5, e2e_s=0.1, ok=False, error_kind="http_status"))
    rows.append(record(start_time=T0 - 9, e2e_s=0.1, ok=False, error_kind="http_status"))
    write_records(run_dir, rows)
    late = slo.errors_only_in_flight_at_kill(1.0, configuration=cfg)
    assert late["ok"] is False and late["measured"] == 2
    assert late["detail"]["unexplained_start_times"] == [-9.0, 5.0]


def test_weights_applied_is_when_the_last_router_stopped_the_canary(
    spawn: Spawner, tmp_path: Path, run_dir: Path
) -> None:
    broker, api = broker_with_versions(spawn, tmp_path / "broker", release=None)
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "stack.json").write_text(json.dumps({"release": "a", "broker_url": broker.url}))
    fault = ledger_entry(run_dir, time=time.time() - 5.0)

    def applied(release: str, **change: Any) -> tuple[dict[str, Any], Slo]:
        api.create(release)
        r = api.write(
            "POST",
            f"/v1/releases/{release}/events",
            {
                "actor": "rollback",
                "change": {"annotation": "routers_applied", "revision": 2, **change},
                "reason": "test",
            },
        )
        assert r.status_code == 201, r.text
        target = write_target(tmp_path / f"{release}.yaml", stack, release=release)
        return dict(r.json()), slo.weights_applied_within(5, configuration=config(run_dir, target))

    # The routers said when their canary went off: that is the time, not the annotation's.
    note, result = applied("a", routers=["router-0"], canary_off_at=fault.time + 1.25)
    assert result["ok"] is True
    assert result["measured"] == pytest.approx(1.25)
    assert result["detail"]["source"] == "canary_off_at"
    assert result["detail"]["annotation_time"] == note["time"]
    # A tighter SLO fails on the same figure.
    target_a = tmp_path / "a.yaml"
    tight = slo.weights_applied_within(1.0, configuration=config(run_dir, target_a))
    assert tight["ok"] is False and tight["measured"] == pytest.approx(1.25)
    # No canary_off_at (an older executor, or a router that did not say): the annotation's
    # own time, and the detail says so.
    note, result = applied("b", routers=["router-0"], canary_off_at=None)
    assert result["detail"]["source"] == "annotation_time"
    assert result["measured"] == pytest.approx(note["time"] - fault.time, abs=1e-5)
    assert result["ok"] is False  # the annotation came 5 s or more after the fault
    # No annotation at all: the routers themselves, when every live one says since when
    # its canary weight is 0 (its heartbeats); the last of them is the milestone.
    api.create("c")
    current = api.release("c")["revision"]  # a router reports only what the broker issued
    for router, off in (("router-0", 2.0), ("router-1", 2.5)):
        beat = {"router_id": router, "release": "c", "applied_revision": current}
        r = api.write(
            "POST", "/v1/routers/heartbeat", {**beat, "canary_off_since": fault.time + off}
        )
        assert r.status_code == 200, r.text
    target_c = write_target(tmp_path / "c.yaml", stack, release="c")
    result = slo.weights_applied_within(5, configuration=config(run_dir, target_c))
    assert result["detail"]["source"] == "routers" and result["detail"]["routers"] == 2
    assert (result["measured"], result["ok"]) == (pytest.approx(2.5), True)


def test_slo_met_accepts_only_an_ok_slo() -> None:
    assert slo.slo_met({"check": "x", "measured": 1, "allowed": 2, "ok": True})
    assert not slo.slo_met({"check": "x", "measured": 3, "allowed": 2, "ok": False})
    assert not slo.slo_met({"check": "x", "ok": "yes"})
    assert not slo.slo_met(None)


def test_outside_the_blast_radius_nothing_is_injected(tmp_path: Path, run_dir: Path) -> None:
    target = write_target(tmp_path / "t.yaml", tmp_path / "no-stack", components=["router"])
    cfg = config(run_dir, target)
    with pytest.raises(ActivityFailed) as err:
        faults.make_canary_faulty(ttl_s=30, configuration=cfg)
    message = str(err.value)
    assert "model-canary" in message and "outside the blast radius" in message
    assert "blast_radius.components" in message  # says what to do
    with pytest.raises(ActivityFailed, match="outside the blast radius"):
        faults.kill_pod("broker", configuration=cfg)
    assert FaultLedger(run_dir / "faults.jsonl").entries() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"component": "router", "ms": -5}, "argument ms must be above 0"),
        ({"component": "router", "ms": 5, "ttl_s": 0}, "argument ttl_s must be above 0"),
        ({"component": "router", "ms": 5, "ttl_s": 3600}, "at most 600"),
        ({"component": "routr", "ms": 5}, "unknown component 'routr'"),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path, run_dir: Path, kwargs: dict[str, Any], message: str
) -> None:
    target = write_target(tmp_path / "t.yaml", tmp_path / "no-stack")
    with pytest.raises(ActivityFailed, match=message):
        faults.inject_latency(**kwargs, configuration=config(run_dir, target))


def test_a_missing_target_file_is_named(run_dir: Path, tmp_path: Path) -> None:
    cfg = config(run_dir, tmp_path / "nope.yaml")
    with pytest.raises(ActivityFailed, match=r"nope\.yaml.*cannot read it"):
        faults.inject_latency("router", 5, configuration=cfg)


def test_a_load_that_cannot_start_interrupts_the_experiment(tmp_path: Path, run_dir: Path) -> None:
    state_dir = tmp_path / "stack"
    state_dir.mkdir()
    (state_dir / "stack.json").write_text(
        json.dumps({"router_url": "http://127.0.0.1:9", "components": []})
    )
    cfg = config(run_dir, write_target(tmp_path / "t.yaml", state_dir))
    t0 = time.monotonic()
    with pytest.raises(InterruptExecution, match="could not start"):
        load.before_method_control(
            None, users=1, prompt_mix="jsonl:/nonexistent/prompts.jsonl", configuration=cfg
        )
    assert time.monotonic() - t0 < 60
    state = json.loads((run_dir / "load.json").read_text())
    assert state["state"] == "failed" and "prompts.jsonl" in state["error"]
    load.after_method_control(None, configuration=cfg)  # nothing left to stop
    with pytest.raises(InterruptExecution, match="users must be from 1"):
        load.before_method_control(None, users=0, configuration=cfg)


def test_only_an_external_target_makes_the_canarystack_only_checks_not_applicable(
    tmp_path: Path, run_dir: Path
) -> None:
    """canarystack's own stack (local, and its Kubernetes kind) answers every check; only a
    stack the project did not build (kind: external) turns them into not applicable."""
    import yaml

    from probes._context import foreign_gate

    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "stack.json").write_text(json.dumps({"release": "default", "components": []}))
    local = write_target(tmp_path / "local.yaml", stack)
    assert foreign_gate(config(run_dir, local)) is None
    external = tmp_path / "external.yaml"
    external.write_text(
        yaml.safe_dump(
            {
                "kind": "external",
                "name": "theirs",
                "components": {"router": {"url": "http://127.0.0.1:1"}},
            }
        )
    )
    why = foreign_gate(config(run_dir, external))
    assert why is not None and "'theirs' is a stack the project did not build" in why
