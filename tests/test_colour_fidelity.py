"""The colouring probe (issue #16 item 4): ``probes.colouring.fidelity`` on hop logs built
by hand (each rule of ``HOP_RULES``: a hop that lost the tag or the trace is named, a
shadow copy that reached no model, a log that restarted or overwrote hops makes requests
not checkable, never faithful), and the probe and its actions against a real local stack:
every hop of ``HOP_RULES`` is what the stack records, fidelity is 1 for tagged traffic,
and ``drop_colour`` at the model servers makes the probe fail naming hop 'model'."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from chaoslib.exceptions import ActivityFailed
from chaoslib.provider.python import validate_python_activity

from gameday.evidence.colouring import HOP_RULES, LogRead, fidelity
from gameday.evidence.slo import Slo
from probes import colouring, faults
from probes._context import InjectedFault
from tests.procs import wait_for
from tests.run_support import local_stack, slo_detail, write_load_state, write_target

T0 = 1000.0
TRACE = "a" * 32
OTHER_TRACE = "b" * 32


def hop(
    name: str,
    rid: str,
    *,
    tag: str | None = "gameday",
    trace: str = TRACE,
    at: float = T0,
    **kw: Any,
) -> dict[str, Any]:
    return {"hop": name, "request_id": rid, "trace_id": trace, "tag": tag, "at": at, **kw}


def routed(
    rid: str, *, status: int = 200, path: str = "/v1/completions", **kw: Any
) -> dict[str, Any]:
    return hop("router", rid, status=status, path=path, **kw)


def logs(
    router: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    canary: list[dict[str, Any]] | None = None,
    **other: list[dict[str, Any]],
) -> list[LogRead]:
    out = [
        LogRead("router", "router-0", router, started_at=0.0),
        LogRead("model-baseline", "model-baseline-0", baseline, started_at=0.0),
        LogRead("model-canary", "model-canary-0", canary or [], started_at=0.0),
    ]
    out += [LogRead(role, role, hops, started_at=0.0) for role, hops in other.items()]
    return out


def test_every_hop_faithful_is_ratio_one() -> None:
    fid = fidelity(
        logs(
            [routed("r1"), routed("r2")],
            [hop("model", "r1"), hop("redis", "r1"), hop("model", "r2")],
            gate=[hop("gate_sample", "r1"), hop("gate_sample", "r2")],
        ),
        read_at=T0 + 10,
    )
    assert (fid.judged, fid.faithful, fid.tagged, fid.ratio) == (2, 2, 2, 1.0)
    assert fid.worst() is None
    assert fid.hops["model"].ratio == 1.0 and fid.hops["gate_sample"].judged == 2


def test_a_model_that_loses_the_tag_is_named_with_an_example() -> None:
    fid = fidelity(
        logs([routed("r1"), routed("r2")], [hop("model", "r1", tag=None), hop("model", "r2")]),
        read_at=T0 + 10,
    )
    worst = fid.worst()
    assert worst is not None and worst.hop == "model"
    assert (worst.judged, worst.faithful) == (2, 1)
    assert worst.examples == ["r1 (tag 'gameday' -> None)"]
    assert fid.ratio == 0.5


def test_a_request_no_model_saw_and_a_changed_trace_are_losses() -> None:
    fid = fidelity(
        logs([routed("r1"), routed("r2")], [hop("model", "r2", trace=OTHER_TRACE)]),
        read_at=T0 + 10,
    )
    fig = fid.hops["model"]
    assert fig.faithful == 0 and fig.judged == 2
    assert fig.examples == ["r1 (never seen there)", f"r2 (trace {TRACE} -> {OTHER_TRACE})"]


def test_a_shadow_copy_must_reach_a_second_model_side() -> None:
    router = [routed("r1"), hop("shadow", "r1"), routed("r2"), hop("shadow", "r2")]
    fid = fidelity(
        logs(router, [hop("model", "r1"), hop("model", "r2")], [hop("model", "r1")]),
        read_at=T0 + 10,
    )
    fig = fid.hops["shadow"]
    assert (fig.judged, fig.faithful) == (2, 1)
    assert fig.examples == ["r2 (too few sightings)"]
    # The model hop of r2 is fine: the first hop that lost something is the shadow.
    assert fid.worst() is fig


def test_redis_gate_and_trip_hops_must_carry_the_routers_colour() -> None:
    fid = fidelity(
        logs(
            [routed("r1"), routed("r2")],
            [hop("model", "r1"), hop("model", "r2"), hop("redis", "r2", tag="other")],
            gate=[hop("gate_sample", "r1", trace=OTHER_TRACE)],
            broker=[hop("trip_evidence", "r1", tag=None)],
        ),
        read_at=T0 + 10,
    )
    assert fid.hops["redis"].judged == 1 and fid.hops["redis"].faithful == 0
    assert fid.hops["gate_sample"].faithful == 0
    assert fid.hops["trip_evidence"].faithful == 0
    assert fid.faithful == 0
    worst = fid.worst()
    assert worst is not None and worst.hop == "redis"  # path order: model, shadow, redis


def test_only_completed_inference_requests_are_judged() -> None:
    router = [
        routed("ok"),
        routed("failed", status=502),
        routed("models", path="/v1/models"),
        routed("faults", path="/admin/faults"),
    ]
    fid = fidelity(logs(router, [hop("model", "ok")]), read_at=T0 + 10)
    assert (fid.completed, fid.judged, fid.faithful) == (1, 1, 1)


def test_requests_a_log_cannot_vouch_for_are_not_checkable() -> None:
    router = [routed("early", at=T0), routed("late", at=T0 + 9), routed("mid", at=T0 + 5)]
    reads = logs(router, [hop("model", "mid", at=T0 + 5)])
    reads[1].started_at = T0 + 1  # the baseline restarted after "early" came in
    fid = fidelity(reads, read_at=T0 + 10, settle_s=3)  # "late": its copies may still run
    assert (fid.completed, fid.judged, fid.not_checkable, fid.faithful) == (3, 1, 2, 1)
    reads[1].started_at, reads[1].lost_before = 0.0, T0 + 6  # overwrote hops before T0 + 6
    fid = fidelity(reads, read_at=T0 + 10, settle_s=3)
    assert fid.judged == 0 and fid.not_checkable == 3


def test_a_router_that_loses_the_tag_of_what_the_harness_sent_is_named() -> None:
    sent = [
        {"request_id": "s1", "trace_id": TRACE, "tag": "gameday", "at": T0},
        {"request_id": "s2", "trace_id": TRACE, "tag": "gameday", "at": T0},
        {"request_id": "s3", "trace_id": TRACE, "tag": "gameday", "at": T0},
    ]
    # The router saw s1 untagged (and forwarded it so: the model agrees with the router),
    # s2 as sent, and never saw s3.
    router = [routed("s1", tag=None), routed("s2")]
    fid = fidelity(
        logs(router, [hop("model", "s1", tag=None), hop("model", "s2")]),
        read_at=T0 + 10,
        sent=sent,
    )
    worst = fid.worst()
    assert worst is not None and worst.hop == "router"
    assert (worst.judged, worst.faithful) == (3, 1)
    assert worst.examples == ["s1 (tag 'gameday' -> None)", "s3 (never seen there)"]
    assert fid.hops["model"].ratio == 1.0
    # A router that restarted after the request was sent cannot vouch for it.
    reads = logs(router, [])
    reads[0].started_at = T0 + 1
    assert fidelity(reads, read_at=T0 + 10, sent=sent).hops["router"].judged == 0


def test_requests_before_the_experiment_are_left_out() -> None:
    router = [routed("old", at=T0 - 100), routed("new", at=T0)]
    fid = fidelity(logs(router, [hop("model", "new")]), read_at=T0 + 10, since=T0 - 1)
    assert (fid.completed, fid.judged, fid.faithful) == (1, 1, 1)


def test_two_requests_sent_with_one_id_are_told_apart_by_trace() -> None:
    router = [routed("dup", trace=TRACE), routed("dup", trace=OTHER_TRACE)]
    models = [hop("model", "dup", trace=TRACE), hop("model", "dup", trace=OTHER_TRACE)]
    fid = fidelity(logs(router, models), read_at=T0 + 10)
    assert (fid.judged, fid.faithful) == (2, 2)
    lost = fidelity(logs(router, models[:1]), read_at=T0 + 10)
    assert lost.hops["model"].examples == ["dup (never seen there)"]


def test_the_rules_table_names_the_hops_components_record() -> None:
    assert [r.hop for r in HOP_RULES] == [
        "router",
        "model",
        "shadow",
        "redis",
        "gate_sample",
        "trip_evidence",
    ]


def test_the_probe_is_not_measured_before_anything(tmp_path: Path) -> None:
    cfg = {
        "gameday_target": str(tmp_path / "missing.yaml"),
        "gameday_run_dir": str(tmp_path / "run"),
    }
    out = colouring.colouring_fidelity_at_least(configuration=cfg)
    assert out["ok"] is True and out["detail"]["status"] == "not_measured"


@pytest.mark.parametrize("ratio", [0, 1.5, -1])
def test_a_bad_ratio_is_refused(tmp_path: Path, ratio: float) -> None:
    with pytest.raises(ActivityFailed, match="ratio"):
        colouring.colouring_fidelity_at_least(
            ratio=ratio, configuration={"gameday_run_dir": str(tmp_path)}
        )


EXAMPLES: dict[str, dict[str, Any]] = {
    "colouring_fidelity": {"settle_s": 3},
    "colouring_fidelity_at_least": {"ratio": 1.0, "min_requests": 20},
    "drop_colour": {"component": "router", "ttl_s": 60},
    "send_coloured_requests": {"count": 30, "tag": "gameday"},
}


@pytest.mark.parametrize("func", sorted(colouring.__all__))
def test_each_activity_is_what_chaos_toolkit_validates(func: str) -> None:
    fn = getattr(colouring, func)
    params = list(inspect.signature(fn).parameters)
    assert params[-1] == "configuration" and inspect.getdoc(fn)
    validate_python_activity(
        {
            "type": "action" if func in ("drop_colour", "send_coloured_requests") else "probe",
            "name": func.replace("_", "-"),
            "provider": {
                "type": "python",
                "module": "probes.colouring",
                "func": func,
                "arguments": EXAMPLES[func],
            },
        }
    )


# ----------------------------------------------------------------------------- live stack


@pytest.fixture(scope="module")
def live_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("colour-live")
    with local_stack(root / "stack"):
        yield write_target(root / "target.yaml", root / "stack")


@pytest.fixture
def live(live_target: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A run folder of its own: its load started now, so only this test's requests count."""
    write_load_state(tmp_path / "run", started_at=time.time())
    cfg = {"gameday_target": str(live_target), "gameday_run_dir": str(tmp_path / "run")}
    try:
        yield cfg
    finally:
        faults.clear_faults(configuration=cfg)


