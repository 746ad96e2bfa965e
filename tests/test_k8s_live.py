"""The loopback Kubernetes cluster, live (issue #15): a real kube-apiserver, controller-manager,
scheduler, containerd and kubelet on 127.0.0.1, the canarystack image built without a Docker
engine, and the stack deployed with ``kubectl apply -k deploy/k8s/overlays/loopback``.

Needs root and, the first time, about 10 minutes to build the Kubernetes binaries into the
cache (deploy/loopback/build-k8s.sh). Skipped unless CANARY_GAMEDAY_K8S_LIVE=1, which
``make test-k8s`` sets. The module owns the cluster: it starts it (deploy/loopback/k8s-up.sh)
and its last test stops it (k8s-down.sh) and checks that nothing is left.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_render import LOOPBACK_PORTS
from tests.procs import pid_alive
from tests.run_support import slo_detail

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = REPO / "deploy" / "loopback"
STATE = Path(os.environ.get("K8S_STATE", REPO / ".k8s"))
KUBECONFIG = STATE / "kubeconfig"
KUBECTL = str(REPO / ".venv" / "bin" / "kubectl")
NS = "canarystack-loopback"
APISERVER = "https://127.0.0.1:" + os.environ.get("K8S_APISERVER_PORT", "16443")

RUN_LIVE = "run `make test-k8s` (sets CANARY_GAMEDAY_K8S_LIVE=1)"


def live_marks(timeout_s: int, how: str = RUN_LIVE) -> list[pytest.MarkDecorator]:
    """A live Kubernetes module's marks: ``k8s_live``, skipped unless
    CANARY_GAMEDAY_K8S_LIVE=1 (``how`` says how to run it), and its timeout."""
    return [
        pytest.mark.k8s_live,
        pytest.mark.skipif(
            os.environ.get("CANARY_GAMEDAY_K8S_LIVE") != "1",
            reason=f"live Kubernetes tests: {how}",
        ),
        pytest.mark.timeout(timeout_s),
    ]


pytestmark = live_marks(1800)


def run(*cmd: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def kubectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run(KUBECTL, "--kubeconfig", str(KUBECONFIG), *args, timeout=timeout)


def kubectl_json(*args: str) -> dict:
    res = kubectl(*args, "-o", "json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def api_get(path: str, token: str | None) -> int:
    """The HTTP status of GET path on the API server, with a bearer token or none."""
    return api_call("GET", path, token)


def api_call(method: str, path: str, token: str | None, body: bytes | None = None) -> int:
    """The HTTP status of METHOD path on the API server (a merge patch when PATCH)."""
    ctx = ssl.create_default_context(cafile=str(STATE / "certs" / "apiserver.crt"))
    req = urllib.request.Request(APISERVER + path, data=body, method=method)
    if method == "PATCH":
        req.add_header("Content-Type", "application/merge-patch+json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def recorded_pids() -> dict[str, int]:
    return {p.stem: int(p.read_text().strip()) for p in (STATE / "pids").glob("*.pid")}


def mounts_under(path: Path) -> list[str]:
    root = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == root or point.startswith(root + "/"):
            out.append(point)
    return out


def listening_sockets(pid: int) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that process pid holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addr, port = f[1].split(":")
                assert len(addr) == width
                found.append(f"{table}:{addr}:{int(port, 16)}")
    return found


LOOPBACK_ADDRS = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


@contextlib.contextmanager
def cluster_unless_up() -> Iterator[bool]:
    """The loopback cluster for a module that does not own it: started, and stopped
    after, only when it is not up already; whether this started it."""
    started = not recorded_pids() or not all(pid_alive(p) for p in recorded_pids().values())
    if started:
        res = run(str(LOOPBACK / "k8s-up.sh"), timeout=1500)
        assert res.returncode == 0, res.stderr[-3000:]
    yield started
    if started:
        run(str(LOOPBACK / "k8s-down.sh"), timeout=300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    res = run(str(LOOPBACK / "k8s-up.sh"), timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    yield
    # Safety net if a test failed before test_down_leaves_nothing ran.
    if any(pid_alive(p) for p in recorded_pids().values()):
        run(str(LOOPBACK / "k8s-down.sh"), timeout=300)


@pytest.fixture(scope="module")
def stack(cluster: None) -> None:
    res = run(str(LOOPBACK / "deploy-stack.sh"), "--timeout-s", "400", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_api_server_authenticates_and_authorizes(cluster: None) -> None:
    token = (STATE / "certs" / "admin-token").read_text().strip()
    assert api_get("/api/v1/nodes", None) == 401
    assert api_get("/api/v1/nodes", "not-a-token") == 401
    assert api_get("/api/v1/nodes", token) == 200
    # RBAC: a ServiceAccount with no role may not list pods.
    assert kubectl("-n", "default", "create", "serviceaccount", "nobody").returncode == 0
    assert api_get("/api/v1/namespaces/default/pods", sa_token("default", "nobody")) == 403


def test_the_node_is_a_real_kubelet_on_loopback(cluster: None) -> None:
    node = kubectl_json("get", "node", "localhost")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.20.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    # The API server reaches the kubelet by this address (--kubelet-preferred-address-types).
    assert {"type": "Hostname", "address": "localhost"} in node["status"]["addresses"]


def test_the_pods_cgroup_weighs_like_busy_host_tasks(stack: None) -> None:
    """k8s-up.sh gives containerd's cgroup k8s.io the CPU weight of 8 busy host tasks
    (cgroup v1: 8192 shares): at equal weight, every pod together competed with each busy
    host task, and a killed broker pod took 6 s to serve again on a loaded machine."""
    shares = Path("/sys/fs/cgroup/cpu/k8s.io/cpu.shares")
    if not shares.exists():
        pytest.skip("cgroup v1 only (cgroup v2: k8s.io/cpu.weight)")
    assert int(shares.read_text()) == int(os.environ.get("K8S_POD_CPU_SHARES", "8192"))
    pid = int(Path(STATE / "pids" / "containerd.pid").read_text())
    broker = [
        p for p in Path("/proc").iterdir()
        if p.name.isdigit() and b"canarystack.broker" in _cmdline(p)
    ]  # fmt: skip
    assert broker, "no broker process"
    cgroups = (broker[0] / "cgroup").read_text().splitlines()
    cpu = next(line for line in cgroups if ":cpu:" in line or ":cpu," in line)
    assert cpu.split(":", 2)[2].startswith("/k8s.io/"), (cpu, pid)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_every_cluster_process_listens_on_loopback_only(cluster: None) -> None:
    pids = recorded_pids()
    assert set(pids) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "containerd",
        "kubelet",
    }
    seen = 0
    for name, pid in pids.items():
        for sock in listening_sockets(pid):
            seen += 1
            addr = sock.split(":")[1]
            assert addr in LOOPBACK_ADDRS, f"{name} listens on {sock}"
    assert seen >= 4  # etcd (2), apiserver, kubelet (2), containerd's stream server


def test_stack_pods_run_the_local_image_and_are_ready(stack: None) -> None:
    pods = kubectl_json("-n", NS, "get", "pods")["items"]
    by_component: dict[str, list[dict]] = {}
    for p in pods:
        comp = p["metadata"]["labels"].get("app.kubernetes.io/component", "")
        by_component.setdefault(comp, []).append(p)
    for comp in [*LOOPBACK_PORTS, "redis"]:
        running = [p for p in by_component.get(comp, []) if p["status"]["phase"] == "Running"]
        # Two routers: the Deployments router and router-b (one node, host ports).
        assert len(running) == (2 if comp == "router" else 1), (
            f"{comp}: {[p['status']['phase'] for p in by_component.get(comp, [])]}"
        )
        for pod in running:
            cond = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            assert cond["Ready"] == "True", comp
            assert pod["spec"]["hostNetwork"] is True
            image = pod["status"]["containerStatuses"][0]["image"]
            assert image == "docker.io/library/canarystack:0.1.0"
    # release-init created the release on the broker (the Job completed).
    job = kubectl_json("-n", NS, "get", "job", "release-init")
    assert job["status"].get("succeeded") == 1
    # The broker's volume is the hostPath PersistentVolume k8s-up created.
    pvc = kubectl_json("-n", NS, "get", "pvc", "data-broker-0")
    assert pvc["status"]["phase"] == "Bound"
    assert pvc["spec"]["volumeName"] == "loopback-broker-data"


def test_stack_answers_on_its_loopback_ports(stack: None) -> None:
    for comp, port in LOOPBACK_PORTS.items():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200, comp
            body = json.loads(resp.read())
        assert body.get("status") == "ok", (comp, body)
    with urllib.request.urlopen("http://127.0.0.1:18001/v1/releases/default", timeout=10) as resp:
        release = json.loads(resp.read())
    assert release["name"] == "default"
    # Each router's own admin port; the model servers' Redis (Debian's redis-server in the
    # image) answers PING on 127.0.0.1:18020, and both model servers report it.
    for port in (18004, 18005):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert json.loads(resp.read())["status"] == "ok", port
    import socket

    with socket.create_connection(("127.0.0.1", 18020), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
    for port in (18010, 18011):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert json.loads(resp.read())["dependency"]["name"] == "redis", port


def test_a_killed_pod_is_replaced_by_its_replicaset(stack: None, tmp_path: Path) -> None:
    sel = "app.kubernetes.io/component=router,!canarystack.io/router-instance"  # not router-b
    before = kubectl_json("-n", NS, "get", "pods", "-l", sel)["items"]
    assert len(before) == 1
    old_uid = before[0]["metadata"]["uid"]
    # chaostoolkit-kubernetes terminate_pods, run by the Chaos Toolkit as an experiment.
    experiment = {
        "version": "1.0.0",
        "title": "A router pod killed on the loopback cluster is replaced",
        "description": "tests/test_k8s_live.py",
        "method": [
            {
                "type": "action",
                "name": "terminate-the-router-pod",
                "provider": {
                    "type": "python",
                    "module": "chaosk8s.pod.actions",
                    "func": "terminate_pods",
                    "arguments": {"label_selector": sel, "ns": NS, "qty": 1, "grace_period": 0},
                },
            }
        ],
    }
    (tmp_path / "kill.json").write_text(json.dumps(experiment))
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    res = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "chaos"),
            "--no-version-check",
            "run",
            "--no-validation",
            "--journal-path",
            str(tmp_path / "journal.json"),
            str(tmp_path / "kill.json"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert journal["status"] == "completed", res.stdout[-2000:] + res.stderr[-2000:]
    assert journal["run"][0]["status"] == "succeeded", journal["run"][0]
    res = kubectl("-n", NS, "rollout", "status", "deployment/router", "--timeout=120s", timeout=150)
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 120
    while True:
        pods = kubectl_json("-n", NS, "get", "pods", "-l", sel)["items"]
        ready = [
            p
            for p in pods
            if p["metadata"]["uid"] != old_uid
            and p["status"]["phase"] == "Running"
            and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]
            )
        ]
        if ready and all(p["metadata"]["uid"] != old_uid for p in pods):
            break
        assert time.monotonic() < deadline, [p["metadata"]["name"] for p in pods]
        time.sleep(1)
    with urllib.request.urlopen("http://127.0.0.1:18000/health", timeout=10) as resp:
        assert resp.status == 200


def sa_token(ns: str, name: str) -> str:
    """The token of ServiceAccount ns/name (1.20: a Secret the controller-manager makes)."""
    deadline = time.monotonic() + 30
    while True:
        sa = kubectl_json("-n", ns, "get", "serviceaccount", name)
        if sa.get("secrets") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sa.get("secrets"), f"the controller-manager gave {ns}/{name} no token"
    secret = kubectl_json("-n", ns, "get", "secret", sa["secrets"][0]["name"])
    return base64.b64decode(secret["data"]["token"]).decode()


def test_the_api_server_confines_the_chaos_runner_to_its_role(stack: None) -> None:
    """RBAC, enforced by the real API server (not only by the harness's blast radius): the
    chaos runner's ServiceAccount may list and delete pods in its namespace and patch the
    canary Deployment, and nothing else."""
    token = sa_token(NS, "chaos-runner")
    pods = f"/api/v1/namespaces/{NS}/pods"
    deploys = f"/apis/apps/v1/namespaces/{NS}/deployments"
    assert api_call("GET", pods, token) == 200
    # A kill outside its namespace, in kube-system, and of the API's own objects: refused.
    assert api_call("DELETE", "/api/v1/namespaces/default/pods/anything", token) == 403
    assert api_call("DELETE", "/api/v1/namespaces/kube-system/pods/anything", token) == 403
    assert api_call("GET", "/api/v1/namespaces/default/pods", token) == 403
    # Workloads: it may patch model-canary (a canary rollout), no other Deployment.
    dry = "?dryRun=All"
    assert api_call("PATCH", f"{deploys}/model-canary{dry}", token, b"{}") == 200
    assert api_call("PATCH", f"{deploys}/router{dry}", token, b"{}") == 403
    assert api_call("PATCH", f"{deploys}/model-baseline{dry}", token, b"{}") == 403
    assert api_call("DELETE", f"{deploys}/router{dry}", token) == 403
    # Nor may it read the credentials.
    assert api_call("GET", f"/api/v1/namespaces/{NS}/secrets", token) == 403


OTHER_NS = "canarystack-outside"


def test_rbac_refuses_a_real_kill_outside_the_namespace_and_of_unlisted_workloads(
    stack: None, tmp_path: Path
) -> None:
    """Issue #15 item 4, with real objects: the 403s come from the API server (its Status
    names the ServiceAccount), and the pods are still there afterwards.

    What the Role allows, exactly: list and delete ANY pod of its own namespace (RBAC
    cannot name a Deployment's pods: their names are generated, and a Role has no label
    selectors), get/list Deployments, StatefulSets and ReplicaSets, patch the Deployment
    model-canary only, get Rollouts and Canaries. So a kill of an unlisted workload's
    pod in the namespace (the gate's, model-baseline's) is refused by the harness's blast
    radius, before any API call; RBAC refuses everything that would remove or change an
    unlisted workload itself, and every pod outside the namespace."""
    from gameday.targets import load_target
    from gameday.targets.base import BlastRadiusError

    token = sa_token(NS, "chaos-runner")
    who = f"system:serviceaccount:{NS}:chaos-runner"
    # A real pod in another namespace (a node selector no node has: it stays Pending and
    # never runs, and no controller removes it): not killable.
    admin_call("POST", "/api/v1/namespaces", {"metadata": {"name": OTHER_NS}})
    victim = {"metadata": {"name": "victim", "namespace": OTHER_NS},
              "spec": {"nodeSelector": {"canarystack.io/nowhere": "true"}, "containers": [
                  {"name": "c", "image": "docker.io/library/canarystack:0.1.0"}]}}  # fmt: skip
    other_pods = f"/api/v1/namespaces/{OTHER_NS}/pods"
    admin_call("DELETE", f"{other_pods}/victim?gracePeriodSeconds=0")
    deadline = time.monotonic() + 30
    while admin_call("GET", f"{other_pods}/victim")[0] != 404:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    code, body = admin_call("POST", other_pods, victim)
    assert code == 201, body
    uid = body["metadata"]["uid"]
    code, status = api_call_json("DELETE", f"{other_pods}/victim?gracePeriodSeconds=0", token)
    assert code == 403 and status["reason"] == "Forbidden" and who in status["message"], status
    code, body = admin_call("GET", f"{other_pods}/victim")
    assert code == 200 and body["metadata"]["uid"] == uid and "deletionTimestamp" not in body[
        "metadata"]  # fmt: skip
    # Unlisted workloads in its own namespace: it may not remove, scale or change them.
    gate_pod = kubectl_json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=gate")
    (gate,) = [p for p in gate_pod["items"] if not p["metadata"].get("deletionTimestamp")]
    apps = f"/apis/apps/v1/namespaces/{NS}"
    refused: list[tuple[str, str, Any]] = [
        ("DELETE", f"{apps}/deployments/gate", None),
        ("DELETE", f"{apps}/deployments/model-baseline", None),
        ("DELETE", f"{apps}/statefulsets/broker", None),
        ("DELETE", f"{apps}/replicasets/{gate['metadata']['ownerReferences'][0]['name']}", None),
        ("PATCH", f"{apps}/deployments/gate", {"spec": {"replicas": 0}}),
        ("PATCH", f"{apps}/deployments/gate/scale", {"spec": {"replicas": 0}}),
        ("PATCH", f"{apps}/statefulsets/broker", {"spec": {"replicas": 0}}),
        ("POST", f"/api/v1/namespaces/{NS}/pods", victim | {"metadata": {"name": "x"}}),
        ("POST", f"/api/v1/namespaces/{NS}/pods/{gate['metadata']['name']}/eviction",
         {"apiVersion": "policy/v1beta1", "kind": "Eviction",
          "metadata": {"name": gate["metadata"]["name"]}}),
        ("DELETE", f"/api/v1/namespaces/{NS}/pods", None),  # deletecollection
    ]  # fmt: skip
    for method, path, body in refused:
        code, status = api_call_json(method, path + "?dryRun=All", token, body)
        assert code == 403 and who in status.get("message", ""), (method, path, code, status)
    # The edge: RBAC lets it delete the gate's pod (dry run here: nothing is deleted) ...
    gate_path = f"/api/v1/namespaces/{NS}/pods/{gate['metadata']['name']}"
    assert api_call_json("DELETE", gate_path + "?dryRun=All", token)[0] == 200
    # ... and the harness refuses it, before any API call: gate is not in the blast radius.
    target_file = yaml.safe_load((LOOPBACK / "target.yaml").read_text())
    assert "gate" not in target_file["blast_radius"]["components"]
    target_file["kubeconfig"] = str(KUBECONFIG)
    target_file["credentials_dir"] = str(REPO / target_file["credentials_dir"])
    target_path = tmp_path / "target.yaml"
    target_path.write_text(yaml.safe_dump(target_file))
    with pytest.raises(BlastRadiusError, match="gate"):
        load_target(target_path).kill_pod("gate")
    after = kubectl_json("-n", NS, "get", "pod", gate["metadata"]["name"])
    assert after["metadata"]["uid"] == gate["metadata"]["uid"]
    assert "deletionTimestamp" not in after["metadata"]
    admin_call("DELETE", f"/api/v1/namespaces/{OTHER_NS}")


def canary_health() -> dict:
    with urllib.request.urlopen("http://127.0.0.1:18011/health", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def canary_template_hash() -> str:
    pods = kubectl_json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=model-canary")
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in live]
    return str(live[0]["metadata"]["labels"]["pod-template-hash"])


def test_a_bad_build_is_a_real_rollout_and_its_undo_the_previous_replicaset(
    stack: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #15 item 4: probes.kubernetes.roll_out_bad_canary patches the canary
    Deployment's args with --kernel-fault (a new ReplicaSet, a new pod that IS the bad
    build), undo_canary_rollout brings back the previous ReplicaSet's template; the target
    reaches the host-network canary's own admin API at 127.0.0.1."""
    from gameday.targets import load_target
    from probes.kubernetes import roll_out_bad_canary, undo_canary_rollout

    target_file = yaml.safe_load((LOOPBACK / "target.yaml").read_text())
    target_file["kubeconfig"] = str(KUBECONFIG)
    target_file["credentials_dir"] = str(REPO / target_file["credentials_dir"])
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(target_file))
    cfg = {"gameday_target": str(tmp_path / "target.yaml"), "gameday_run_dir": str(tmp_path)}
    monkeypatch.setenv("KUBECONFIG", str(KUBECONFIG))
    (replica,) = load_target(tmp_path / "target.yaml").replicas("model-canary")
    assert replica.url == "http://127.0.0.1:18011"
    assert canary_health()["build_kernel_fault"] is None
    healthy = canary_template_hash()
    out = roll_out_bad_canary(kernel_fault="nan-logits:100", deadline_s=180, configuration=cfg)
    assert out["build"] == "kernel-fault=nan-logits:100"
    assert canary_template_hash() != healthy
    assert canary_health()["build_kernel_fault"] == "nan-logits:100"
    undone = undo_canary_rollout(deadline_s=180, configuration=cfg)
    assert undone["changed"] is True and undone["closed_ledger_entries"] == 1
    assert canary_template_hash() == healthy
    assert canary_health()["build_kernel_fault"] is None
    # idempotent: nothing left to undo
    assert undo_canary_rollout(configuration=cfg)["changed"] is False


