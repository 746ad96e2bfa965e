"""A Kubernetes namespace as a target (``KubernetesTarget``).

Over 400 lines because it is one target: its replicas, kills and checks share the API client.
This module never acts on a namespace other than the target's (never a ``kube-*`` one),
and never deletes anything but one pod of the role's own workload.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, TypedDict

from gameday.evidence.workloads import WorkloadStatus
from gameday.targets.base import (
    ROLES,
    BlastRadiusError,
    KilledPod,
    KubernetesTargetSpec,
    Replica,
    Target,
    TargetDescription,
    TargetError,
)
from gameday.targets.locust_master import MasterPod


class ScaledWorkers(TypedDict):
    """The Locust worker Deployment a target scaled, to how many, and when."""

    workload: str
    replicas: int
    time: float


# Never a blast radius, whatever a target file says.
FORBIDDEN_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

DEFAULT_SELECTORS = {
    role: f"app.kubernetes.io/part-of=canarystack,app.kubernetes.io/component={role}"
    for role in ROLES
}
DEFAULT_PORTS = {role: 8000 for role in ROLES}
# The workload that owns each role's pods (deploy/k8s): KIND/NAME.
DEFAULT_WORKLOADS = {
    "router": "deployment/router",
    "broker": "statefulset/broker",
    "gate": "deployment/gate",
    "rollback": "deployment/rollback",
    "model-baseline": "deployment/model-baseline",
    "model-canary": "deployment/model-canary",
}
WORKLOAD_KINDS = ("deployment", "statefulset")
# A pod template annotation that overrides ``ports[role]`` for that workload's pods: where
# each pod's own admin API listens when several workloads share a role (the loopback
# overlay's two router Deployments share the front port 18000 by SO_REUSEPORT and each
# serves its admin API on its own instance port).
ADMIN_PORT_ANNOTATION = "canarystack.io/admin-port"
# A host-network pod's replica URL (see _address).
HOST_NETWORK_ADDRESS = "127.0.0.1"


def _is_serving(pod: Any) -> bool:
    """A pod that can take an admin call: Running, with an IP, not being deleted."""
    status = getattr(pod, "status", None)
    meta = getattr(pod, "metadata", None)
    return bool(
        status is not None
        and status.phase == "Running"
        and status.pod_ip
        and meta is not None
        and meta.deletion_timestamp is None
    )


def _address(pod: Any) -> str:
    """Where a replica's own admin API is reached: its pod IP, or 127.0.0.1 for a
    host-network pod. A host-network pod's IP is its node's address, and the servers of
    a host-network stack (deploy/k8s/overlays/loopback) bind 127.0.0.1 only: the pod IP
    would reach nothing, or whatever else listens on the node's address. Never any other
    address than 127.0.0.1 for such a pod."""
    spec = getattr(pod, "spec", None)
    if spec is not None and getattr(spec, "host_network", None):
        return HOST_NETWORK_ADDRESS
    return str(pod.status.pod_ip)


class KubernetesTarget(Target):
    """A namespace of a cluster, reached through the Kubernetes API.

    Services are reached through the URLs in the target file; a replica's own admin API
    through its pod IP and the role's container port (127.0.0.1 for a pod with
    ``spec.hostNetwork``, whose pod IP is the node's address where the loopback overlay's
    servers do not listen) (pods listed with the role's label
    selector through the Kubernetes API). Pod kills use chaostoolkit-kubernetes
    ``terminate_pods`` on the role's label selector narrowed to one pod by name, so the same
    experiments run as a chaos runner Job in the cluster (``CHAOSTOOLKIT_IN_POD=true``) or
    from a machine with a kubeconfig that reaches the pod IPs.

    The namespace is checked before any Kubernetes API call: ``kube-system`` (and the other
    ``kube-*`` system namespaces) always, and every namespace not listed in
    ``blast_radius.namespaces`` of the target file, are refused with ``BlastRadiusError``.
    This module never acts on a namespace other than the target's, and never deletes
    anything but one pod that the role's selector matches *and* that belongs to the role's
    workload: a label is a name anyone can give a pod, so before a kill the pod's controller
    (``ownerReferences``) must be the ReplicaSet of the role's Deployment, or its StatefulSet,
    as named under ``workloads`` in the target file (UIDs compared). An empty label selector
    (it matches every pod in the namespace) is refused.
    """

    kind = "kubernetes"
    spec_model = KubernetesTargetSpec

    def __init__(self, spec: KubernetesTargetSpec) -> None:
        super().__init__(spec)
        self.spec = spec
        self.release = spec.release
        self.namespace = spec.namespace

    # -- blast radius ------------------------------------------------------------
    def check_namespace(self) -> str:
        """The target's namespace, or BlastRadiusError (before any API call)."""
        ns = self.namespace
        if ns in FORBIDDEN_NAMESPACES:
            raise BlastRadiusError(
                f"namespace {ns!r} is never a blast radius: game days run in the namespace "
                f"of the stack under test, never in {', '.join(FORBIDDEN_NAMESPACES)}. "
                f"Set 'namespace' in the target file {self.name!r} to the stack's namespace."
            )
        if ns not in self.blast_radius.namespaces:
            listed = ", ".join(self.blast_radius.namespaces) or "none"
            raise BlastRadiusError(
                f"namespace {ns!r} is outside the blast radius of target {self.name!r} "
                f"(allowed: {listed}). Add it to blast_radius.namespaces in the target file."
            )
        return ns

    def check_allowed(self, component: str) -> list[str]:
        self.check_namespace()
        return super().check_allowed(component)

    # -- lookups -----------------------------------------------------------------
    def selector(self, role: str) -> str:
        """The role's label selector; TargetError when it would not narrow anything."""
        if role not in ROLES:
            raise TargetError(f"unknown role {role!r}: use one of {', '.join(ROLES)}.")
        selector = self.spec.selectors.get(role, DEFAULT_SELECTORS[role])
        terms = [t.strip() for t in selector.split(",") if t.strip()]
        if not any(_narrows(t) for t in terms):
            raise TargetError(
                f"kubernetes target {self.name!r}: selectors.{role} is {selector!r}, which "
                "does not narrow the pods (an empty label selector, or one with only != "
                "terms, matches nearly every pod in the namespace). Give the role's labels, "
                f"e.g. {DEFAULT_SELECTORS[role]!r}."
            )
        return selector

    def workload(self, role: str) -> tuple[str, str]:
        """(kind, name) of the (first) workload that owns ``role``'s pods, e.g.
        (deployment, router)."""
        return self.workloads(role)[0]

    def workloads(self, role: str) -> list[tuple[str, str]]:
        """Every (kind, name) that owns ``role``'s pods: ``workloads.ROLE`` is KIND/NAME or
        a comma-separated list of them (e.g. two router Deployments)."""
        if role not in ROLES:
            raise TargetError(f"unknown role {role!r}: use one of {', '.join(ROLES)}.")
        ref = self.spec.workloads.get(role, DEFAULT_WORKLOADS[role])
        out: list[tuple[str, str]] = []
        for item in ref.split(","):
            kind, _, name = item.strip().partition("/")
            if kind not in WORKLOAD_KINDS or not name or "/" in name:
                raise TargetError(
                    f"kubernetes target {self.name!r}: workloads.{role} is {ref!r}: write "
                    f"KIND/NAME with KIND one of {', '.join(WORKLOAD_KINDS)} (e.g. "
                    f"deployment/{role}), or several separated by commas."
                )
            out.append((kind, name))
        return out

    def service_url(self, role: str) -> str:
        try:
            return self.spec.urls[role]
        except KeyError:
            raise TargetError(
                f"kubernetes target {self.name!r}: no URL for {role!r} under 'urls' "
                "in the target file (e.g. http://router.NAMESPACE.svc:8000)."
            ) from None

    def secrets(self) -> dict[str, str]:
        """What chaostoolkit-kubernetes reads besides the environment."""
        out: dict[str, str] = {}
        if self.spec.context:
            out["KUBERNETES_CONTEXT"] = self.spec.context
        return out

    def _use_kubeconfig(self) -> None:
        # chaostoolkit-kubernetes reads the kubeconfig path from $KUBECONFIG only; a path
        # in the target file must win over one inherited from the shell. The kubernetes
        # client reads $KUBECONFIG once, when it is imported, into its default location
        # (which chaostoolkit-kubernetes' load_kube_config then uses): set that too, or a
        # second target in one process would reach the first one's cluster.
        if self.spec.kubeconfig:
            path = str(Path(self.spec.kubeconfig).expanduser())
            os.environ["KUBECONFIG"] = path
            from kubernetes.config import kube_config

            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path

    def api_client(self) -> Any:
        """A kubernetes ApiClient, configured the way chaostoolkit-kubernetes does it."""
        self.check_namespace()
        self._use_kubeconfig()
        from chaosk8s import create_k8s_api_client

        return create_k8s_api_client(self.secrets())

    def core_api(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def _pods(self, role: str) -> list[Any]:
        selector = self.selector(role)
        api = self.core_api()
        try:
            pods = api.list_namespaced_pod(self.namespace, label_selector=selector)
        except Exception as exc:
            raise TargetError(
                f"kubernetes target {self.name!r}: listing pods {selector!r} in namespace "
                f"{self.namespace!r} failed: {_api_error(exc)}"
            ) from None
        return sorted(pods.items, key=lambda p: p.metadata.name)

    def replicas(self, role: str) -> list[Replica]:
        port = self.spec.ports.get(role, DEFAULT_PORTS[role])
        return [
            Replica(
                name=pod.metadata.name,
                role=role,
                url=f"http://{_address(pod)}:{_admin_port(pod, port)}",
            )
            for pod in self._pods(role)
            if _is_serving(pod)
        ]

    def admin_token(self) -> str:
        if self.spec.admin_token_file:
            try:
                return Path(self.spec.admin_token_file).read_text().strip()
            except OSError as exc:
                raise TargetError(
                    f"kubernetes target: cannot read admin_token_file "
                    f"{self.spec.admin_token_file}: {exc.strerror}"
                ) from None
        token = os.environ.get(self.spec.admin_token_env, "").strip()
        if not token:
            raise TargetError(
                f"kubernetes target: the admin token is not set; export "
                f"{self.spec.admin_token_env} (from the stack's Secret) or set "
                "admin_token_file in the target file."
            )
        return token

    def credential(self, name: str) -> str:
        """``credentials_dir``/NAME, else env ``<credentials_env_prefix>NAME``, else the
        single admin token (single-credential mode)."""
        if self.spec.credentials_dir:
            path = Path(self.spec.credentials_dir) / name
            return self.read_credential(
                path,
                lambda exc: (
                    f"kubernetes target: cannot read credential {name!r} at {path} "
                    f"(credentials_dir): {exc.strerror}. Mount the canarystack-{name} Secret there."
                ),
            )
        env = self.spec.credentials_env_prefix + name.upper().replace("-", "_")
        token = os.environ.get(env, "").strip()
        if token:
            return token
        return self.admin_token()

    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
        """Delete one pod of ``role`` with grace period 0 (the kubelet sends SIGKILL).

        The pod is chosen here (``replica``, else the first serving pod by name) and
        handed to chaostoolkit-kubernetes ``terminate_pods`` as the role's label selector
        plus an exact name pattern, so the ledger names the pod that was killed.
        """
        self.check_allowed(role)
        selector = self.selector(role)
        pods = self._pods(role)
        names = [p.metadata.name for p in pods]
        if replica is not None:
            chosen = [p for p in pods if p.metadata.name == replica]
            if not chosen:
                raise TargetError(
                    f"no pod {replica!r} matches {selector!r} in namespace {self.namespace!r} "
                    f"(pods: {', '.join(names) or 'none'})."
                )
        else:
            chosen = [p for p in pods if _is_serving(p)]
            if not chosen:
                raise TargetError(
                    f"no running pod of {role} matches {selector!r} in namespace "
                    f"{self.namespace!r} (pods: {', '.join(names) or 'none'}); is it deployed?"
                )
        pod = chosen[0]
        name = pod.metadata.name
        owner = self.check_owner(role, pod)
        from chaosk8s.pod.actions import terminate_pods

        killed_at = time.time()
        try:
            deleted = terminate_pods(
                label_selector=selector,
                name_pattern=f"^{re.escape(name)}$",
                qty=1,
                grace_period=0,
                ns=self.namespace,
                secrets=self.secrets(),
            )
        except Exception as exc:
            raise TargetError(
                f"deleting pod {name!r} in namespace {self.namespace!r} failed: {_api_error(exc)}"
            ) from None
        if list(deleted or []) != [name]:
            raise TargetError(
                f"pod {name!r} was not deleted (terminate_pods deleted {deleted!r}); "
                "it may have gone away on its own. Check `kubectl get pods`."
            )
        return KilledPod(
            name=name,
            role=role,
            detail={
                "namespace": self.namespace,
                "selector": selector,
                "grace_period_s": 0,
                "pod_ip": getattr(pod.status, "pod_ip", None),
                "node": getattr(pod.spec, "node_name", None) if pod.spec else None,
                "workload": owner,
                "time": killed_at,
            },
        )

    def _read(self, what: str, read: Any, name: str) -> Any:
        try:
            return read(name, self.namespace)
        except Exception as exc:
            raise TargetError(
                f"reading {what}/{name} in namespace {self.namespace!r} (to check that the "
                f"pod belongs to the role's workload) failed: {_api_error(exc)}"
            ) from None

    def check_owner(self, role: str, pod: Any) -> str:
        """``KIND/NAME`` of the workload that owns ``pod``, when it is one of ``role``'s
        workloads (``workloads`` in the target file); TargetError, naming the owner,
        otherwise."""
        listed = self.workloads(role)
        pod_name = pod.metadata.name
        expected = " or ".join(f"{k}/{n}" for k, n in listed)

        def refuse(why: str) -> TargetError:
            return TargetError(
                f"refusing to kill pod {pod_name!r} as {role}: {why}, so it is not a pod of "
                f"{expected} (workloads.{role} in the target file). A label selector "
                "matched it, but labels are only names: check the selector and the workload, "
                "or set workloads in the target file."
            )

        ref = _controller(pod.metadata)
        if ref is None:
            raise refuse("it has no controlling owner (a bare pod)")
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client())
        if ref.kind == "StatefulSet" and ("statefulset", ref.name) in listed:
            sts = self._read("statefulset", apps.read_namespaced_stateful_set, ref.name)
            if _uid(sts) and ref.uid and _uid(sts) != ref.uid:
                raise refuse(f"its owner StatefulSet/{ref.name} has another UID ({ref.uid})")
            return f"statefulset/{ref.name}"
        if not any(k == "deployment" for k, _ in listed):
            raise refuse(f"its controller is {ref.kind}/{ref.name}")
        if ref.kind != "ReplicaSet":
            raise refuse(f"its controller is {ref.kind}/{ref.name}, not a ReplicaSet")
        rs = self._read("replicaset", apps.read_namespaced_replica_set, ref.name)
        if _uid(rs) and ref.uid and _uid(rs) != ref.uid:
            raise refuse(f"its ReplicaSet {ref.name} has another UID ({ref.uid})")
        rs_ref = _controller(rs.metadata)
        if (
            rs_ref is None
            or rs_ref.kind != "Deployment"
            or ("deployment", rs_ref.name) not in listed
        ):
            owner = f"{rs_ref.kind}/{rs_ref.name}" if rs_ref is not None else "nothing"
            raise refuse(f"its ReplicaSet {ref.name} is owned by {owner}")
        dep = self._read("deployment", apps.read_namespaced_deployment, rs_ref.name)
        if _uid(dep) and rs_ref.uid and _uid(dep) != rs_ref.uid:
            raise refuse(f"its ReplicaSet {ref.name} belongs to another Deployment/{rs_ref.name}")
        return f"deployment/{rs_ref.name}"

    def workload_status(self, role: str) -> WorkloadStatus:
        """Desired and ready replicas of the workloads that own ``role``'s pods (summed
        when there are several; ``ok`` only when every one of them is ready)."""
        parts = [self._one_workload_status(kind, name) for kind, name in self.workloads(role)]
        if len(parts) == 1:
            return parts[0]
        return {
            "kind": ",".join(p["kind"] for p in parts),
            "name": ",".join(p["name"] for p in parts),
            "namespace": self.namespace,
            "desired": sum(p["desired"] for p in parts),
            "ready": sum(p["ready"] for p in parts),
            "ok": all(p["ok"] for p in parts),
            "workloads": list(parts),
        }

    def _one_workload_status(self, kind: str, name: str) -> WorkloadStatus:
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client())
        obj: Any
        try:
            if kind == "deployment":
                obj = apps.read_namespaced_deployment(name, self.namespace)
                ready = (obj.status and obj.status.available_replicas) or 0
            else:
                obj = apps.read_namespaced_stateful_set(name, self.namespace)
                ready = (obj.status and obj.status.ready_replicas) or 0
        except Exception as exc:
            raise TargetError(
                f"reading {kind}/{name} in namespace {self.namespace!r} failed: {_api_error(exc)}"
            ) from None
        desired = obj.spec.replicas if obj.spec.replicas is not None else 1
        return {
            "kind": kind,
            "name": name,
            "namespace": self.namespace,
            "desired": int(desired),
            "ready": int(ready),
            "ok": int(ready) >= int(desired),
        }

    def scale_load_workers(self, replicas: int) -> ScaledWorkers | None:
        """Scale the Locust worker pods (``load_workers`` in the target file) to
        ``replicas`` in the target's namespace; None when the target has none. Only a
        Deployment the file names, never another namespace."""
        spec = self.spec.load_workers
        if spec is None:
            return None
        kind, _, name = spec.workload.partition("/")
        if kind != "deployment" or not name:
            raise TargetError(
                f"kubernetes target {self.name!r}: load_workers.workload is "
                f"{spec.workload!r}: give deployment/NAME (e.g. deployment/locust-worker)"
            )
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client())
        try:
            apps.patch_namespaced_deployment_scale(
                name, self.namespace, {"spec": {"replicas": int(replicas)}}
            )
        except Exception as exc:
            raise TargetError(
                f"scaling deployment/{name} in namespace {self.namespace!r} to {replicas} "
                f"failed: {_api_error(exc)}"
            ) from None
        return {"workload": spec.workload, "replicas": int(replicas), "time": time.time()}

    def load_master(self, run_bound_s: float) -> MasterPod | None:
        """The Locust master pod for one experiment's load (``load_workers.master``), with
        a TTL of the run's bound plus the spec's margin; None when the harness's own Locust
        is the master."""
        spec = self.spec.load_workers
        if spec is None or spec.master is None:
            return None
        ttl_s = run_bound_s + spec.master.ttl_margin_s
        return MasterPod(self, spec.master.template, ttl_s, api_error=_api_error)

    def describe(self) -> TargetDescription:
        return {**super().describe(), "namespace": self.namespace}


