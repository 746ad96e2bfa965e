"""deploy/k8s, rendered with kustomize and checked offline (no cluster is reachable here).

- the base and the staging overlay (with the progressive-delivery component) render, and
  staging refuses to render without its git-ignored admin-token file;
- every rendered object, and the one-off objects in deploy/k8s/jobs, validates against
  the Kubernetes JSON schemas shipped with kubernetes-validate (strict: no unknown
  fields), for the oldest and the newest Kubernetes version we claim;
- RBAC: one namespaced Role with exactly the listed rules, bound to the chaos runner's
  ServiceAccount only; no ClusterRole/ClusterRoleBinding, no wildcard anywhere;
- workloads: the labels the experiments select on (gameday.targets.kubernetes), replica
  counts, /health probes, requests and limits, non-root and read-only root filesystems;
- NetworkPolicies, evaluated for a matrix of who connects to whom;
- the chaos runner's target file agrees with the render (namespace, Services, selectors,
  workloads); the model versions in the ConfigMap agree with the Deployments; the base's
  token is the placeholder the entrypoint refuses; the one-off Job is the CronJob's job.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gameday.targets.base import parse_target
from gameday.targets.kubernetes import DEFAULT_SELECTORS, KubernetesTarget
from tests.k8s_render import (
    CREDENTIALS,
    K8S,
    NO_KUBECTL,
    STACK,
    by_kind,
    copy_with_token,
    credential_token,
    kubectl,
    kustomize,
    one,
    pod_labels,
    pod_spec,
    render,
)

pytestmark = pytest.mark.skipif(kubectl() is None, reason=NO_KUBECTL)

# The oldest Kubernetes we claim (CronJob timeZone is GA since 1.27) and the newest the
# installed kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
TEST_TOKEN = "0123456789abcdef0123456789abcdef-test"
PLACEHOLDER = "REPLACE-ME-create-the-secret-see-deploy-k8s-README"
ROLE_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
    # replicasets: a pod kill checks pod -> ReplicaSet -> Deployment (ownerReferences)
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"],
     "verbs": ["get", "list"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["model-canary"],
     "verbs": ["patch"]},
]  # fmt: skip
PROGRESSIVE_RULES = [
    {"apiGroups": ["argoproj.io"], "resources": ["rollouts"], "verbs": ["get"]},
    {"apiGroups": ["flagger.app"], "resources": ["canaries"], "verbs": ["get"]},
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    k8s = copy_with_token(tmp_path_factory.mktemp("render"), TEST_TOKEN)
    return {"base": render(k8s / "base"), "staging": render(k8s / "overlays" / "staging")}


@pytest.fixture(params=["base", "staging"])
def env(request: pytest.FixtureRequest) -> str:
    """Each rendered environment in turn (a test that takes ``env`` runs for both)."""
    return str(request.param)


def namespace_of(docs: list[dict[str, Any]]) -> str:
    (ns,) = by_kind(docs, "Namespace")
    return str(ns["metadata"]["name"])


def test_renders_and_staging_needs_its_token_file(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assert namespace_of(rendered["base"]) == "canarystack"
    assert namespace_of(rendered["staging"]) == "canarystack-staging"
    for docs in rendered.values():
        ns = namespace_of(docs)
        cluster_scoped = ("Namespace", "ClusterRoleBinding")
        assert all(
            d["metadata"].get("namespace") == ns for d in docs if d["kind"] not in cluster_scoped
        )
        # The broker's token-review grant names the ServiceAccount of this build's namespace.
        (review,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
        assert review["roleRef"]["name"] == "system:auth-delegator"
        assert review["subjects"] == [
            {"kind": "ServiceAccount", "name": "canarystack-broker", "namespace": ns}
        ]
    # as on a fresh checkout (the token file is git-ignored): staging does not render
    k8s = copy_with_token(tmp_path, TEST_TOKEN)
    (k8s / "overlays" / "staging" / "admin-token").unlink()
    done = kustomize(k8s / "overlays" / "staging")
    assert done.returncode != 0 and "admin-token" in done.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], version: str
) -> None:
    jobs = [yaml.safe_load(p.read_text()) for p in sorted((K8S / "jobs").glob("*.yaml"))]
    errors = []
    for name, docs in [*rendered.items(), ("jobs", jobs)]:
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{name}: {doc['kind']}/{doc['metadata'].get('name')}: {exc}")
    assert not errors, "\n".join(errors)
    assert len(rendered["base"]) >= 30


def test_rbac_is_one_namespaced_role_with_exactly_the_listed_rules(
    rendered: dict[str, list[dict[str, Any]]], env: str
) -> None:
    docs = rendered[env]
    ns = namespace_of(docs)
    kinds = {d["kind"] for d in docs}
    assert "ClusterRole" not in kinds
    # One cluster-wide grant: the broker may create TokenReviews (router identity, #27).
    (review,) = by_kind(docs, "ClusterRoleBinding")
    assert review["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "system:auth-delegator"}  # fmt: skip
    assert review["subjects"] == [{"kind": "ServiceAccount", "name": "canarystack-broker",
                                   "namespace": ns}]  # fmt: skip
    (role,) = by_kind(docs, "Role")
    expected = ROLE_RULES + (PROGRESSIVE_RULES if env == "staging" else [])
    assert role["rules"] == expected
    for rule in role["rules"]:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(key, []), rule
        assert not {"create", "update", "deletecollection", "escalate", "bind", "impersonate",
                    "watch"} & set(rule["verbs"])  # fmt: skip
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chaos-runner",
                                    "namespace": ns}]  # fmt: skip
    # only the chaos runner's pods and the broker get an API token; the routers run as
    # canarystack-router with no API token (only their projected broker token); every
    # other pod has none
    accounts = {"chaos-runner": "chaos-runner", "broker": "canarystack-broker"}
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob"):
            spec = pod_spec(doc)
            component = pod_labels(doc).get("app.kubernetes.io/component")
            api = component in accounts
            assert spec.get("automountServiceAccountToken") is api, doc["metadata"]["name"]
            account = accounts.get(str(component))
            if component == "router":
                account = "canarystack-router"
            assert spec.get("serviceAccountName") == account, doc["metadata"]["name"]


def test_workloads_carry_the_labels_replicas_probes_and_limits(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["base"]
    for role, (kind, replicas) in STACK.items():
        doc = one(docs, kind, role)
        assert doc["spec"]["replicas"] == replicas
        labels = pod_labels(doc)
        wanted = dict(term.split("=") for term in DEFAULT_SELECTORS[role].split(","))
        assert wanted.items() <= labels.items(), (role, labels)
        assert doc["spec"]["selector"]["matchLabels"] == wanted
        (container,) = pod_spec(doc)["containers"]
        assert container["args"][:2] == ["serve", "model" if role.startswith("model") else role]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
        assert set(container["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert pod_spec(doc)["securityContext"]["runAsNonRoot"] is True
        service = one(docs, "Service", role)
        assert service["spec"]["selector"] == wanted
    broker = one(docs, "StatefulSet", "broker")
    assert broker["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": dict(
        term.split("=") for term in DEFAULT_SELECTORS["router"].split(","))}}  # fmt: skip
    # Locust: a master and workers running the same image and locustfile roles
    master = one(docs, "Deployment", "locust-master")
    worker = one(docs, "Deployment", "locust-worker")
    assert pod_spec(master)["containers"][0]["args"][0] == "locust-master"
    assert pod_spec(worker)["containers"][0]["args"][0] == "locust-worker"
    # no load at deploy time; a run scales the workers to what the master expects
    assert master["spec"]["replicas"] == 0 and worker["spec"]["replicas"] == 0
    master_env = {e["name"]: e.get("value") for e in pod_spec(master)["containers"][0]["env"]}
    assert master_env["LOCUST_EXPECT_WORKERS"] == "2"
    cron = one(docs, "CronJob", "gameday")
    assert cron["spec"]["suspend"] is True and cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert one(rendered["staging"], "CronJob", "gameday")["spec"]["suspend"] is False


# --- NetworkPolicies -------------------------------------------------------------------
def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def allowed(policies: list[dict[str, Any]], src: dict[str, str], dst: dict[str, str],
            port: int) -> bool:  # fmt: skip
    """Ingress from a pod of the same namespace, as NetworkPolicy semantics define it."""
    isolating = [
        p for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], dst)
    ]  # fmt: skip
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(
                "podSelector" in peer and "namespaceSelector" not in peer
                and selects(peer["podSelector"], src)
                for peer in peers
            ):  # fmt: skip
                return True
    return False


def test_network_policies_let_only_the_router_reach_models_and_the_runner_reach_admin(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["base"]
    policies = by_kind(docs, "NetworkPolicy")
    pods = {
        pod_labels(d)["app.kubernetes.io/component"]: pod_labels(d)
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob")
    }
    pods["client"] = {"canarystack.io/client": "true"}
    pods["stranger"] = {"app": "something-else"}
    yes = {
        ("router", "model-baseline"), ("router", "model-canary"), ("router", "broker"),
        ("router", "gate"), ("gate", "broker"), ("rollback", "broker"),
        ("release-init", "broker"), ("client", "router"), ("locust-worker", "router"),
        ("locust-master", "router"),
        *{("chaos-runner", r) for r in ("router", "model-baseline", "model-canary", "broker",
                                        "gate", "rollback")},
    }  # fmt: skip
    targets = ["router", "model-baseline", "model-canary", "broker", "gate", "rollback",
               "chaos-runner", "locust-worker"]  # fmt: skip
    wrong = []
    for src, src_labels in pods.items():
        for dst in targets:
            if src == dst:
                continue
            got = allowed(policies, src_labels, pods[dst], 8000)
            if got != ((src, dst) in yes):
                wrong.append(f"{src} -> {dst}: {'allowed' if got else 'denied'}")
    assert not wrong, wrong
    master = pods["locust-master"]
    assert allowed(policies, pods["locust-worker"], master, 5557)
    assert not allowed(policies, pods["router"], master, 5557)
    assert not allowed(policies, pods["locust-worker"], master, 8089)


# --- consistency -----------------------------------------------------------------------
def test_the_chaos_runners_target_file_agrees_with_the_render(
    rendered: dict[str, list[dict[str, Any]]], env: str
) -> None:
    docs = rendered[env]
    ns = namespace_of(docs)
    data = yaml.safe_load(one(docs, "ConfigMap", "gameday-target")["data"]["target.yaml"])
    target = parse_target(data, source=f"{env} target")
    assert isinstance(target, KubernetesTarget)
    assert target.namespace == ns and target.blast_radius.namespaces == [ns]
    target.check_namespace()  # allowed
    assert {"gate", "model-baseline"}.isdisjoint(target.blast_radius.components)
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    for role, url in target.spec.urls.items():
        parts = urlsplit(url)
        assert parts.hostname in services and services[parts.hostname]["spec"]["ports"][0][
            "port"] == parts.port, (role, url)  # fmt: skip
    for role, (kind, _) in STACK.items():
        assert target.selector(role) == DEFAULT_SELECTORS[role]
        assert target.workload(role) == (kind.lower(), role)
        (container,) = pod_spec(one(docs, kind, role))["containers"]
        assert target.spec.ports.get(role, 8000) == container["ports"][0]["containerPort"]
    runner = pod_spec(one(docs, "CronJob", "gameday"))
    mounts = {m["name"]: m["mountPath"] for m in runner["containers"][0]["volumeMounts"]}
    assert target.spec.credentials_dir == mounts["credentials"]
    # The chaos runner holds the operator's and the fault credentials, nothing a stack pod
    # holds for its own work (docs/ARCHITECTURE.md §8).
    (volume,) = [v for v in runner["volumes"] if v["name"] == "credentials"]
    held = {src["secret"]["items"][0]["path"] for src in volume["projected"]["sources"]}
    roles = ("router", "broker", "gate", "rollback", "model-baseline", "model-canary")
    assert held == {"operator"} | {f"faults-{r}" for r in roles}


def test_versions_secrets_and_the_one_off_job_agree(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["base"]
    config = one(docs, "ConfigMap", "canarystack-config")["data"]
    for role, key in (("model-baseline", "STABLE_VERSION"), ("model-canary", "CANARY_VERSION")):
        annotations = one(docs, "Deployment", role)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["canarystack.io/model-version"] == config[key]
    (secret,) = by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "canarystack-admin-token"
    import base64

    def token(s: dict[str, Any]) -> str:
        if "stringData" in s:
            return str(s["stringData"]["token"])
        return base64.b64decode(s["data"]["token"]).decode().strip()

    assert token(secret) == PLACEHOLDER
    entrypoint = (K8S.parent / "entrypoint.sh").read_text()
    assert f'PLACEHOLDER="{PLACEHOLDER}"' in entrypoint
    staging = {s["metadata"]["name"]: token(s) for s in by_kind(rendered["staging"], "Secret")}
    assert staging.pop("canarystack-admin-token") == TEST_TOKEN
    # One Secret per credential, each from its own file (docs/ARCHITECTURE.md §8).
    assert staging == {f"canarystack-{n}": credential_token(TEST_TOKEN, n) for n in CREDENTIALS}
    # deploy/k8s/jobs/gameday-now.yaml is the CronJob's job (same pod, same limits)
    job = yaml.safe_load((K8S / "jobs" / "gameday-now.yaml").read_text())
    cron = copy.deepcopy(one(docs, "CronJob", "gameday")["spec"]["jobTemplate"])
    assert job["metadata"]["labels"] == cron["metadata"]["labels"]
    assert job["spec"] == cron["spec"]


# What each stack pod may hold (docs/ARCHITECTURE.md §8): its own fault credential and
# the credentials of its role, nothing else.
POD_CREDENTIALS = {
    ("StatefulSet", "broker"): {"faults-broker", "operator", "trip", "rollback", "heartbeat"},
    # The router's heartbeat credential is its own service-account token (below), not the
    # shared heartbeat Secret.
    ("Deployment", "router"): {"faults-router", "samples"},
    ("Deployment", "gate"): {"faults-gate", "trip", "samples"},
    ("Deployment", "rollback"): {"faults-rollback", "rollback", "operator"},
    ("Deployment", "model-baseline"): {"faults-model-baseline"},
    ("Deployment", "model-canary"): {"faults-model-canary"},
    ("Job", "release-init"): {"operator"},
}


def _mounted_credentials(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(credential names mounted, Secret names referenced) by a workload's pod."""
    spec = pod_spec(doc)
    names: set[str] = set()
    secrets: set[str] = set()
    for vol in spec.get("volumes", []):
        if "secret" in vol:
            secrets.add(vol["secret"]["secretName"])
        for src in vol.get("projected", {}).get("sources", []):
            if "secret" in src:
                secrets.add(src["secret"]["name"])
                names.update(item["path"] for item in src["secret"].get("items", []))
    return names, secrets