# --- Argo Rollouts and Flagger: real objects of their CRDs on the live API server ------
# Their controllers cannot be obtained here. k8s-up.sh applies minimal CRDs with the real
# group, version, kind and status fields (deploy/loopback/crds/); these tests create real
# Rollout / Canary objects, write their status through the status subresource as the
# controller would (the test plays the controller, with the admin token), and read them with
# probes.progressive through the chaos runner's own token (the loopback overlay gives its
# Role get on them, deploy/k8s/components/progressive-delivery). The traffic the probes pair
# the status with is a load-records file written by the test.
ARGO_PATH = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts"
FLAGGER_PATH = f"/apis/flagger.app/v1beta1/namespaces/{NS}/canaries"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def admin_call(method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of METHOD path with the admin token; PATCH is a merge patch."""
    token = (STATE / "certs" / "admin-token").read_text().strip()
    return api_call_json(method, path, token, body)


def api_call_json(
    method: str, path: str, token: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(STATE / "certs" / "apiserver.crt"))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(APISERVER + path, data=data, method=method)
    kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
    req.add_header("Content-Type", kind)
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return int(resp.status), dict(json.loads(resp.read() or b"{}"))
    except urllib.error.HTTPError as e:
        return int(e.code), dict(json.loads(e.read() or b"{}"))


def recreate(path: str, obj: dict[str, Any]) -> str:
    """Create obj at path (collection), deleting a leftover of an earlier run first; the
    object's own path."""
    name = obj["metadata"]["name"]
    admin_call("DELETE", f"{path}/{name}")
    deadline = time.monotonic() + 30
    while admin_call("GET", f"{path}/{name}")[0] != 404:
        assert time.monotonic() < deadline, f"{path}/{name} was not deleted"
        time.sleep(0.2)
    code, body = admin_call("POST", path, obj)
    assert code == 201, body
    return f"{path}/{name}"


def probe_config(runner_config: dict[str, str]) -> tuple[dict[str, str], Path]:
    """The probes' configuration (the chaos runner's, less its token) and its run folder,
    where ``write_records`` puts the traffic the probes pair with a controller's status."""
    cfg = {k: v for k, v in runner_config.items() if k != "token"}
    return cfg, Path(cfg["gameday_run_dir"])


def write_status(path: str, status: dict[str, Any]) -> dict[str, Any]:
    """As the controller does: the status subresource, replaced as a whole."""
    code, body = admin_call("PATCH", f"{path}/status", {"status": None})
    assert code == 200, body
    code, body = admin_call("PATCH", f"{path}/status", {"status": status})
    assert code == 200, body
    return body


def write_records(run: Path, rows: list[tuple[float, str]]) -> None:
    """Load records (start_time, served_by) and a stopped load state in the run folder."""
    from gameday.load.records import LOAD_SCHEMA, ParquetSink

    for old in run.glob("records*.parquet"):
        old.unlink()
    path = run / f"records-{len(list(run.iterdir()))}.parquet"
    sink = ParquetSink(path, LOAD_SCHEMA)
    for i, (start, served_by) in enumerate(rows):
        sink.add({"request_id": f"r{i}", "start_time": start, "served_by": served_by,
                  "model_version": "v2" if served_by == "canary" else "v1", "ok": True,
                  "status": 200})  # fmt: skip
    sink.close()
    (run / "load.json").write_text(json.dumps({"state": "stopped", "records": str(path)}))


@pytest.fixture
def runner_config(stack: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The loopback target, but reaching the API server with the chaos runner's token."""
    token = sa_token(NS, "chaos-runner")
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "loopback", "cluster": {
            "server": APISERVER, "certificate-authority": str(STATE / "certs" / "apiserver.crt")}}],
        "users": [{"name": "chaos-runner", "user": {"token": token}}],
        "contexts": [{"name": "runner", "context": {"cluster": "loopback", "user": "chaos-runner",
                                                     "namespace": NS}}],
        "current-context": "runner",
    }  # fmt: skip
    (tmp_path / "runner.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    target = yaml.safe_load((LOOPBACK / "target.yaml").read_text())
    target["kubeconfig"] = str(tmp_path / "runner.kubeconfig")
    target["credentials_dir"] = str(REPO / target["credentials_dir"])
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(target))
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "runner.kubeconfig"))  # restored after
    return {
        "gameday_target": str(tmp_path / "target.yaml"),
        "gameday_run_dir": str(tmp_path / "run"),
        "token": token,
    }