def _settled(cfg: dict[str, Any], want_ok: bool) -> Slo:
    def probe() -> Slo | None:
        out = colouring.colouring_fidelity_at_least(
            min_requests=20, settle_s=0.5, configuration=cfg
        )
        return out if out["ok"] is want_ok and out["detail"]["not_checkable"] == 0 else None

    got = wait_for(probe, timeout=30, interval=0.5, what=f"the colouring probe to say ok={want_ok}")
    assert isinstance(got, dict)
    return cast(Slo, got)


def _colour_dropped_at(component: str, cfg: dict[str, Any]) -> tuple[InjectedFault, Slo]:
    """``drop_colour`` at ``component``, 25 coloured requests, and the probe once it has
    settled on a failure (the faults are cleared after): the action's answer and the
    probe's."""
    dropped = colouring.drop_colour(component, ttl_s=60, configuration=cfg)
    try:
        colouring.send_coloured_requests(count=25, configuration=cfg)
        return dropped, _settled(cfg, want_ok=False)
    finally:
        faults.clear_faults(configuration=cfg)


@pytest.mark.slow
def test_a_live_stack_keeps_the_colour_at_every_hop_the_table_names(live: dict[str, Any]) -> None:
    sent = colouring.send_coloured_requests(count=30, configuration=live)
    assert sent["completed"] == 30
    out = _settled(live, want_ok=True)
    detail = slo_detail(out)
    assert out["measured"] == 1.0 and detail["judged"] >= 30 and detail["tagged"] >= 30
    # What the stack records is what the table expects: each request at a model server,
    # its Redis calls, and its samples at the gate.
    for name in ("model", "redis", "gate_sample"):
        assert detail["hops"][name]["judged"] >= 30, (name, detail["hops"][name])
    logs_read = colouring.read_logs(colouring.get_target(live))
    recorded = {h["hop"] for lg in logs_read for h in lg.hops}
    component_hops = {"router", "model", "gate", "broker"}
    assert recorded - component_hops <= {r.hop for r in HOP_RULES}, recorded


@pytest.mark.slow
def test_drop_colour_at_the_routers_fails_the_probe_naming_the_router(
    live: dict[str, Any],
) -> None:
    dropped, out = _colour_dropped_at("router", live)
    assert sorted(dropped["replicas"]) == ["router-0", "router-1"]
    assert out["detail"]["lost_at"] == "router"
    assert slo_detail(out)["hops"]["router"]["judged"] >= 25
    why = slo_detail(out)["why"]
    assert why.startswith("hop 'router'") and "tag 'gameday' -> None" in why


@pytest.mark.slow
def test_drop_colour_at_the_model_servers_fails_the_probe_naming_the_hop(
    live: dict[str, Any],
) -> None:
    dropped, out = _colour_dropped_at("model", live)
    assert len(dropped["fault_ids"]) == len(dropped["replicas"]) >= 2
    assert out["detail"]["lost_at"] == "model"
    why = slo_detail(out)["why"]
    assert why.startswith("hop 'model'") and "tag 'gameday' -> None" in why and "colour-" in why
    assert out["measured"] is not None and out["measured"] < 1.0
