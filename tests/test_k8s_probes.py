"""Cluster probes against a FAKED Kubernetes API and a FAKED Prometheus (tests/k8s_fake.py,
real HTTP on loopback): Argo Rollouts, Flagger, PromQL, workload readiness, and the
namespace guard for chaosk8s activities.

What is proven: each controller probe passes only when the status AND the traffic served
after it agree — a status that says aborted/failed while canary requests kept coming (or
the weight stayed up) is a failed check that says the controller failed open; no traffic
at all, or a metric with no series, is a failed check too (fail-closed); a status that is
not aborted names expected and actual; a forbidden namespace is refused before any
request. What is not: how real controllers, API servers or Prometheus behave.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaoslib.exceptions import ActivityFailed, InterruptExecution

from gameday.evidence.ledger import FaultEntry
from gameday.faults import FaultLedger
from gameday.load.records import LOAD_SCHEMA, ParquetSink
from probes import kubernetes as k8s_probes
from probes import progressive, prometheus
from tests.k8s_fake import FakeApi, pod, prom_vector, serve_fake, workload
from tests.run_support import slo_detail

NS = "stack"
T_ABORT = 1_700_000_100.0  # when the controllers below changed status
T_ABORT_TEXT = "2023-11-14T22:15:00Z"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApi]:
    monkeypatch.delenv("PROMETHEUS_URL", raising=False)
    yield from serve_fake(FakeApi(), tmp_path, monkeypatch)


def config(tmp_path: Path, namespace: str = NS, **extra: Any) -> dict[str, Any]:
    target = {
        "kind": "kubernetes",
        "name": "staging",
        "namespace": namespace,
        "urls": {"broker": "http://127.0.0.1:9"},
        "blast_radius": {"namespaces": [namespace], "components": ["router", "broker"]},
    }
    path = tmp_path / f"target-{namespace}.yaml"
    path.write_text(yaml.safe_dump(target))
    return {"gameday_target": str(path), "gameday_run_dir": str(tmp_path / "run"), **extra}


def write_records(tmp_path: Path, rows: list[tuple[float, str, str]]) -> None:
    """Load records (start_time, served_by, model_version) and a stopped load state."""
    run = tmp_path / "run"
    sink = ParquetSink(run / "records.parquet", LOAD_SCHEMA)
    for i, (start, served_by, version) in enumerate(rows):
        sink.add({"request_id": f"r{i}", "start_time": start, "served_by": served_by,
                  "model_version": version, "ok": True, "status": 200})  # fmt: skip
    sink.close()
    state = {"state": "stopped", "records": str(run / "records.parquet")}
    (run / "load.json").write_text(json.dumps(state))


def rollout(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {},
        "status": status,
    }


ARGO_ABORTED = {
    "abort": True,
    "abortedAt": T_ABORT_TEXT,
    "phase": "Degraded",
    "message": "RolloutAborted: Rollout aborted update to revision 2",
    "conditions": [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "RolloutAborted",
            "lastTransitionTime": T_ABORT_TEXT,
        },
        {"type": "Available", "status": "True", "reason": "AvailableReason"},
    ],
    "canary": {"weights": {"canary": {"weight": 0}, "stable": {"weight": 100}}},
}


def canary_failed(phase: str, weight: int) -> dict[str, Any]:
    return {
        "apiVersion": "flagger.app/v1beta1",
        "kind": "Canary",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {},
        "status": {
            "phase": phase,
            "canaryWeight": weight,
            "failedChecks": 5,
            "lastTransitionTime": T_ABORT_TEXT,
            "conditions": [
                {
                    "type": "Promoted",
                    "status": "False",
                    "reason": "Failed",
                    "lastTransitionTime": T_ABORT_TEXT,
                }
            ],
        },
    }


def test_rfc3339_time_of_the_fixtures() -> None:
    from probes._cluster import epoch_s

    assert epoch_s(T_ABORT_TEXT) == T_ABORT


# --- Argo Rollouts -------------------------------------------------------------------
def test_argo_aborted_and_no_canary_traffic_after_grace_passes(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    # canary traffic until 3 s after the abort (inside the 5 s grace), baseline after
    write_records(tmp_path, [(T_ABORT - 10, "canary", "v2"), (T_ABORT + 3, "canary", "v2")]
                  + [(T_ABORT + 6 + i, "baseline", "v1") for i in range(5)])  # fmt: skip
    out = progressive.argo_rollout_aborted("llm", grace_s=5, configuration=config(tmp_path))
    assert out["ok"] is True, out
    assert (out["check"], out["measured"], out["allowed"], out["unit"]) == (
        "argo_rollout_aborted", 0.0, 0.0, "count",
    )  # fmt: skip
    assert slo_detail(out)["controller"]["aborted_at"] == T_ABORT
    assert slo_detail(out)["traffic"]["total"] == 5
    (req,) = fake.api_requests()
    assert req.path == f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts/llm"


def test_argo_says_aborted_but_the_canary_kept_serving_is_a_fail_open(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    write_records(tmp_path, [(T_ABORT + 8, "canary", "v2"), (T_ABORT + 9, "canary", "v2"),
                             (T_ABORT + 9, "baseline", "v1")])  # fmt: skip
    out = progressive.argo_rollout_aborted("llm", grace_s=5, configuration=config(tmp_path))
    assert out["ok"] is False and out["measured"] == 2.0
    assert "says aborted" in slo_detail(out)["why"] and "failed open" in slo_detail(out)["why"]
    assert "expected at most 0 canary-served requests" in slo_detail(out)["why"]


def test_argo_canary_by_model_version_when_the_router_does_not_say(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    # a mesh-routed stack: no x-served-by, but the response names the model version
    write_records(tmp_path, [(T_ABORT + 8, "", "v2"), (T_ABORT + 9, "", "v1")])
    cfg = config(tmp_path)
    out = progressive.argo_rollout_aborted("llm", canary_version="v2", configuration=cfg)
    assert out["ok"] is False and out["measured"] == 1.0
    plain = progressive.argo_rollout_aborted("llm", configuration=cfg)
    assert plain["ok"] is True  # served_by alone cannot see it: hence canary_version


def test_argo_aborted_with_the_canary_weight_still_up_is_a_fail_open(
    fake: FakeApi, tmp_path: Path
) -> None:
    status = {**ARGO_ABORTED, "canary": {"weights": {"canary": {"weight": 20}}}}
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(status))
    write_records(tmp_path, [(T_ABORT + 9, "baseline", "v1")])
    out = progressive.argo_rollout_aborted("llm", configuration=config(tmp_path))
    assert out["ok"] is False and out["measured"] is None
    assert "canary weight 20 (expected 0)" in slo_detail(out)["why"]


def test_argo_not_aborted_names_expected_and_actual(fake: FakeApi, tmp_path: Path) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts",
                    rollout({"phase": "Progressing", "abort": False}))  # fmt: skip
    write_records(tmp_path, [(T_ABORT + 9, "baseline", "v1")])
    out = progressive.argo_rollout_aborted("llm", timeout_s=0, configuration=config(tmp_path))
    assert out["ok"] is False
    why = slo_detail(out)["why"]
    assert "'llm' should be aborted (status.abort true, phase Degraded" in why
    assert "but it is phase 'Progressing'" in why


def test_argo_waits_for_the_abort_until_its_timeout(fake: FakeApi, tmp_path: Path) -> None:
    key = ("argoproj.io", "v1alpha1", NS, "rollouts", "llm")
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout({"phase": "Paused"}))
    write_records(tmp_path, [(T_ABORT + 9, "baseline", "v1")])

    def abort_later() -> None:
        time.sleep(0.5)
        fake.custom[key] = rollout(ARGO_ABORTED)

    threading.Thread(target=abort_later, daemon=True).start()
    out = progressive.argo_rollout_aborted("llm", timeout_s=30, configuration=config(tmp_path))
    assert out["ok"] is True, out
    assert len(fake.api_requests()) >= 2


def test_argo_aborted_but_no_traffic_at_all_is_not_a_pass(fake: FakeApi, tmp_path: Path) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    write_records(tmp_path, [(T_ABORT - 5, "canary", "v2")])  # nothing after the abort
    out = progressive.argo_rollout_aborted("llm", configuration=config(tmp_path))
    assert out["ok"] is False and "no request at all after the status change" in str(out)


def test_argo_without_load_records_says_how_to_get_evidence(fake: FakeApi, tmp_path: Path) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    with pytest.raises(ActivityFailed, match=r"the load has not run.*probes.load.*canary_promql"):
        progressive.argo_rollout_aborted("llm", configuration=config(tmp_path))


def test_argo_paired_with_promql_traffic_over_the_window_since_the_abort(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_custom("argoproj.io", "v1alpha1", "rollouts", rollout(ARGO_ABORTED))
    answers = {"canary": prom_vector(), "total": prom_vector(40.0, 2.0)}

    def answer(expr: str) -> dict[str, Any] | None:
        if re.fullmatch(r'sum\(increase\(reqs\{v="canary"\}\[\d+s\]\)\)', expr):
            return answers["canary"]
        if re.fullmatch(r"sum\(increase\(reqs\[\d+s\]\)\)", expr):
            return answers["total"]
        return None

    fake.promql_fn = answer
    cfg = config(tmp_path, prometheus_url=fake.url)
    kwargs: dict[str, Any] = {"canary_promql": 'sum(increase(reqs{v="canary"}[{window}]))',
              "total_promql": "sum(increase(reqs[{window}]))", "grace_s": 5}  # fmt: skip
    out = progressive.argo_rollout_aborted("llm", configuration=cfg, **kwargs)
    assert out["ok"] is True and out["measured"] == 0.0, out
    assert slo_detail(out)["traffic"]["total"] == 42.0
    # the window starts at abort + grace
    window_s = int(re.search(r"\[(\d+)s\]", fake.prometheus_queries()[0]).group(1))  # type: ignore[union-attr]
    assert abs(window_s - (time.time() - (T_ABORT + 5))) < 60
    answers["canary"] = prom_vector(3.0)
    out = progressive.argo_rollout_aborted("llm", configuration=cfg, **kwargs)
    assert out["ok"] is False and out["measured"] == 3.0
    # an empty canary answer with no total: an unscraped metric looks idle, so not a pass
    kwargs.pop("total_promql")
    answers["canary"] = prom_vector()
    out = progressive.argo_rollout_aborted("llm", configuration=cfg, **kwargs)
    assert out["ok"] is False and "matched no series" in slo_detail(out)["why"]


def test_missing_or_forbidden_rollout_is_a_clear_error(fake: FakeApi, tmp_path: Path) -> None:
    with pytest.raises(ActivityFailed, match=r"rollouts.argoproj.io 'nope' not found in "
                       r"namespace 'stack'"):  # fmt: skip
        progressive.argo_rollout_aborted("nope", configuration=config(tmp_path))
    fake.forbidden.add(("GET", "/apis/flagger.app/"))
    with pytest.raises(ActivityFailed, match=r"forbidden: the chaos runner's Role needs get"):
        progressive.flagger_canary_failed("llm", configuration=config(tmp_path))


# --- Flagger -------------------------------------------------------------------------
def test_flagger_failed_with_weight_0_and_drained_traffic_passes(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_custom("flagger.app", "v1beta1", "canaries", canary_failed("Failed", 0))
    write_records(tmp_path, [(T_ABORT + 1, "canary", "v2"), (T_ABORT + 7, "baseline", "v1")])
    out = progressive.flagger_canary_failed("llm", grace_s=5, configuration=config(tmp_path))
    assert out["ok"] is True and out["measured"] == 0.0, out
    assert slo_detail(out)["controller"]["failed_checks"] == 5
    (req,) = fake.api_requests()
    assert req.path == f"/apis/flagger.app/v1beta1/namespaces/{NS}/canaries/llm"


@pytest.mark.parametrize(
    ("phase", "weight", "rows", "why"),
    [
        ("Failed", 10, [(T_ABORT + 7, "baseline", "v1")], "canary weight 10 (expected 0)"),
        ("Failed", 0, [(T_ABORT + 7, "canary", "v2")], "failed open"),
        ("Progressing", 20, [(T_ABORT + 7, "canary", "v2")], "should be phase Failed"),
    ],
)
def test_flagger_failed_status_without_drained_traffic_fails(
    fake: FakeApi,
    tmp_path: Path,
    phase: str,
    weight: int,
    rows: list[tuple[float, str, str]],
    why: str,
) -> None:
    fake.add_custom("flagger.app", "v1beta1", "canaries", canary_failed(phase, weight))
    write_records(tmp_path, rows)
    out = progressive.flagger_canary_failed("llm", configuration=config(tmp_path))
    assert out["ok"] is False and why in slo_detail(out)["why"], out


def test_progressive_probes_refuse_kube_system_before_any_request(
    fake: FakeApi, tmp_path: Path
) -> None:
    cfg = config(tmp_path, namespace="kube-system")
    for probe in (progressive.argo_rollout_aborted, progressive.flagger_canary_failed):
        with pytest.raises(ActivityFailed, match="'kube-system' is never a blast radius"):
            probe("llm", configuration=cfg)
    assert fake.seen == []


def test_progressive_probes_need_a_kubernetes_target(fake: FakeApi, tmp_path: Path) -> None:
    local = tmp_path / "local.yaml"
    local.write_text("kind: local\n")
    with pytest.raises(
        ActivityFailed, match="needs a kubernetes target, but the target is 'local'"
    ):
        progressive.argo_rollout_status("llm", configuration={"gameday_target": str(local)})


# --- Prometheus ----------------------------------------------------------------------
WEIGHT = f'max(router_canary_weight_percent{{namespace="{NS}"}})'
CANARY = f'sum(increase(router_requests_total{{namespace="{NS}",variant="canary"}}[30s]))'
TOTAL = f'sum(increase(router_requests_total{{namespace="{NS}"}}[30s]))'


@pytest.mark.parametrize(
    ("weight", "canary", "total", "ok", "measured", "why"),
    [
        ([0.0, 0.0], [], [120.0], True, 0.0, None),
        ([0.0, 0.0], [3.0], [120.0], False, 3.0, "3 canary-served requests in the last 30 s"),
        ([0.0, 5.0], [], [120.0], False, 0.0, "still reports canary weight 5"),
        ([0.0], [], [], False, None, "no series for the total query"),
        ([0.0], [], [0.0], False, None, "served no request in the last 30 s"),
    ],
)
def test_canary_drained_pairs_router_weights_with_served_traffic(
    fake: FakeApi,
    tmp_path: Path,
    weight: list[float],
    canary: list[float],
    total: list[float],
    ok: bool,
    measured: float | None,
    why: str | None,
) -> None:
    fake.promql = {WEIGHT: prom_vector(*weight), CANARY: prom_vector(*canary),
                   TOTAL: prom_vector(*total)}  # fmt: skip
    if len(weight) == 2:  # max() over routers: the fake answers the max itself
        fake.promql[WEIGHT] = prom_vector(max(weight))
    out = prometheus.canary_drained(window_s=30, configuration=config(tmp_path),
                                    prometheus_url=fake.url)  # fmt: skip
    assert (out["ok"], out["measured"]) == (ok, measured), out
    assert out["check"] == "canary_drained" and out["unit"] == "count"
    if why:
        assert why in slo_detail(out)["why"]
    assert sorted(fake.prometheus_queries()) == sorted([WEIGHT, CANARY, TOTAL])
    assert all(s.method == "POST" and s.path == "/api/v1/query" for s in fake.seen)


def test_metric_bounds_and_prometheus_errors(fake: FakeApi, tmp_path: Path) -> None:
    fake.promql = {"sum(canarystack_gate_trips_total)": prom_vector(1.0),
                   "absent_metric": prom_vector()}  # fmt: skip
    cfg = config(tmp_path, prometheus_url=fake.url)
    out = prometheus.metric_at_least("sum(canarystack_gate_trips_total)", 1, check="trips",
                                     configuration=cfg)  # fmt: skip
    assert (out["ok"], out["measured"], out["check"]) == (True, 1.0, "trips")
    out = prometheus.metric_at_most("sum(canarystack_gate_trips_total)", 0, configuration=cfg)
    assert out["ok"] is False and out["detail"]["why"] == "expected <= 0, got 1"
    out = prometheus.metric_at_most("absent_metric", 0, configuration=cfg)
    assert out["ok"] is False and "matched no series" in slo_detail(out)["why"]
    assert prometheus.query_value("sum(canarystack_gate_trips_total)", configuration=cfg) == 1.0
    with pytest.raises(ActivityFailed, match=r"Prometheus refused the query 'up\{': HTTP 400"):
        prometheus.query_value("up{", configuration=cfg)
    with pytest.raises(ActivityFailed, match="no Prometheus URL"):
        prometheus.query_value("up", configuration=config(tmp_path))
    with pytest.raises(ActivityFailed, match="cannot reach Prometheus"):
        prometheus.query_value("up", prometheus_url="http://127.0.0.1:9")


# --- readiness ---------------------------------------------------------------------------
def test_wait_for_ready_measures_recovery_from_the_pod_kill(fake: FakeApi, tmp_path: Path) -> None:
    key = (NS, "deployments", "router")
    labels = {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": "router"}
    fake.add_pod(pod("router-b", labels, "10.0.0.2", namespace=NS))
    # the controller has not counted the loss yet: 2/2 available, but only one pod left
    fake.add_workload(workload("Deployment", "router", desired=2, ready=2, namespace=NS))
    cfg = config(tmp_path)
    FaultLedger(tmp_path / "run" / "faults.jsonl").append(
        FaultEntry(
            action="kill",
            time=time.time(),
            component="router",
            replica="router-a",
            url="",
            kind="pod-kill",
        )
    )
    out = k8s_probes.wait_for_ready("router", timeout_s=0.3, poll_s=0.05, configuration=cfg)
    assert out["ok"] is False
    assert "deployment/router 2/2 available, 1 pods Ready" in slo_detail(out)["why"]
    # then it counts it, and the new pod starts (not Ready yet) ...
    fake.workloads[key] = workload("Deployment", "router", desired=2, ready=1, namespace=NS)
    fake.add_pod(pod("router-c", labels, "10.0.0.3", phase="Pending", namespace=NS))
    out = k8s_probes.wait_for_ready("router", timeout_s=0.3, poll_s=0.05, configuration=cfg)
    assert out["ok"] is False and "1/2 available, 1 pods Ready" in slo_detail(out)["why"]

    def recover() -> None:  # ... and becomes Ready
        time.sleep(0.3)
        fake.add_pod(pod("router-c", labels, "10.0.0.3", namespace=NS))
        fake.workloads[key] = workload("Deployment", "router", desired=2, ready=2, namespace=NS)

    threading.Thread(target=recover, daemon=True).start()
    out = k8s_probes.wait_for_ready("router", timeout_s=30, poll_s=0.05, configuration=cfg)
    assert out["ok"] is True and out["detail"]["measured_from"] == "pod kill"
    assert out["measured"] is not None and 0.3 <= out["measured"] < 30
    assert slo_detail(out)["workloads"][0]["ready_pods"] == ["router-b", "router-c"]


# --- the namespace guard ---------------------------------------------------------------
def chaosk8s_activity(name: str, ns: str | None) -> dict[str, Any]:
    arguments = {"label_selector": "app.kubernetes.io/component=router"}
    if ns is not None:
        arguments["ns"] = ns
    return {"type": "action", "name": name, "provider": {
        "type": "python", "module": "chaosk8s.pod.actions", "func": "terminate_pods",
        "arguments": arguments}}  # fmt: skip


@pytest.mark.parametrize(
    ("ns", "message"),
    [
        ("kube-system", "namespace 'kube-system', which is never allowed"),
        ("prod", "namespace 'prod', outside the blast radius of target 'staging'"),
        (None, "namespace 'default', outside the blast radius"),  # chaosk8s's default
    ],
)
def test_guard_refuses_chaosk8s_activities_outside_the_blast_radius(
    fake: FakeApi, tmp_path: Path, ns: str | None, message: str
) -> None:
    experiment = {"method": [chaosk8s_activity("kill", ns)]}
    with pytest.raises(InterruptExecution, match=message):
        k8s_probes.before_experiment_control(experiment, configuration=config(tmp_path))
    with pytest.raises(InterruptExecution, match=message):
        k8s_probes.before_activity_control(experiment["method"][0],
                                           configuration=config(tmp_path))  # fmt: skip
    assert fake.seen == []


def test_guard_substitutes_the_configuration_and_lets_the_target_namespace_through(
    fake: FakeApi, tmp_path: Path
) -> None:
    cfg = config(tmp_path, k8s_namespace=NS)
    ok = {"steady-state-hypothesis": {"probes": [chaosk8s_activity("a", "${k8s_namespace}")]},
          "method": [{"type": "probe", "name": "not-k8s",
                      "provider": {"type": "python", "module": "probes.stack",
                                   "func": "release_phase"}}]}  # fmt: skip
    k8s_probes.before_experiment_control(ok, configuration=cfg)
    assert fake.seen == []  # the guard itself reads nothing from the cluster