def test_the_argo_rollouts_and_flagger_crds_are_live(stack: None) -> None:
    for name, group, version, kind in (
        ("rollouts.argoproj.io", "argoproj.io", "v1alpha1", "Rollout"),
        ("canaries.flagger.app", "flagger.app", "v1beta1", "Canary"),
    ):
        crd = kubectl_json("get", "crd", name)
        cond = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert cond["Established"] == "True", (name, cond)
        assert crd["spec"]["group"] == group
        assert crd["spec"]["names"]["kind"] == kind
        (served,) = crd["spec"]["versions"]
        assert served["name"] == version and served["subresources"]["status"] == {}
        res = kubectl("api-resources", f"--api-group={group}", "-o", "name")
        assert res.returncode == 0 and name in res.stdout.split(), res.stdout + res.stderr


def test_argo_rollout_probe_reads_live_rollouts_and_pairs_them_with_traffic(
    runner_config: dict[str, str], tmp_path: Path
) -> None:
    from probes import progressive

    cfg, run = probe_config(runner_config)
    path = recreate(ARGO_PATH, {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "llm-server", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm-server"}},
                 "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {}}]}}},
    })  # fmt: skip
    # A Rollout no controller has touched: no status at all.
    assert progressive.argo_rollout_status("llm-server", cfg)["phase"] is None
    # The controller progresses the canary to 20 %: not aborted, and the check says so.
    now = time.time()
    write_status(path, {
        "phase": "Progressing", "abort": False, "currentPodHash": "5d8f",
        "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                        "lastTransitionTime": rfc3339(now - 60)}],
        "canary": {"weights": {"canary": {"weight": 20}, "stable": {"weight": 80}}},
    })  # fmt: skip
    out = progressive.argo_rollout_aborted("llm-server", timeout_s=0, configuration=cfg)
    assert out["ok"] is False and "'Progressing'" in slo_detail(out)["why"], out
    # The real API server validates the status against the CRD's schema.
    code, body = admin_call(
        "PATCH",
        f"{path}/status",
        {"status": {"canary": {"weights": {"canary": {"weight": "all"}}}}},
    )
    assert code == 422 and body["reason"] == "Invalid", body
    # Aborted, but the canary keeps 20 % of the traffic: the controller failed open.
    aborted_at = float(int(time.time()))
    aborted: dict[str, Any] = {
        "phase": "Degraded", "abort": True, "abortedAt": rfc3339(aborted_at),
        "message": "RolloutAborted: Rollout aborted update to revision 2",
        "conditions": [{"type": "Progressing", "status": "False", "reason": "RolloutAborted",
                        "lastTransitionTime": rfc3339(aborted_at)}],
        "canary": {"weights": {"canary": {"weight": 20}, "stable": {"weight": 80}}},
    }  # fmt: skip
    write_status(path, aborted)
    out = progressive.argo_rollout_aborted("llm-server", configuration=cfg)
    assert (
        out["ok"] is False
        and "weight 20" in slo_detail(out)["why"]
        and "failed open" in slo_detail(out)["why"]
    ), out
    # Aborted with weight 0; the canary served only before the abort plus grace: a pass.
    aborted["canary"]["weights"] = {"canary": {"weight": 0}, "stable": {"weight": 100}}
    write_status(path, aborted)
    write_records(run, [(aborted_at - 3, "canary"), (aborted_at + 2, "canary"),
                        (aborted_at + 6, "baseline"), (aborted_at + 8, "baseline")])  # fmt: skip
    out = progressive.argo_rollout_aborted("llm-server", grace_s=5, configuration=cfg)
    assert out["ok"] is True and out["measured"] == 0, out
    assert slo_detail(out)["controller"]["aborted_at"] == aborted_at
    # The same status, but a canary-served request 10 s after the abort: failed open.
    write_records(run, [(aborted_at + 6, "baseline"), (aborted_at + 10, "canary")])
    out = progressive.argo_rollout_aborted("llm-server", grace_s=5, configuration=cfg)
    assert (
        out["ok"] is False and out["measured"] == 1 and "failed open" in slo_detail(out)["why"]
    ), out
    # The probes only read: the chaos runner may not write a Rollout's status or spec.
    token = runner_config["token"]
    assert api_call_json("PATCH", f"{path}/status", token, {"status": {"abort": False}})[0] == 403
    assert api_call_json("PATCH", path, token, {"spec": {"replicas": 2}})[0] == 403
    assert api_call_json("GET", ARGO_PATH, token)[0] == 403  # get one by name, never list


