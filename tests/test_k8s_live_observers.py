"""Gate observers on the Kubernetes API, live (#25): an Argo Rollouts ``Rollout``, a Flagger
``Canary``, a Gateway API ``HTTPRoute`` and an Istio ``VirtualService`` on the real
kube-apiserver of the loopback cluster, their status and weights changed as the
controllers would, read by ``kind: external`` targets' observers into the same history the
harness reads from canarystack's broker.

The controllers cannot run here (no Go module proxy): their CRDs are stand-ins with the
real group, version, kind and status fields (deploy/loopback/crds/), and the tests write
the status a controller writes. Skipped unless CANARY_GAMEDAY_K8S_LIVE=1 (``make
test-k8s``); the module starts the cluster (deploy/loopback/k8s-up.sh, without the stack)
and stops it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from gameday.load.pod_run import PodLoadRun
from gameday.load.runner import LoadConfig, LoadStartError
from gameday.observers import GateObserver, history
from gameday.targets import TargetError, parse_target
from gameday.targets.external import ExternalTarget
from gameday.targets.kubernetes import KubernetesTarget
from tests.test_k8s_live import (
    KUBECONFIG,
    admin_call,
    cluster_unless_up,
    live_marks,
    recreate,
    rfc3339,
    write_status,
)

NS = "observers"
pytestmark = live_marks(1800)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with cluster_unless_up():
        code, body = admin_call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        assert code in (201, 409), body
        yield


def _observer(kind: str, name: str, **extra: Any) -> GateObserver:
    target = parse_target(
        {
            "kind": "external",
            "components": {"router": {"url": "http://127.0.0.1:1"}},
            "observer": {
                "kind": kind,
                "namespace": NS,
                "name": name,
                "kubeconfig": str(KUBECONFIG),
                **extra,
            },
        }
    )
    assert isinstance(target, ExternalTarget)
    return target.observer()


ROLLOUTS = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts"
CANARIES = f"/apis/flagger.app/v1beta1/namespaces/{NS}/canaries"
HTTPROUTES = f"/apis/gateway.networking.k8s.io/v1beta1/namespaces/{NS}/httproutes"
VIRTUALSERVICES = f"/apis/networking.istio.io/v1beta1/namespaces/{NS}/virtualservices"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
# The apiVersion and kind of the objects each collection holds.
KINDS = {
    ROLLOUTS: ("argoproj.io/v1alpha1", "Rollout"),
    CANARIES: ("flagger.app/v1beta1", "Canary"),
    HTTPROUTES: ("gateway.networking.k8s.io/v1beta1", "HTTPRoute"),
    VIRTUALSERVICES: ("networking.istio.io/v1beta1", "VirtualService"),
    DEPLOYMENTS: ("apps/v1", "Deployment"),
}


def _manifest(collection: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The object ``name`` of ``collection``'s kind, with ``spec``."""
    api_version, kind = KINDS[collection]
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_an_argo_rollout_abort_is_a_trip_at_its_aborted_at(cluster: None) -> None:
    path = recreate(
        ROLLOUTS,
        _manifest(ROLLOUTS, "llm", {"strategy": {"canary": {"steps": [{"setWeight": 5}]}}}),
    )
    observer = _observer("argo-rollouts", "llm")
    with requests.Session() as session:
        write_status(
            path,
            {"phase": "Progressing", "canary": {"weights": {"canary": {"weight": 5}}}},
        )
        healthy = observer.snapshot(session)
        assert (healthy.tripped, healthy.canary_weight, healthy.sees) == (False, 5.0, True)
        aborted_at = time.time() - 3
        write_status(
            path,
            {
                "phase": "Degraded",
                "abort": True,
                "abortedAt": rfc3339(aborted_at),
                "message": "RolloutAborted: metric drift failed",
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "RolloutAborted",
                        "lastTransitionTime": rfc3339(aborted_at),
                    }
                ],
                "canary": {"weights": {"canary": {"weight": 0}}},
            },
        )
        tripped = observer.snapshot(session)
    assert tripped.tripped is True
    assert tripped.canary_weight == 0.0
    assert abs((tripped.tripped_since or 0) - int(aborted_at)) < 1.0
    events: Sequence[Mapping[str, Any]] = history(observer.log.snapshots(), observer.name)
    phases = [e["change"]["phase"]["new"] for e in events if "phase" in e["change"]]
    assert phases == ["tripped", "rolled_back"]
    assert events[0]["time"] == tripped.tripped_since


