"""The loopback overlay (deploy/k8s/overlays/loopback), rendered offline: what the live
cluster of tests/test_k8s_live.py depends on, checked in ``make test`` without a cluster.

The loopback cluster is Kubernetes 1.20 with no kube-proxy, no DNS and no pod network, and
every byte must stay on 127.0.0.1; a base change that breaks one of these would only show
on the live cluster otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_render import (
    K8S,
    LOOPBACK_PORTS,
    NO_KUBECTL,
    REPO,
    STACK,
    by_kind,
    copy_with_token,
    kubectl,
    pod_spec,
    render,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason=NO_KUBECTL)

# Each server's workload kind and its port.
SERVERS = {role: (STACK[role][0], port) for role, port in LOOPBACK_PORTS.items()}
# The two router Deployments' own admin (instance) ports; both serve users on 18000.
ROUTER_ADMIN_PORTS = {"router": 18004, "router-b": 18005}
# API versions a 1.20 API server serves for the kinds the overlay renders.
V120 = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1beta1",
    "PodDisruptionBudget": "policy/v1beta1",
    "NetworkPolicy": "networking.k8s.io/v1",
}


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    k8s = copy_with_token(tmp_path_factory.mktemp("loopback"), "t" * 32, "loopback")
    return render(k8s / "overlays" / "loopback")


def server(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    kind, _ = SERVERS[component]
    found = [
        d
        for d in by_kind(docs, kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        and d["metadata"]["name"] == component  # router-b: test_two_routers_share_the_front_port
    ]
    assert len(found) == 1, component
    return found[0]


def test_the_broker_reviews_router_tokens_at_the_loopback_api_server(
    docs: list[dict[str, Any]],
) -> None:
    # No kube-proxy: the broker reaches the API server where k8s-up.sh starts it.
    common = (REPO / "deploy" / "loopback" / "common.sh").read_text()
    port = re.search(r"APISERVER_PORT=\$\{K8S_APISERVER_PORT:-(\d+)\}", common)
    assert port is not None
    (container,) = server(docs, "broker")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--router-identity") + 1] == "kubernetes"
    assert args[args.index("--kube-api") + 1] == f"https://127.0.0.1:{port.group(1)}"


def test_every_object_uses_an_api_version_kubernetes_1_20_serves(
    docs: list[dict[str, Any]],
) -> None:
    assert {(d["kind"], d["apiVersion"]) for d in docs} <= set(V120.items())
    cron = by_kind(docs, "CronJob")
    assert cron and all("timeZone" not in c["spec"] for c in cron)  # not in 1.20


@pytest.mark.parametrize("component", sorted(SERVERS))
def test_servers_listen_on_their_own_loopback_port_on_the_host_network(
    docs: list[dict[str, Any]], component: str
) -> None:
    doc = server(docs, component)
    _, port = SERVERS[component]
    spec = pod_spec(doc)
    assert spec["hostNetwork"] is True
    c = spec["containers"][0]
    args = c["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert "0.0.0.0" not in args
    assert args[args.index("--port") + 1] == str(port)
    # The router's pod declares (and is probed on) its instance port, 18004.
    own = ROUTER_ADMIN_PORTS["router"] if component == "router" else port
    assert [p["containerPort"] for p in c["ports"]] == [own]
    # The kubelet probes a host-network pod at the node's address: it must probe loopback.
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["host"] == "127.0.0.1", probe
    assert c["imagePullPolicy"] == "Never"
    assert c["image"] == "docker.io/library/canarystack:0.1.0"
    if doc["kind"] == "Deployment":
        # One node, one host port: two pods of one Deployment cannot run at once.
        assert doc["spec"]["replicas"] == 1
        assert doc["spec"]["strategy"] == {"type": "Recreate"}


def test_ports_are_distinct_and_the_urls_point_at_them(docs: list[dict[str, Any]]) -> None:
    ports = [p for _, p in SERVERS.values()]
    assert len(set(ports)) == len(ports)
    config = next(d for d in docs if d["metadata"]["name"] == "canarystack-config")["data"]
    assert config["BROKER_URL"] == "http://127.0.0.1:18001"
    assert config["GATE_URL"] == "http://127.0.0.1:18002"
    assert config["ROUTER_URL"] == "http://127.0.0.1:18000"
    assert config["BASELINE_URLS"] == "http://127.0.0.1:18010"
    assert config["CANARY_URLS"] == "http://127.0.0.1:18011"
    # No component is configured with a Service name (no DNS on this cluster).
    for key, value in config.items():
        if key.endswith(("_URL", "_URLS")):
            assert value.startswith("http://127.0.0.1:"), key


def test_the_chaos_runner_target_agrees_with_the_overlay(docs: list[dict[str, Any]]) -> None:
    cm = next(d for d in docs if d["metadata"]["name"] == "gameday-target")
    target = yaml.safe_load(cm["data"]["target.yaml"])
    ns = by_kind(docs, "Namespace")[0]["metadata"]["name"]
    assert target["namespace"] == ns == "canarystack-loopback"
    assert target["blast_radius"]["namespaces"] == [ns]
    for component, (_, port) in SERVERS.items():
        assert target["ports"][component] == port
        if component in target["urls"]:
            assert target["urls"][component] == f"http://127.0.0.1:{port}"


def test_release_init_reaches_the_broker_on_loopback(docs: list[dict[str, Any]]) -> None:
    job = next(d for d in by_kind(docs, "Job") if d["metadata"]["name"] == "release-init")
    assert pod_spec(job)["hostNetwork"] is True
    assert pod_spec(job)["containers"][0]["imagePullPolicy"] == "Never"


def test_the_overlay_keeps_its_generated_credentials_out_of_git() -> None:
    ignored = (Path(K8S) / "overlays" / "loopback" / ".gitignore").read_text().split()
    assert "admin-token" in ignored
    assert "credentials/" in ignored


def test_redis_is_on_its_own_loopback_port_and_the_model_servers_use_it(
    docs: list[dict[str, Any]],
) -> None:
    """Issue #16 item 1 on the loopback cluster: the Redis Deployment listens on
    127.0.0.1:18020 on the host network, probed there, and both model Deployments are
    started with --redis-url pointing at it (no DNS for the Service name here)."""
    (redis,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "redis"]
    spec = pod_spec(redis)
    assert spec["hostNetwork"] is True
    (c,) = spec["containers"]
    assert c["command"] == ["redis-server"]
    args = c["args"]
    assert args[args.index("--port") + 1] == "18020"
    assert args[args.index("--bind") + 1] == "127.0.0.1"
    assert "0.0.0.0" not in args
    assert [p["containerPort"] for p in c["ports"]] == [18020]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["tcpSocket"]["host"] == "127.0.0.1", probe
    assert c["imagePullPolicy"] == "Never"
    assert redis["spec"]["strategy"] == {"type": "Recreate"}
    assert 18020 not in [p for _, p in SERVERS.values()]
    for model in ("model-baseline", "model-canary"):
        margs = pod_spec(server(docs, model))["containers"][0]["args"]
        assert margs[margs.index("--redis-url") + 1] == "redis://127.0.0.1:18020", model


def test_the_chaos_runner_may_read_argo_rollouts_and_flagger_canaries_here(
    docs: list[dict[str, Any]],
) -> None:
    """The live tests read Rollouts and Canaries with the runner's own token: the loopback
    overlay adds the progressive-delivery component (get only) to its Role."""
    (role,) = by_kind(docs, "Role")
    extra = [r for r in role["rules"] if r["apiGroups"] != [""] and r["apiGroups"] != ["apps"]]
    assert extra == [
        {"apiGroups": ["argoproj.io"], "resources": ["rollouts"], "verbs": ["get"]},
        {"apiGroups": ["flagger.app"], "resources": ["canaries"], "verbs": ["get"]},
    ]


def test_two_routers_share_the_front_port_and_each_has_its_own_admin_port(
    docs: list[dict[str, Any]],
) -> None:
    """One node and host ports: the second router is a second Deployment (router-b.yaml),
    the base's router Deployment copied; both serve 127.0.0.1:18000 with --reuse-port, so
    a killed router loses only its own streams, and each pod's admin API is on its own
    instance port, which the canarystack.io/admin-port annotation tells the harness."""
    routers = {
        d["metadata"]["name"]: d
        for d in by_kind(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "router"
    }
    assert set(routers) == set(ROUTER_ADMIN_PORTS)
    for name, admin in ROUTER_ADMIN_PORTS.items():
        dep = routers[name]
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
        c = pod_spec(dep)["containers"][0]
        args = c["args"]
        assert args[args.index("--port") + 1] == "18000" and "--reuse-port" in args
        assert args[args.index("--instance-port") + 1] == str(admin)
        assert [p["containerPort"] for p in c["ports"]] == [admin]  # never 18000: host ports
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["canarystack.io/admin-port"] == str(admin)
        assert annotations["prometheus.io/port"] == str(admin)
    # router-b never claims router's pods: its selector has one more label.
    a, b = (routers[n]["spec"]["selector"]["matchLabels"] for n in ("router", "router-b"))
    assert a.items() < b.items()
    # router-b.yaml is the base's router Deployment but for its name, replicas and label.
    base = next(
        d
        for d in yaml.safe_load_all((Path(K8S) / "base" / "stack" / "router.yaml").read_text())
        if d and d["kind"] == "Deployment"
    )
    copy = yaml.safe_load((Path(K8S) / "overlays" / "loopback" / "router-b.yaml").read_text())
    copy["metadata"]["name"] = base["metadata"]["name"]
    copy["spec"]["replicas"] = base["spec"]["replicas"]
    del copy["spec"]["selector"]["matchLabels"]["canarystack.io/router-instance"]
    del copy["spec"]["template"]["metadata"]["labels"]["canarystack.io/router-instance"]
    assert copy == base
    # The harness's target lists both Deployments as the router's workloads.
    cm = next(d for d in docs if d["metadata"]["name"] == "gameday-target")
    target = yaml.safe_load(cm["data"]["target.yaml"])
    assert target["workloads"]["router"] == "deployment/router,deployment/router-b"
    local = yaml.safe_load((Path(K8S).parent / "loopback" / "target.yaml").read_text())
    assert local["workloads"] == target["workloads"]
