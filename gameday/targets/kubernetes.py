"""A Kubernetes namespace as a target.

Services are reached through the URLs in the target file; a replica's own admin API
through its pod IP and the role's container port (pods listed with the role's label
selector through the Kubernetes API). Pod kills use chaostoolkit-kubernetes
``terminate_pods`` with the role's label selector, so the same experiments run as a
chaos runner Job in the cluster (``CHAOSTOOLKIT_IN_POD=true``) or from a laptop with a
kubeconfig. ``kube-system`` and every namespace not listed in
``blast_radius.namespaces`` are refused before any API call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gameday.targets.base import (
    BlastRadiusError,
    KilledPod,
    KubernetesTargetSpec,
    Replica,
    Target,
    TargetError,
)

# Never a blast radius, whatever a target file says.
FORBIDDEN_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

DEFAULT_SELECTORS = {
    role: f"app.kubernetes.io/part-of=canarystack,app.kubernetes.io/component={role}"
    for role in ("router", "broker", "gate", "rollback", "model-baseline", "model-canary")
}
DEFAULT_PORTS = {
    "router": 8000,
    "broker": 8000,
    "gate": 8000,
    "rollback": 8000,
    "model-baseline": 8000,
    "model-canary": 8000,
}


class KubernetesTarget(Target):
    kind = "kubernetes"

    def __init__(self, spec: KubernetesTargetSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.release = spec.release
        self.blast_radius = spec.blast_radius
        self.namespace = spec.namespace

    # -- blast radius ------------------------------------------------------------
    def check_namespace(self) -> None:
        ns = self.namespace
        if ns in FORBIDDEN_NAMESPACES:
            raise BlastRadiusError(
                f"namespace {ns!r} is never a blast radius: game days run in the namespace "
                "of the stack under test."
            )
        if ns not in self.blast_radius.namespaces:
            listed = ", ".join(self.blast_radius.namespaces) or "none"
            raise BlastRadiusError(
                f"namespace {ns!r} is outside the blast radius of target {self.name!r} "
                f"(allowed: {listed}). Add it to blast_radius.namespaces in the target file."
            )

    def check_allowed(self, component: str) -> list[str]:
        self.check_namespace()
        return super().check_allowed(component)

    # -- lookups -----------------------------------------------------------------
    def selector(self, role: str) -> str:
        return self.spec.selectors.get(role, DEFAULT_SELECTORS[role])

    def service_url(self, role: str) -> str:
        try:
            return self.spec.urls[role]
        except KeyError:
            raise TargetError(
                f"kubernetes target {self.name!r}: no URL for {role!r} under 'urls' "
                "in the target file (e.g. http://router.NAMESPACE.svc:8000)."
            ) from None

    def secrets(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.spec.context:
            out["KUBERNETES_CONTEXT"] = self.spec.context
        return out

    def core_api(self) -> Any:
        from chaosk8s import create_k8s_api_client
        from kubernetes import client

        if self.spec.kubeconfig:
            os.environ.setdefault("KUBECONFIG", self.spec.kubeconfig)
        return client.CoreV1Api(create_k8s_api_client(self.secrets()))

    def replicas(self, role: str) -> list[Replica]:
        port = self.spec.ports.get(role, DEFAULT_PORTS[role])
        pods = self.core_api().list_namespaced_pod(
            self.namespace, label_selector=self.selector(role)
        )
        out = []
        for pod in pods.items:
            ip = getattr(pod.status, "pod_ip", None)
            phase = getattr(pod.status, "phase", None)
            if ip and phase == "Running":
                out.append(Replica(name=pod.metadata.name, role=role, url=f"http://{ip}:{port}"))
        return sorted(out, key=lambda r: r.name)

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

    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
        self.check_allowed(role)
        from chaosk8s.pod.actions import terminate_pods

        name_pattern = f"^{replica}$" if replica else None
        terminate_pods(
            label_selector=self.selector(role),
            name_pattern=name_pattern,
            qty=1,
            grace_period=0,
            ns=self.namespace,
            secrets=self.secrets(),
        )
        return KilledPod(
            name=replica or f"1 pod matching {self.selector(role)}",
            role=role,
            detail={"namespace": self.namespace, "selector": self.selector(role), "grace": 0},
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "namespace": self.namespace}