def test_an_argo_analysis_run_in_error_means_the_gate_cannot_see(cluster: None) -> None:
    path = recreate(
        ROLLOUTS,
        _manifest(ROLLOUTS, "blind", {}),
    )
    write_status(
        path,
        {
            "phase": "Progressing",
            "canary": {
                "weights": {"canary": {"weight": 5}},
                "currentStepAnalysisRunStatus": {
                    "name": "blind-drift-1",
                    "status": "Error",
                    "message": "Prometheus: no data",
                },
            },
        },
    )
    with requests.Session() as session:
        snap = _observer("argo-rollouts", "blind").snapshot(session)
    assert snap.sees is False
    assert snap.why == ["AnalysisRun 'blind-drift-1' is Error: Prometheus: no data"]


def test_a_flagger_canary_failed_is_a_trip(cluster: None) -> None:
    path = recreate(
        CANARIES,
        _manifest(CANARIES, "llm", {"targetRef": {"kind": "Deployment", "name": "llm"}}),
    )
    observer = _observer("flagger", "llm")
    with requests.Session() as session:
        write_status(path, {"phase": "Progressing", "canaryWeight": 10, "failedChecks": 0})
        assert observer.snapshot(session).tripped is False
        failed_at = time.time() - 2
        write_status(
            path,
            {
                "phase": "Failed",
                "canaryWeight": 0,
                "failedChecks": 3,
                "lastTransitionTime": rfc3339(failed_at),
            },
        )
        snap = observer.snapshot(session)
    assert (snap.tripped, snap.canary_weight) == (True, 0.0)
    assert abs((snap.tripped_since or 0) - int(failed_at)) < 1.0


def _httproute(canary_weight: int) -> dict[str, Any]:
    return _manifest(
        HTTPROUTES,
        "llm",
        {
            "rules": [
                {
                    "backendRefs": [
                        {"name": "vllm-baseline", "port": 8000, "weight": 100 - canary_weight},
                        {"name": "vllm-canary", "port": 8000, "weight": canary_weight},
                    ]
                }
            ]
        },
    )


def test_an_httproute_weight_set_to_zero_is_read_as_the_canary_off(cluster: None) -> None:
    recreate(HTTPROUTES, _httproute(5))
    observer = _observer("k8s-route", "llm", route_kind="HTTPRoute", canary_backend="vllm-canary")
    with requests.Session() as session:
        assert observer.snapshot(session).canary_weight == 5.0
        code, body = admin_call(
            "PUT", f"{HTTPROUTES}/llm", _with_version(HTTPROUTES, _httproute(0))
        )
        assert code == 200, body
        assert observer.snapshot(session).canary_weight == 0.0
    events = history(observer.log.snapshots(), observer.name)
    assert [e["change"].get("annotation") for e in events] == [None, None, "routers_applied", None]


def _with_version(path: str, obj: dict[str, Any]) -> dict[str, Any]:
    _, current = admin_call("GET", f"{path}/{obj['metadata']['name']}")
    obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return obj


def test_a_virtualservice_subset_weight_is_the_canary_share(cluster: None) -> None:
    recreate(
        VIRTUALSERVICES,
        _manifest(
            VIRTUALSERVICES,
            "llm",
            {
                "hosts": ["llm"],
                "http": [
                    {
                        "route": [
                            {"destination": {"host": "llm", "subset": "stable"}, "weight": 90},
                            {"destination": {"host": "llm", "subset": "canary"}, "weight": 10},
                        ]
                    }
                ],
            },
        ),
    )
    observer = _observer("k8s-route", "llm", route_kind="VirtualService", canary_backend="canary")
    with requests.Session() as session:
        assert observer.snapshot(session).canary_weight == 10.0


def test_an_object_that_is_not_there_is_said_not_raised(cluster: None) -> None:
    with requests.Session() as session:
        snap = _observer("flagger", "nobody").snapshot(session)
    assert snap.tripped is None and snap.sees is None
    assert snap.why == ["the Kubernetes API did not give 'nobody': HTTP 404 Not Found"]


def _staging(canary: dict[str, Any], namespaces: list[str]) -> dict[str, Any]:
    """The target file of a foreign stack "staging" (its router and model-canary on
    ports nothing listens on) whose model-canary has ``canary`` (how to harm it) and only
    it in the blast radius, in ``namespaces``."""
    return {
        "kind": "external",
        "name": "staging",
        "components": {
            "router": {"url": "http://127.0.0.1:1"},
            "model-canary": {"url": "http://127.0.0.1:2", **canary},
        },
        "blast_radius": {"components": ["model-canary"], "namespaces": namespaces},
    }


