"""The Kubernetes target against a FAKED Kubernetes API (tests/k8s_fake.py, real HTTP).

- ``replicas`` lists the role's pods by label selector and keeps the serving ones;
- ``kill_pod`` goes through chaostoolkit-kubernetes ``terminate_pods``: exactly one pod,
  the chosen one, deleted with grace period 0; the ledger (through ``gameday.faults`` and
  the ``probes.faults.kill_pod`` action) names it;
- ``kube-system``, unlisted namespaces and components outside the blast radius are
  refused before any API request (the fake server sees none);
- API errors (403 from RBAC) come back as TargetError naming the call;
- blast radius by identity (#12 item 8): a pod is killed only when its controller is the
  role's workload (ReplicaSet → Deployment, or StatefulSet, UIDs compared); empty label
  selectors are refused before any request.

chaostoolkit-kubernetes falls back to ``$KUBERNETES_HOST`` when no kubeconfig exists, so
the tests point ``$KUBECONFIG`` at a missing file and ``$KUBERNETES_HOST`` at the fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gameday import faults as gd_faults
from gameday.targets import BlastRadiusError, TargetError, load_target
from gameday.targets.kubernetes import DEFAULT_SELECTORS, KubernetesTarget
from tests.k8s_fake import FakeApi, pod, serve_fake, workload

NS = "stack"


def labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": role}


def ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def owned(body: dict[str, Any], kind: str, name: str, uid: str) -> dict[str, Any]:
    """A pod (or ReplicaSet) body whose controller is ``kind/name`` with ``uid``."""
    body["metadata"]["ownerReferences"] = [ref(kind, name, uid)]
    return body


def replicaset(api: FakeApi, name: str, deployment: str, dep_uid: str, uid: str) -> None:
    """A ReplicaSet owned by ``deployment`` (the fake serves it as apps/v1 replicasets)."""
    api.workloads[(NS, "replicasets", name)] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "ownerReferences": [ref("Deployment", deployment, dep_uid)],
        },
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": deployment}}},
    }


def deployment(api: FakeApi, name: str, uid: str, desired: int = 1, ready: int = 1) -> None:
    body = workload("Deployment", name, desired=desired, ready=ready)
    body["metadata"]["uid"] = uid
    api.add_workload(body)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApi]:
    api = FakeApi()
    router_rs = ("ReplicaSet", "router-7d9", "uid-rs-router")
    api.add_pod(owned(pod("router-7d9-b", labels("router"), "10.0.0.12"), *router_rs))
    api.add_pod(owned(pod("router-7d9-a", labels("router"), "10.0.0.11"), *router_rs))
    api.add_pod(pod("router-7d9-c", labels("router"), "10.0.0.13", phase="Pending"))
    api.add_pod(pod("router-7d9-0", labels("router"), "10.0.0.10", terminating=True))
    canary_rs = ("ReplicaSet", "model-canary-5f", "uid-rs-canary")
    api.add_pod(owned(pod("model-canary-1", labels("model-canary"), "10.0.1.1"), *canary_rs))
    api.add_pod(pod("other-app", {"app": "other"}, "10.0.9.9"))
    api.add_pod(pod("router-elsewhere", labels("router"), "10.1.0.1", namespace="prod"))
    deployment(api, "router", "uid-dep-router", desired=2, ready=1)
    replicaset(api, "router-7d9", "router", "uid-dep-router", "uid-rs-router")
    deployment(api, "model-canary", "uid-dep-canary")
    replicaset(api, "model-canary-5f", "model-canary", "uid-dep-canary", "uid-rs-canary")
    broker = workload("StatefulSet", "broker", desired=1, ready=1)
    broker["metadata"]["uid"] = "uid-sts-broker"
    api.add_workload(broker)
    monkeypatch.setenv("CANARYSTACK_ADMIN_TOKEN", "t0k3n")
    yield from serve_fake(api, tmp_path, monkeypatch)


def target_file(tmp_path: Path, **overrides: Any) -> Path:
    data: dict[str, Any] = {
        "kind": "kubernetes",
        "name": "staging",
        "namespace": NS,
        "urls": {"broker": "http://127.0.0.1:9", "router": "http://127.0.0.1:9"},
        "blast_radius": {"namespaces": [NS], "components": ["router", "broker", "model-canary"]},
    }
    data.update(overrides)
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def k8s_target(tmp_path: Path, **overrides: Any) -> KubernetesTarget:
    target = load_target(target_file(tmp_path, **overrides))
    assert isinstance(target, KubernetesTarget)
    return target


def test_replicas_are_the_serving_pods_of_the_role_with_their_own_urls(
    fake: FakeApi, tmp_path: Path
) -> None:
    target = k8s_target(tmp_path, ports={"router": 8080})
    reps = target.replicas("router")
    assert [(r.name, r.url) for r in reps] == [
        ("router-7d9-a", "http://10.0.0.11:8080"),
        ("router-7d9-b", "http://10.0.0.12:8080"),
    ]
    (req,) = fake.api_requests()
    assert (req.method, req.path) == ("GET", f"/api/v1/namespaces/{NS}/pods")
    assert req.query["labelSelector"] == DEFAULT_SELECTORS["router"]


def test_kill_pod_deletes_exactly_the_first_serving_pod_with_grace_0(
    fake: FakeApi, tmp_path: Path
) -> None:
    target = k8s_target(tmp_path)
    killed = target.kill_pod("router")
    assert killed.name == "router-7d9-a"
    assert killed.detail["namespace"] == NS and killed.detail["grace_period_s"] == 0
    assert killed.detail["pod_ip"] == "10.0.0.11"
    deletes = [s for s in fake.seen if s.method == "DELETE"]
    assert [(d.path, d.body["gracePeriodSeconds"]) for d in deletes] == [
        (f"/api/v1/namespaces/{NS}/pods/router-7d9-a", 0)
    ]
    # terminate_pods listed by the role's label selector, in the target's namespace only
    lists = [s for s in fake.seen if s.method == "GET" and s.path.endswith("/pods")]
    assert {s.query.get("labelSelector") for s in lists} == {DEFAULT_SELECTORS["router"]}
    # before the delete, the pod's owner chain was read: its ReplicaSet and Deployment
    reads = [s.path for s in fake.seen if s.method == "GET" and not s.path.endswith("/pods")]
    assert reads == [
        f"/apis/apps/v1/namespaces/{NS}/replicasets/router-7d9",
        f"/apis/apps/v1/namespaces/{NS}/deployments/router",
    ]
    assert all(
        s.path.startswith((f"/api/v1/namespaces/{NS}/", f"/apis/apps/v1/namespaces/{NS}/"))
        for s in fake.seen
    )
    # the pod is gone; its sibling and the other namespace's router are untouched
    assert [r.name for r in target.replicas("router")] == ["router-7d9-b"]
    assert "router-elsewhere" in fake.pods["prod"]


def test_kill_pod_by_name_and_through_the_fault_ledger(fake: FakeApi, tmp_path: Path) -> None:
    target = k8s_target(tmp_path)
    book = gd_faults.FaultLedger(tmp_path / "faults.jsonl")
    entry = gd_faults.kill_pod(target, "router", "router-7d9-b", ledger=book)
    assert entry.replica == "router-7d9-b" and entry.kind == "pod-kill"
    assert [e.replica for e in book.entries()] == ["router-7d9-b"]
    assert "router-7d9-b" not in fake.pods[NS] and "router-7d9-a" in fake.pods[NS]


def test_probes_faults_kill_pod_action_on_a_kubernetes_target(
    fake: FakeApi, tmp_path: Path
) -> None:
    from probes.faults import kill_pod

    run = tmp_path / "run"
    config = {"gameday_target": str(target_file(tmp_path)), "gameday_run_dir": str(run)}
    out = kill_pod("model-canary", configuration=config)
    assert out["replica"] == "model-canary-1" and out["component"] == "model-canary"
    assert "model-canary-1" not in fake.pods[NS]
    assert '"replica": "model-canary-1"' in (run / "faults.jsonl").read_text()


def deletes(fake: FakeApi) -> list[str]:
    return [s.path for s in fake.seen if s.method == "DELETE"]


def refuses_to_kill(
    fake: FakeApi, target: KubernetesTarget, role: str, replica: str | None, says: str
) -> None:
    """Killing ``replica`` of ``role`` (None: the first serving pod) is a TargetError
    matching ``says``, and no pod has been deleted."""
    with pytest.raises(TargetError, match=says):
        target.kill_pod(role, replica)
    assert deletes(fake) == []


def test_kill_pod_of_an_unknown_replica_names_the_pods_and_deletes_nothing(
    fake: FakeApi, tmp_path: Path
) -> None:
    target = k8s_target(tmp_path)
    says = r"no pod 'router-x'.*router-7d9-a, router-7d9-b"
    refuses_to_kill(fake, target, "router", "router-x", says)
    refuses_to_kill(fake, target, "broker", None, "no running pod of broker")


@pytest.mark.parametrize(
    ("namespace", "allowed", "message"),
    [
        ("kube-system", ["kube-system"], "namespace 'kube-system' is never a blast radius"),
        ("kube-public", ["kube-public"], "is never a blast radius"),
        ("prod", ["stack"], r"namespace 'prod' is outside the blast radius .*allowed: stack"),
        ("stack", [], r"namespace 'stack' is outside the blast radius .*allowed: none"),
    ],
)
def test_forbidden_and_unlisted_namespaces_are_refused_before_any_api_request(
    fake: FakeApi, tmp_path: Path, namespace: str, allowed: list[str], message: str
) -> None:
    target = k8s_target(
        tmp_path,
        namespace=namespace,
        blast_radius={"namespaces": allowed, "components": ["router", "model-canary"]},
    )
    calls = [
        lambda: target.kill_pod("router"),
        lambda: target.replicas("router"),
        lambda: target.workload_status("router"),
        lambda: gd_faults.kill_pod(target, "router"),
        lambda: gd_faults.inject(target, "model-canary", "latency", 10, {"ttft_ms": 5}),
    ]
    for call in calls:
        with pytest.raises(BlastRadiusError, match=message):
            call()
    assert fake.seen == []


def test_component_outside_the_blast_radius_is_refused_before_any_request(
    fake: FakeApi, tmp_path: Path
) -> None:
    target = k8s_target(tmp_path)
    with pytest.raises(BlastRadiusError, match="component gate is outside the blast radius"):
        target.kill_pod("gate")
    assert fake.seen == []


def test_workload_status_reads_deployments_and_statefulsets(fake: FakeApi, tmp_path: Path) -> None:
    target = k8s_target(tmp_path)
    assert target.workload_status("router") == {
        "kind": "deployment", "name": "router", "namespace": NS,
        "desired": 2, "ready": 1, "ok": False,
    }  # fmt: skip
    assert target.workload_status("broker")["ok"] is True
    paths = [s.path for s in fake.seen]
    assert paths == [
        f"/apis/apps/v1/namespaces/{NS}/deployments/router",
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/broker",
    ]


@pytest.mark.parametrize(
    ("spec", "call", "says"),
    [
        ("daemonset/router", "workload_status", r"workloads.router is 'daemonset/router'"),
        ("deployment/router,", "workloads", r"or several separated by commas"),
    ],
)
def test_a_bad_workloads_entry_is_a_target_error(
    fake: FakeApi, tmp_path: Path, spec: str, call: str, says: str
) -> None:
    bad = k8s_target(tmp_path, workloads={"router": spec})
    with pytest.raises(TargetError, match=says):
        getattr(bad, call)("router")


def test_rbac_denial_is_a_target_error_that_points_at_the_role(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.forbidden.add(("DELETE", f"/api/v1/namespaces/{NS}/pods/"))
    target = k8s_target(tmp_path)
    with pytest.raises(TargetError, match=r"deleting pod 'router-7d9-a'.*HTTP 403.*Role"):
        target.kill_pod("router")
    assert "router-7d9-a" in fake.pods[NS]


def test_a_bare_pod_with_the_roles_labels_is_not_killed(fake: FakeApi, tmp_path: Path) -> None:
    fake.add_pod(pod("router-0-impostor", labels("router"), "10.0.0.9"))  # sorts first
    target = k8s_target(tmp_path)
    says = (
        r"refusing to kill pod 'router-0-impostor' as router: it has no controlling "
        r"owner \(a bare pod\), so it is not a pod of deployment/router"
    )
    refuses_to_kill(fake, target, "router", None, says)
    assert "router-0-impostor" in fake.pods[NS]


def test_a_pod_of_another_workload_is_not_killed(fake: FakeApi, tmp_path: Path) -> None:
    # same labels, but its ReplicaSet belongs to the Deployment "payments"
    deployment(fake, "payments", "uid-dep-payments")
    replicaset(fake, "payments-66", "payments", "uid-dep-payments", "uid-rs-payments")
    stray = owned(pod("router-0-payments", labels("router"), "10.0.0.8"),
                  "ReplicaSet", "payments-66", "uid-rs-payments")  # fmt: skip
    fake.add_pod(stray)
    target = k8s_target(tmp_path)
    says = r"its ReplicaSet payments-66 is owned by Deployment/payments"
    refuses_to_kill(fake, target, "router", "router-0-payments", says)
    # a ReplicaSet of the right name but another UID (recreated, or a name clash) is refused
    fake.pods[NS]["router-7d9-a"]["metadata"]["ownerReferences"][0]["uid"] = "uid-old"
    says = r"its ReplicaSet router-7d9 has another UID"
    refuses_to_kill(fake, target, "router", "router-7d9-a", says)
    # a pod whose controller is a StatefulSet, for a Deployment role
    fake.add_pod(owned(pod("router-9", labels("router"), "10.0.0.7"), "StatefulSet", "router", "u"))
    says = r"its controller is StatefulSet/router, not a ReplicaSet"
    refuses_to_kill(fake, target, "router", "router-9", says)


def test_a_statefulset_pod_is_killed_only_when_its_statefulset_is_the_roles(
    fake: FakeApi, tmp_path: Path
) -> None:
    fake.add_pod(owned(pod("broker-0", labels("broker"), "10.0.2.1"),
                       "StatefulSet", "broker", "uid-sts-broker"))  # fmt: skip
    fake.add_pod(owned(pod("broker-1", labels("broker"), "10.0.2.2"),
                       "StatefulSet", "cache", "uid-sts-cache"))  # fmt: skip
    target = k8s_target(tmp_path)
    refuses_to_kill(fake, target, "broker", "broker-1", r"its controller is StatefulSet/cache")
    killed = target.kill_pod("broker", "broker-0")
    assert killed.detail["workload"] == "statefulset/broker"
    assert deletes(fake) == [f"/api/v1/namespaces/{NS}/pods/broker-0"]


@pytest.mark.parametrize("selector", ["", "  ", ",", "app.kubernetes.io/component!=gate"])
def test_a_selector_that_does_not_narrow_is_refused_before_any_request(
    fake: FakeApi, tmp_path: Path, selector: str
) -> None:
    target = k8s_target(tmp_path, selectors={"router": selector})
    for call in (lambda: target.kill_pod("router"), lambda: target.replicas("router")):
        with pytest.raises(TargetError, match=r"selectors.router is .*does not narrow the pods"):
            call()
    assert fake.seen == []


# --- several workloads per role, each pod's own admin port (the loopback overlay's two
# router Deployments share the front port by SO_REUSEPORT) --------------------------------
def router_b(fake: FakeApi) -> None:
    """A second router Deployment, router-b, whose pod serves its admin API on 18005."""
    deployment(fake, "router-b", "uid-dep-router-b", desired=1, ready=1)
    replicaset(fake, "router-b-5c", "router-b", "uid-dep-router-b", "uid-rs-router-b")
    body = owned(pod("router-b-5c-x", labels("router"), "10.0.0.21"),
                 "ReplicaSet", "router-b-5c", "uid-rs-router-b")  # fmt: skip
    body["metadata"]["annotations"] = {"canarystack.io/admin-port": "18005"}
    fake.add_pod(body)


def test_a_role_with_two_workloads_kills_and_counts_the_pods_of_both(
    fake: FakeApi, tmp_path: Path
) -> None:
    router_b(fake)
    # Listed: router-b's pod is the role's, and the status sums both Deployments.
    both = k8s_target(tmp_path, workloads={"router": "deployment/router, deployment/router-b"})
    assert both.workloads("router") == [("deployment", "router"), ("deployment", "router-b")]
    status = both.workload_status("router")
    assert (status["desired"], status["ready"], status["ok"]) == (3, 2, False)
    assert [w["name"] for w in status["workloads"]] == ["router", "router-b"]
    killed = both.kill_pod("router", "router-b-5c-x")
    assert killed.name == "router-b-5c-x"
    assert deletes(fake) == [f"/api/v1/namespaces/{NS}/pods/router-b-5c-x"]


def test_a_pod_of_an_unlisted_second_workload_is_not_killed(fake: FakeApi, tmp_path: Path) -> None:
    router_b(fake)
    only = k8s_target(tmp_path)  # workloads.router: deployment/router (the default)
    says = r"its ReplicaSet router-b-5c is owned by Deployment/router-b"
    refuses_to_kill(fake, only, "router", "router-b-5c-x", says)


def test_a_pods_admin_port_annotation_wins_over_the_roles_port(
    fake: FakeApi, tmp_path: Path
) -> None:
    router_b(fake)
    target = k8s_target(tmp_path, ports={"router": 18004})
    urls = {r.name: r.url for r in target.replicas("router")}
    assert urls["router-b-5c-x"] == "http://10.0.0.21:18005"
    assert urls["router-7d9-a"] == "http://10.0.0.11:18004"
    fake.pods[NS]["router-b-5c-x"]["metadata"]["annotations"] = {
        "canarystack.io/admin-port": "80000"
    }
    with pytest.raises(TargetError, match=r"canarystack.io/admin-port='80000' is not a TCP port"):
        target.replicas("router")