def test_each_stack_pod_mounts_only_its_own_credentials(
    rendered: dict[str, list[dict[str, Any]]], env: str
) -> None:
    docs = rendered[env]
    for (kind, name), expected in POD_CREDENTIALS.items():
        doc = one(docs, kind, name)
        names, secrets = _mounted_credentials(doc)
        assert names == expected, (name, names)
        tokens = [
            src["serviceAccountToken"]
            for vol in pod_spec(doc).get("volumes", [])
            for src in vol.get("projected", {}).get("sources", [])
            if "serviceAccountToken" in src
        ]
        if name == "router":
            assert tokens == [{"audience": "canarystack-broker", "expirationSeconds": 3600,
                               "path": "broker-token"}]  # fmt: skip
            (container,) = pod_spec(doc)["containers"]
            args = container["args"]
            token_file = args[args.index("--broker-token-file") + 1]
            assert token_file == "/var/run/canarystack/credentials/broker-token"
        else:
            assert tokens == [], name
        assert secrets == {f"canarystack-{n}" for n in expected}, (name, secrets)
        (container,) = pod_spec(doc)["containers"]
        env_vars = {e["name"]: e.get("value") for e in container.get("env", [])}
        own = "operator" if name == "release-init" else f"faults-{name}"
        assert env_vars["CANARYSTACK_ADMIN_TOKEN_FILE"] == f"/var/run/canarystack/credentials/{own}"
        # Every credential path in the args is one the pod mounts.
        for arg in container["args"]:
            if str(arg).startswith("/var/run/canarystack/credentials/"):
                mounted = expected | ({"broker-token"} if tokens else set())
                assert str(arg).rsplit("/", 1)[1] in mounted, (name, arg)
    if env == "staging":
        generated = {s["metadata"]["name"] for s in by_kind(docs, "Secret")}
        assert {f"canarystack-{n}" for n in CREDENTIALS} <= generated