def _killing_target(namespaces: list[str]) -> ExternalTarget:
    """A foreign stack whose canary is deployment/vllm-canary, killed through the API, with
    ``namespaces`` as its blast radius."""
    kill = {
        "backend": "kubernetes",
        "namespace": NS,
        "selector": "app=vllm-canary",
        "workload": "deployment/vllm-canary",
        "kubeconfig": str(KUBECONFIG),
    }
    target = parse_target(_staging({"kill": kill}, namespaces))
    assert isinstance(target, ExternalTarget)
    return target


def _sleeper_deployment(name: str, args: list[str] | None) -> dict[str, Any]:
    """A one-replica Deployment ``name`` (label ``app: NAME``) whose container ``engine``
    runs the canarystack image's Python asleep (``args`` after it, when given): a pod
    to kill or roll out. Host network, like every pod here (a pod network sandbox does
    not come up on this node); the process binds nothing."""
    labels = {"app": name}
    container: dict[str, Any] = {
        "name": "engine",
        "image": "canarystack:0.1.0",
        "imagePullPolicy": "Never",
        "command": ["python", "-c", "import time; time.sleep(3600)"],
        "resources": {"requests": {"cpu": "10m"}},
    }
    if args is not None:
        container["args"] = args
    return _manifest(
        DEPLOYMENTS,
        name,
        {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "containers": [container],
                },
            },
        },
    )