def test_flagger_canary_probe_reads_live_canaries_and_pairs_them_with_traffic(
    runner_config: dict[str, str],
) -> None:
    from probes import progressive

    cfg, run = probe_config(runner_config)
    path = recreate(FLAGGER_PATH, {
        "apiVersion": "flagger.app/v1beta1", "kind": "Canary",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": "model-canary"},
                 "analysis": {"interval": "10s", "threshold": 5, "maxWeight": 50,
                              "stepWeight": 10}},
    })  # fmt: skip
    now = time.time()
    write_status(path, {
        "phase": "Progressing", "canaryWeight": 10, "failedChecks": 1, "iterations": 0,
        "lastTransitionTime": rfc3339(now - 30),
        "conditions": [{"type": "Promoted", "status": "Unknown", "reason": "Progressing",
                        "message": "New revision detected, progressing canary analysis.",
                        "lastTransitionTime": rfc3339(now - 30)}],
    })  # fmt: skip
    view = progressive.flagger_canary_status("llm", cfg)
    assert (view["phase"], view["canary_weight"], view["failed_checks"]) == ("Progressing", 10, 1)
    out = progressive.flagger_canary_failed("llm", timeout_s=0, configuration=cfg)
    assert out["ok"] is False and "'Progressing'" in slo_detail(out)["why"], out
    # Flagger's phases are an enum in its CRD: the real API server refuses another.
    code, body = admin_call("PATCH", f"{path}/status", {"status": {"phase": "Exploded"}})
    assert code == 422 and body["reason"] == "Invalid", body
    # Failed, but the canary keeps its weight: failed open.
    failed_at = float(int(time.time()))
    failed = {
        "phase": "Failed", "canaryWeight": 10, "failedChecks": 5, "iterations": 0,
        "lastTransitionTime": rfc3339(failed_at),
        "conditions": [{"type": "Promoted", "status": "False", "reason": "Failed",
                        "message": "Canary analysis failed, Deployment scaled to zero.",
                        "lastTransitionTime": rfc3339(failed_at)}],
    }  # fmt: skip
    write_status(path, failed)
    out = progressive.flagger_canary_failed("llm", configuration=cfg)
    assert out["ok"] is False and "weight 10" in slo_detail(out)["why"], out
    failed["canaryWeight"] = 0
    write_status(path, failed)
    write_records(run, [(failed_at + 1, "canary"), (failed_at + 7, "baseline")])
    out = progressive.flagger_canary_failed("llm", grace_s=5, configuration=cfg)
    assert out["ok"] is True and out["measured"] == 0, out
    # No request at all after the failure is no evidence: fail closed.
    write_records(run, [(failed_at - 1, "baseline")])
    out = progressive.flagger_canary_failed("llm", grace_s=5, configuration=cfg)
    assert (
        out["ok"] is False and out["measured"] is None and "no request" in slo_detail(out)["why"]
    ), out
    token = runner_config["token"]
    assert (
        api_call_json("PATCH", f"{path}/status", token, {"status": {"phase": "Succeeded"}})[0]
        == 403
    )


