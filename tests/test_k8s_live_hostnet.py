"""Per-replica URLs on a host-network cluster (issue #15 item 4), against the FAKED
Kubernetes API of tests/k8s_fake.py (real HTTP, offline: runs in ``make test``).

On the loopback cluster (deploy/loopback) the stack's pods use the host network and bind
127.0.0.1; a host-network pod's IP is the node's address, where nothing of the stack
listens. The target must reach such a replica at 127.0.0.1 and a pod-network replica at
its pod IP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gameday.targets import load_target
from gameday.targets.kubernetes import KubernetesTarget
from tests.k8s_fake import FakeApi, pod, serve_fake

NS = "stack"


def labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": role}


def host_network(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["hostNetwork"] = True
    return body


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApi]:
    api = FakeApi()
    # The node's address, as the kubelet reports it for a host-network pod.
    api.add_pod(host_network(pod("router-a", labels("router"), "192.0.2.7")))
    api.add_pod(host_network(pod("model-canary-a", labels("model-canary"), "192.0.2.7")))
    api.add_pod(pod("gate-a", labels("gate"), "10.0.3.1"))
    yield from serve_fake(api, tmp_path, monkeypatch)


def k8s_target(tmp_path: Path) -> KubernetesTarget:
    path = tmp_path / "target.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kind": "kubernetes",
                "name": "loopback",
                "namespace": NS,
                "urls": {"router": "http://127.0.0.1:18000"},
                "ports": {"router": 18000, "model-canary": 18011, "gate": 8000},
                "blast_radius": {"namespaces": [NS], "components": ["router"]},
            }
        )
    )
    target = load_target(path)
    assert isinstance(target, KubernetesTarget)
    return target


def reached_at(target: KubernetesTarget, role: str) -> list[tuple[str, str]]:
    """(replica name, the URL the harness reaches it at) for each replica of ``role``."""
    return [(r.name, r.url) for r in target.replicas(role)]


def test_a_host_network_replica_is_reached_at_127_0_0_1_not_its_node_address(
    fake: FakeApi, tmp_path: Path
) -> None:
    target = k8s_target(tmp_path)
    assert reached_at(target, "router") == [("router-a", "http://127.0.0.1:18000")]
    assert reached_at(target, "model-canary") == [("model-canary-a", "http://127.0.0.1:18011")]


def test_a_pod_network_replica_is_still_reached_at_its_pod_ip(
    fake: FakeApi, tmp_path: Path
) -> None:
    assert reached_at(k8s_target(tmp_path), "gate") == [("gate-a", "http://10.0.3.1:8000")]


def test_the_host_side_loopback_target_is_the_runner_pods_but_for_host_side_settings() -> None:
    repo = Path(__file__).resolve().parents[1]
    host = yaml.safe_load((repo / "deploy/loopback/target.yaml").read_text())
    pod_side = yaml.safe_load((repo / "deploy/k8s/overlays/loopback/target.yaml").read_text())
    assert host.pop("kubeconfig") == ".k8s/kubeconfig"
    assert host.pop("credentials_dir") == "deploy/k8s/overlays/loopback/credentials"
    assert pod_side.pop("credentials_dir") == "/var/run/canarystack/credentials"
    # Only from this machine does the load come from Locust pods (workers, and a master
    # pod made from locust-master's template); the runner pod runs its Locust in the pod.
    assert host.pop("load_workers") == {
        "workload": "deployment/locust-worker",
        "replicas": 2,
        "master_port": 18030,
        "master": {"template": "deployment/locust-master", "bind_host": "127.0.0.1"},
    }
    assert host == pod_side
    target = load_target(repo / "deploy/loopback/target.yaml")
    assert isinstance(target, KubernetesTarget) and target.namespace == "canarystack-loopback"
