"""The Kubernetes experiments (experiments/k8s/) and the namespace guard in a real
``chaos run`` against a FAKED Kubernetes API (tests/k8s_fake.py).

- every experiment (the game day's four and the progressive-delivery examples) passes
  ``chaos validate`` (the real CLI) with its environment set;
- they act on the cluster only through the harness (pod kills via ``probes.faults``,
  i.e. chaostoolkit-kubernetes ``terminate_pods`` behind the target's blast radius) and
  read-only chaosk8s probes whose namespace is ``${k8s_namespace}``; every one runs the
  blast-radius guard, then the fresh canary, then the load;
- ``chaos run`` of an experiment whose chaosk8s activities point at kube-system (or at a
  namespace the target does not list) is interrupted before its first activity: the fake
  API sees no request at all. The same experiment on the target's namespace does reach it
  (so the silence above is the guard's doing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_fake import FakeApi, client_env, pod, workload
from tests.test_experiments_files import assert_all_valid

REPO = Path(__file__).resolve().parents[1]
K8S_EXPERIMENTS = sorted((REPO / "experiments" / "k8s").glob("*.yaml"))  # the game day
ALL_K8S = sorted((REPO / "experiments" / "k8s").rglob("*.yaml"))  # + progressive/ examples
TARGET = REPO / "deploy" / "k8s" / "base" / "harness" / "target.yaml"
NS = "stack"


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def activities(exp: dict[str, Any]) -> list[dict[str, Any]]:
    hyp = exp.get("steady-state-hypothesis", {}).get("probes", [])
    return [*hyp, *exp["method"], *exp.get("rollbacks", [])]


def chaos(*args: str, env: dict[str, str | None], cwd: Path) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items()}
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    cmd = [sys.executable, "-m", "chaostoolkit", "--no-version-check",
           "--log-file", str(cwd / "chaos.log"), *args]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=full
    )


def test_there_are_router_broker_rollback_and_control_experiments() -> None:
    names = {p.stem for p in K8S_EXPERIMENTS}
    assert names == {"control", "router-pod-kill", "broker-pod-kill", "rollback-pod-kill",
                     "faulty-canary-rollout"}  # fmt: skip


def test_chaos_validate_accepts_every_k8s_experiment_with_its_environment(tmp_path: Path) -> None:
    env: dict[str, str | None] = {
        "GAMEDAY_TARGET": str(TARGET),
        "GAMEDAY_RUN_DIR": str(tmp_path / "run"),
        "GAMEDAY_K8S_NAMESPACE": "canarystack",
    }
    procs = {p.stem: chaos("validate", str(p), env=env, cwd=tmp_path) for p in ALL_K8S}
    assert len(procs) == len(ALL_K8S) == 7
    assert_all_valid(procs)


@pytest.mark.parametrize("path", K8S_EXPERIMENTS, ids=lambda p: p.stem)
def test_k8s_experiments_harm_only_through_the_harness_and_guard_chaosk8s(path: Path) -> None:
    exp = load(path)
    assert [c["provider"]["module"] for c in exp["controls"]] == [
        "probes.kubernetes", "probes.fresh_canary", "probes.load",
    ]  # fmt: skip
    assert exp["runtime"]["rollbacks"]["strategy"] == "always"
    assert exp["configuration"]["gameday_target"]["default"] == str(TARGET.relative_to(REPO))
    ext = next(e for e in exp["extensions"] if e["name"] == "gameday")
    component = path.stem.removesuffix("-pod-kill")
    kills = []
    for act in activities(exp):
        provider = act["provider"]
        module, func = provider["module"], provider["func"]
        if module.startswith("chaosk8s"):
            # read-only probes only, always on the configured namespace
            assert act["type"] == "probe" and func == "deployment_available_and_healthy"
            assert provider["arguments"]["ns"] == "${k8s_namespace}"
        if func == "kill_pod":
            assert module == "probes.faults"
            kills.append(provider["arguments"]["component"])
    if component == "control":
        assert kills == [] and ext["expect"] == "no_trip"
    elif component == "faulty-canary-rollout":
        # the bad build is a rollout of the canary Deployment, undone (also as a rollback)
        assert kills == [] and ext == {**ext, "component": "control",
                                       "fault": "faulty-kernel", "expect": "trip"}  # fmt: skip
        changes = [a["provider"]["func"] for a in exp["method"]
                   if a["provider"]["module"] == "probes.kubernetes"]  # fmt: skip
        assert changes == ["roll_out_bad_canary", "undo_canary_rollout", "wait_for_ready"]
        assert ("probes.kubernetes", "undo_canary_rollout") in {
            (a["provider"]["module"], a["provider"]["func"]) for a in exp["rollbacks"]
        }
    else:
        assert kills == [component] and ext == {**ext, "component": component,
                                                "fault": "pod-kill", "expect": "trip"}  # fmt: skip
        waits = [a for a in exp["method"] if a["provider"]["func"] == "wait_for_ready"]
        assert [w["provider"]["arguments"]["component"] for w in waits] == [component]
    assert ("probes.faults", "clear_faults") in {
        (a["provider"]["module"], a["provider"]["func"]) for a in exp["rollbacks"]
    }


# --- the guard in a real `chaos run` ---------------------------------------------------
@pytest.fixture
def fake() -> Iterator[FakeApi]:
    api = FakeApi()
    labels = {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": "router"}
    api.add_pod(pod("router-a", labels, "10.0.0.1", namespace=NS))
    api.add_workload(workload("Deployment", "router", desired=2, ready=2, namespace=NS))
    api.start()
    try:
        yield api
    finally:
        api.stop()


def guard_experiment(tmp_path: Path, namespace: str) -> Path:
    target = {
        "kind": "kubernetes",
        "namespace": NS,
        "urls": {"broker": "http://127.0.0.1:9"},
        "blast_radius": {"namespaces": [NS], "components": ["router"]},
    }
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(target))
    selector = "app.kubernetes.io/part-of=canarystack,app.kubernetes.io/component=router"
    exp = {
        "version": "1.0.0",
        "title": "guard",
        "description": "chaosk8s activities on a namespace from the configuration",
        "configuration": {
            "gameday_target": str(tmp_path / "target.yaml"),
            "gameday_run_dir": str(tmp_path / "run"),
            "k8s_namespace": namespace,
        },
        "controls": [
            {
                "name": "kubernetes-blast-radius",
                "provider": {"type": "python", "module": "probes.kubernetes"},
            }
        ],
        "steady-state-hypothesis": {
            "title": "routers available",
            "probes": [
                {
                    "type": "probe",
                    "name": "router-available",
                    "tolerance": True,
                    "provider": {
                        "type": "python",
                        "module": "chaosk8s.deployment.probes",
                        "func": "deployment_available_and_healthy",
                        "arguments": {"name": "router", "ns": "${k8s_namespace}"},
                    },
                }
            ],
        },
        "method": [
            {
                "type": "action",
                "name": "kill-a-router",
                "provider": {
                    "type": "python",
                    "module": "chaosk8s.pod.actions",
                    "func": "terminate_pods",
                    "arguments": {
                        "label_selector": selector,
                        "ns": "${k8s_namespace}",
                        "grace_period": 0,
                    },
                },
            }
        ],
    }
    path = tmp_path / "guard.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


@pytest.mark.parametrize("namespace", ["kube-system", "prod", NS])
def test_chaos_run_is_refused_before_any_request_outside_the_blast_radius(
    fake: FakeApi, tmp_path: Path, namespace: str
) -> None:
    path = guard_experiment(tmp_path, namespace)
    env = client_env(fake, tmp_path / "no-kubeconfig")
    proc = chaos("run", "--journal-path", str(tmp_path / "journal.json"), str(path),
                 env=env, cwd=tmp_path)  # fmt: skip
    out, _ = proc.communicate(timeout=120)
    text = out.decode(errors="replace") + (tmp_path / "chaos.log").read_text()
    journal = json.loads((tmp_path / "journal.json").read_text())
    if namespace == NS:
        # allowed: the hypothesis (before and after) and the pod kill reached the fake API
        assert journal["status"] == "completed", text[-2000:]
        assert [s.method for s in fake.seen] == ["GET", "GET", "DELETE", "GET"]
        assert fake.seen[2].path == f"/api/v1/namespaces/{NS}/pods/router-a"
        assert fake.pods[NS] == {}
    else:
        assert journal["status"] == "interrupted", text[-2000:]
        assert "refused by the kubernetes blast-radius guard" in text
        assert f"namespace {namespace!r}" in text
        assert fake.seen == []