def test_a_real_prometheus_scrapes_every_pod_of_the_live_stack(
    runner_config: dict[str, str], tmp_path: Path
) -> None:
    """#15 item 5 on the cluster: Debian's Prometheus scrapes every pod the target lists
    (through the API server, with the chaos runner's token), each with its job, namespace
    and (model servers) variant label, and every one is up."""
    import requests

    from gameday.prom import start_for_target, stop_in, wait_for_targets
    from gameday.targets import load_target

    target = load_target(runner_config["gameday_target"])
    workdir = tmp_path / "prom"
    prom = start_for_target(target, workdir)
    try:
        targets = wait_for_targets(prom.url, timeout_s=90)
        labels = [t["labels"] for t in targets]
        assert {"router", "model", "gate", "broker", "rollback"} <= {x["job"] for x in labels}
        assert all(x.get("namespace") == NS for x in labels)
        assert {x.get("variant") for x in labels if x["job"] == "model"} == {
            "baseline",
            "canary",
        }
        assert sum(1 for x in labels if x["job"] == "router") == 2  # router and router-b
        answer = requests.get(
            prom.url + "/api/v1/query",
            params={"query": 'count(up{job="model"} == 1) by (variant)'},
            timeout=10,
        ).json()
        assert {r["metric"]["variant"] for r in answer["data"]["result"]} == {"baseline", "canary"}
    finally:
        assert stop_in(workdir)


def test_down_leaves_nothing(cluster: None) -> None:
    pids = recorded_pids()
    assert pids
    # Containerd's shims, by the PIDs containerd recorded in its state folder.
    shims = [
        int(p.read_text())
        for p in (STATE / "containerd" / "state").glob("io.containerd.runtime.v2.task/*/*/shim.pid")
    ]
    res = run(str(LOOPBACK / "k8s-down.sh"), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [n for n, p in pids.items() if pid_alive(p)] == []
    assert [p for p in shims if pid_alive(p)] == []
    assert mounts_under(STATE) == []
    assert list((STATE / "pids").glob("*.pid")) == []
    # A second down is harmless.
    assert run(str(LOOPBACK / "k8s-down.sh"), timeout=60).returncode == 0
