"""``gameday run`` of the Kubernetes control experiment, end to end on loopback: a real
stack (broker, model servers, gate, rollback executor, router — started by PID) behind a
FAKED Kubernetes API that lists one pod per role at 127.0.0.1 (its port from the target
file) and reports the workloads ready.

It proves that the k8s experiment, the kubernetes target file, the namespace guard, the
fresh-canary control (a no-op on a progressing release), the chaosk8s readiness probes,
the load through the router's URL and the report fit together and give a passing verdict
with no trip. Not proven: anything a real cluster adds (scheduling, kube-proxy, DNS,
NetworkPolicies, real pod kills — the pod-kill experiments need a cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.k8s_fake import FakeApi, client_env, pod, workload
from tests.procs import ADMIN_TOKEN, Proc, Spawner

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NS = "stack"
ROLES = ("broker", "model-baseline", "model-canary", "gate", "rollback", "router")


def labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": role}


@pytest.fixture
def stack(spawn: Spawner, tmp_path: Path) -> dict[str, Proc]:
    broker = spawn("canarystack.broker", "--state-dir", str(tmp_path / "broker"))
    base = spawn("canarystack.model", "--version", "v1")
    canary = spawn("canarystack.model", "--version", "v2")
    common = ["--broker", broker.url, "--release", "default"]
    gate = spawn("canarystack.gate", *common)
    rollback = spawn("canarystack.rollback", *common)
    router = spawn("canarystack.router", *common, "--router-id", "router-7d9-a",
                   "--baseline", base.url, "--canary", canary.url, "--gate", gate.url,
                   "--state-dir", str(tmp_path / "router"))  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "release_init.py"), "--broker", broker.url,
         "--stable", "v1", "--canary", "v2", "--canary-weight", "5"],
        env={**os.environ, "CANARYSTACK_ADMIN_TOKEN": ADMIN_TOKEN},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"broker": broker, "model-baseline": base, "model-canary": canary, "gate": gate,
            "rollback": rollback, "router": router}  # fmt: skip


@pytest.fixture
def fake(stack: dict[str, Proc]) -> Iterator[FakeApi]:
    api = FakeApi()
    for role in ROLES:
        api.add_pod(pod(f"{role}-7d9-a", labels(role), "127.0.0.1", namespace=NS))
        kind = "StatefulSet" if role == "broker" else "Deployment"
        api.add_workload(workload(kind, role, desired=1, ready=1, namespace=NS,
                                  labels=labels(role)))  # fmt: skip
    api.start()
    try:
        yield api
    finally:
        api.stop()


def test_gameday_run_of_the_k8s_control_experiment_passes(
    stack: dict[str, Proc], fake: FakeApi, tmp_path: Path
) -> None:
    target = yaml.safe_load((REPO / "deploy/k8s/base/harness/target.yaml").read_text())
    target.update(
        namespace=NS,
        urls={role: stack[role].url for role in ("router", "broker", "gate", "rollback")},
        ports={role: stack[role].port for role in ROLES},
        blast_radius={**target["blast_radius"], "namespaces": [NS]},
    )
    target.pop("credentials_dir")  # one token for all, from the environment, here
    target_file = tmp_path / "target.yaml"
    target_file.write_text(yaml.safe_dump(target))
    env = {**os.environ, "CANARYSTACK_ADMIN_TOKEN": ADMIN_TOKEN, "GAMEDAY_K8S_NAMESPACE": NS,
           "GAMEDAY_WARMUP_S": "3", "GAMEDAY_OBSERVE_S": "3", "GAMEDAY_LOAD_USERS": "4",
           "GAMEDAY_LOAD_SPAWN_RATE": "4", "GAMEDAY_HEAL_WAIT_S": "10",
           # A 3 s run on the k8s path: the gate must have seen something, not a game day's
           # worth (the thresholds have their own tests: tests/test_inconclusive*.py).
           "GAMEDAY_MIN_COMPARISONS": "1", "GAMEDAY_MIN_CANARY_OUTCOMES": "1"}  # fmt: skip
    for var, value in client_env(fake, tmp_path / "no-kubeconfig").items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    out = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "gameday.cli", "run", str(REPO / "experiments/k8s/control.yaml"),
         "--target", str(target_file), "--out", str(out), "--run-id", "k8s-control"],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False,
    )  # fmt: skip
    run = out / "k8s-control"
    results = list(run.rglob("result.json"))
    detail = done.stdout[-4000:] + done.stderr[-3000:]
    assert len(results) == 1, detail
    result = json.loads(results[0].read_text())
    assert result["verdict"] == "pass", (result, detail)
    assert done.returncode == 0, detail
    folder = results[0].parent
    fresh = json.loads((folder / "fresh-canary.json").read_text())
    assert fresh == {**fresh, "ok": True, "changed": False, "canary_version": "v2"}
    journal = json.loads((folder / "journal.json").read_text())
    probes = {r["activity"]["name"]: r for r in journal["steady_states"]["after"]["probes"]}
    for role in ("router", "model-baseline", "model-canary", "gate", "rollback"):
        assert probes[f"{role}-deployment-available"]["output"] is True
    # the chaosk8s readiness probes asked the (fake) API, in the target's namespace only
    deployments = [s.path for s in fake.seen if "/deployments" in s.path]
    assert deployments and all(p.startswith(f"/apis/apps/v1/namespaces/{NS}/") for p in deployments)
    assert not [s for s in fake.seen if s.method in ("DELETE", "PATCH")]
    records = folder / "records.parquet"
    assert records.exists() and records.stat().st_size > 0
    assert (run / "report.html").exists()