def test_an_external_target_kills_one_pod_of_a_named_workload(cluster: None) -> None:
    """kind: external with a kubernetes kill backend: one pod of the named Deployment is
    deleted (grace 0) after the namespace and owner checks; its ReplicaSet replaces it."""
    recreate(DEPLOYMENTS, _sleeper_deployment("vllm-canary", args=None))

    def running() -> list[str]:
        _, pods = admin_call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dvllm-canary")
        return [
            p["metadata"]["name"]
            for p in pods.get("items", [])
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    deadline = time.monotonic() + 120
    while not running():
        assert time.monotonic() < deadline, "the Deployment's pod never ran"
        time.sleep(1)
    (before,) = running()
    target = _killing_target([NS])
    killed = target.kill_pod("model-canary")
    assert killed.name == before
    deadline = time.monotonic() + 120
    while before in running() or not running():
        assert time.monotonic() < deadline, "no replacement pod ran"
        time.sleep(1)
    # Outside blast_radius.namespaces: refused before any call.
    outside = _killing_target([])
    with pytest.raises(TargetError, match="outside the blast radius"):
        outside.kill_pod("model-canary")
    admin_call("DELETE", f"{DEPLOYMENTS}/vllm-canary")


def test_an_external_target_rolls_a_bad_build_out_and_back(cluster: None, tmp_path: Path) -> None:
    """kind: external with components.model-canary.rollout: probes.kubernetes'
    roll_out_bad_build patches the engine container (vLLM's --kv-cache-dtype fp8 here) and
    waits for the new ReplicaSet; the ledger holds the bad build as a kernel fault from
    when its first container started; undo_canary_rollout gives the previous template
    back and closes those entries."""
    from probes import kubernetes as pk

    path = recreate(DEPLOYMENTS, _sleeper_deployment("vllm-engine", args=["--model", "m"]))
    target_file = tmp_path / "target.yaml"
    rollout = {
        "namespace": NS,
        "workload": "deployment/vllm-engine",
        "selector": "app=vllm-engine",
        "container": "engine",
        "kubeconfig": str(KUBECONFIG),
    }
    target_file.write_text(json.dumps(_staging({"rollout": rollout}, [NS])))
    config = {"gameday_target": str(target_file), "gameday_run_dir": str(tmp_path / "run")}
    # The first rollout: wait until the original pod is up.
    pk.undo_canary_rollout(deadline_s=120, configuration=config)  # nothing to undo yet
    done = pk.roll_out_bad_build(
        args=["--kv-cache-dtype", "fp8"], min_prompt_tokens=0, deadline_s=180,
        configuration=config,
    )  # fmt: skip
    assert done["build"] == "bad-build: --kv-cache-dtype fp8"
    _, dep = admin_call("GET", path)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--model", "m", "--kv-cache-dtype", "fp8"]
    from gameday.faults import FaultLedger

    book = FaultLedger(tmp_path / "run" / "faults.jsonl")
    (entry,) = book.outstanding()
    assert (entry.component, entry.kind, entry.url) == ("model-canary", "kernel", "")
    assert entry.params["min_prompt_tokens"] == 0
    undone = pk.undo_canary_rollout(deadline_s=180, configuration=config)
    assert undone["changed"] is True and undone["closed_ledger_entries"] == 1
    _, dep = admin_call("GET", path)
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == ["--model", "m"]
    assert book.outstanding() == []
    admin_call("DELETE", path)


# -- the Locust master as a pod (load_workers.master) ------------------------------------
def _master_target() -> KubernetesTarget:
    """A Kubernetes target whose Locust master runs from deployment/locust-master's
    template in this namespace (0 replicas, the image's entry point, host network)."""
    labels = {"app": "locust-master"}
    container = {
        "name": "locust",
        "image": "canarystack:0.1.0",
        "imagePullPolicy": "Never",
        "args": ["locust-master"],
        "resources": {"requests": {"cpu": "10m"}},
        "volumeMounts": [{"name": "records", "mountPath": "/records"}],
    }
    spec = {
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [{"name": "records", "persistentVolumeClaim": {"claimName": "nowhere"}}],
    }
    template = {"metadata": {"labels": labels}, "spec": spec}
    recreate(
        DEPLOYMENTS,
        _manifest(
            DEPLOYMENTS,
            "locust-master",
            {"replicas": 0, "selector": {"matchLabels": labels}, "template": template},
        ),
    )
    target = parse_target(
        {
            "kind": "kubernetes",
            "namespace": NS,
            "kubeconfig": str(KUBECONFIG),
            "urls": {"router": "http://127.0.0.1:1"},
            "blast_radius": {"namespaces": [NS]},
            "load_workers": {
                "master_port": 18999,
                "master": {"template": "deployment/locust-master", "bind_host": "127.0.0.1"},
            },
        }
    )
    assert isinstance(target, KubernetesTarget)
    return target


def test_a_master_pod_runs_stops_by_pid_hands_files_back_and_is_deleted(cluster: None) -> None:
    """The master pod is made from the template (its claim replaced by an emptyDir, a TTL
    of the run's bound plus the margin), runs the command given, hands its files back
    byte for byte, stops it by PID (SIGTERM: exit 143), and is gone once deleted."""
    master = _master_target().load_master(60.0)
    assert master is not None
    payload = "open('/tmp/gameday-load/x.bin','wb').write(bytes(range(256))*40)"
    master.start(["python", "-c", f"{payload}; import time; time.sleep(600)"])
    try:
        code, pod = admin_call("GET", f"/api/v1/namespaces/{NS}/pods/{master.name}")
        assert code == 200, pod
        assert pod["spec"]["activeDeadlineSeconds"] == 360  # 60 s run + 300 s margin
        assert pod["spec"]["restartPolicy"] == "Never"
        assert [v.get("emptyDir") is not None for v in pod["spec"]["volumes"]] == [True]
        deadline = time.monotonic() + 30
        while not master.has("/tmp/gameday-load/x.bin"):
            assert time.monotonic() < deadline, master.log_tail()
            time.sleep(0.2)
        assert master.read("/tmp/gameday-load/x.bin") == bytes(range(256)) * 40
        assert master.read("/tmp/gameday-load/none") is None
        assert master.exit_code() is None  # still running
        master.stop()
        while (code_now := master.exit_code()) is None:
            assert time.monotonic() < deadline + 30, master.log_tail()
            time.sleep(0.2)
        assert code_now == 143  # SIGTERM, sent to the PID its shell wrote
    finally:
        master.delete()
    deadline = time.monotonic() + 30
    while admin_call("GET", f"/api/v1/namespaces/{NS}/pods/{master.name}")[0] != 404:
        assert time.monotonic() < deadline, "the master pod was not deleted"
        time.sleep(0.2)


def test_a_master_pod_whose_locust_cannot_start_is_deleted_and_named(
    cluster: None, tmp_path: Path
) -> None:
    """A load that cannot start (the router is not there: the locustfile's start check
    fails, so the test never starts) raises LoadStartError naming the pod, and the pod is
    deleted — nothing of the run is left on the cluster."""
    target = _master_target()
    master = target.load_master(60.0)
    assert master is not None
    config = LoadConfig(
        host="http://127.0.0.1:1",
        output_dir=tmp_path,
        users=1,
        spawn_rate=1,
        duration_s=5,
        external_workers=1,
        master_port=18999,
        extra_args=["--no-such-option"],
    )
    with pytest.raises(LoadStartError, match=master.name):
        PodLoadRun(config, master).start(timeout_s=60)
    deadline = time.monotonic() + 30
    while admin_call("GET", f"/api/v1/namespaces/{NS}/pods/{master.name}")[0] != 404:
        assert time.monotonic() < deadline, "the master pod was not deleted"
        time.sleep(0.2)