def test_the_canary_model_pod_holds_only_its_own_fault_credential(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    doc = one(rendered["staging"], "Deployment", "model-canary")
    names, secrets = _mounted_credentials(doc)
    assert names == {"faults-model-canary"} and secrets == {"canarystack-faults-model-canary"}
    (container,) = pod_spec(doc)["containers"]
    assert "canarystack-admin-token" not in str(pod_spec(doc)) and "envFrom" in container
    assert all("secret" not in str(e).lower() for e in container.get("envFrom", []))


def test_no_secret_value_is_committed() -> None:
    ignored = (K8S / "overlays" / "staging" / ".gitignore").read_text().split()
    assert "admin-token" in ignored
    for path in K8S.rglob("*.yaml"):
        text = path.read_text()
        assert "BEGIN PRIVATE KEY" not in text and "kind: Secret" not in text, path


# --- the shared dependency (issue #16) -------------------------------------------------
def test_redis_is_a_deployment_only_the_model_servers_may_reach(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Redis from the canarystack image (Debian's redis-server), probed, limited, non-root,
    without persistence; its Service is what both model Deployments' --redis-url name;
    the NetworkPolicies let only the model servers connect to it."""
    docs = rendered["base"]
    redis = one(docs, "Deployment", "redis")
    wanted = {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": "redis"}
    assert redis["spec"]["selector"]["matchLabels"] == wanted
    (c,) = pod_spec(redis)["containers"]
    assert c["image"] == "canarystack:0.1.0" and c["command"] == ["redis-server"]
    args = c["args"]
    assert args[args.index("--port") + 1] == "6379"
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["tcpSocket"] == {"port": "redis"}
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod_spec(redis)["securityContext"]["runAsNonRoot"] is True
    service = one(docs, "Service", "redis")
    assert service["spec"]["selector"] == wanted
    assert service["spec"]["ports"][0]["port"] == 6379
    for model in ("model-baseline", "model-canary"):
        margs = pod_spec(one(docs, "Deployment", model))["containers"][0]["args"]
        assert margs[margs.index("--redis-url") + 1] == "redis://redis:6379", model
    policies = by_kind(docs, "NetworkPolicy")
    pods = {
        pod_labels(d)["app.kubernetes.io/component"]: pod_labels(d)
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob")
    }
    reach = {src for src, labels in pods.items() if src != "redis"
             and allowed(policies, labels, pods["redis"], 6379)}  # fmt: skip
    assert reach == {"model-baseline", "model-canary"}
    assert not allowed(policies, pods["model-canary"], pods["redis"], 8000)