def _narrows(term: str) -> bool:
    """A selector term that narrows: ``key=value``, ``key==value``, ``key in (...)``."""
    if " in " in term or " in(" in term:
        return True
    key, eq, value = term.partition("=")
    return bool(eq and not key.endswith("!") and key.strip() and value.strip("= "))


def _admin_port(pod: Any, default: int) -> int:
    """The pod's own admin port: its ``canarystack.io/admin-port`` annotation, else
    ``default`` (``ports[role]``); TargetError for an annotation that is not a port."""
    meta = getattr(pod, "metadata", None)
    annotations = (getattr(meta, "annotations", None) or {}) if meta is not None else {}
    raw = annotations.get(ADMIN_PORT_ANNOTATION)
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise TargetError(
            f"pod {getattr(meta, 'name', '?')!r}: annotation {ADMIN_PORT_ANNOTATION}={raw!r} "
            "is not a TCP port (1-65535): fix the workload's pod template."
        )
    return int(text)


def _controller(meta: Any) -> Any:
    """The controlling owner reference of an object's metadata (None when there is none)."""
    refs = list(getattr(meta, "owner_references", None) or [])
    controllers = [r for r in refs if getattr(r, "controller", False)]
    return controllers[0] if controllers else None


def _uid(obj: Any) -> str | None:
    meta = getattr(obj, "metadata", None)
    return getattr(meta, "uid", None) if meta is not None else None


def _api_error(exc: Exception) -> str:
    """A short, readable form of a kubernetes client error (status and reason)."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        hint = ""
        if status == 403:
            hint = " (the ServiceAccount's Role does not allow it: see deploy/k8s RBAC)"
        return f"HTTP {status} {reason or ''}".rstrip() + hint
    return f"{exc.__class__.__name__}: {exc}"
