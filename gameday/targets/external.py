"""A stack the project did not build (``kind: external``): no stack of ours is started
or assumed.

The target file says, per role, where it is and how to reach it: the router's URL, each
component's health URL, how the served variant is read from an answer (a response header,
or a ``model_version`` -> variant map), how a pin is sent, which fault backend harms each
role (``fault-proxy``: the project's fault proxy in front of an engine, same
``/admin/faults`` contract as canarystack; ``envoy``: Envoy's fault filter through its
admin runtime, with a TTL watchdog), how a pod of a role is killed (``process``: a
command-line match checked on the process before the signal), and the gate observer that
tells when the gate tripped, when the canary's weight reached 0 and whether the gate could
see (``gameday.observers``).

What a target lacks is a capability it does not have (``capabilities``): an experiment
that needs it is *not applicable* on this target, and the run says so.

This module never sends a signal to a process whose command line it has not checked, and
never acts on a role outside the blast radius.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gameday.observers.specs import ObserverSpec
from gameday.targets.base import (
    ROLES,
    BlastRadius,
    KilledPod,
    KubernetesTargetSpec,
    Replica,
    Target,
    TargetDescription,
    TargetError,
)
from gameday.targets.local import _pinned, read_cmdline, send_signal

if TYPE_CHECKING:
    from gameday.observers import GateObserver
    from gameday.targets.envoy_faults import EnvoyFaults
    from gameday.targets.kubernetes import KubernetesTarget

# What the harness can do against a foreign stack, per fault backend: kinds per backend.
FAULT_PROXY_KINDS = ("latency", "errors", "hang", "kernel")
ENVOY_KINDS = ("latency", "errors")
# Capabilities that only canarystack has (the gate's own API and the broker's history).
CANARYSTACK_ONLY = ("gate_api", "broker", "router_health", "colour_hops", "dependency")


class ReplicaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    url: str


class FaultBackendSpec(BaseModel):
    """How a role is harmed. ``fault-proxy``: ``/admin/faults`` on each replica's URL with
    the credential in ``credential_file`` (or ``credential_env``). ``envoy``: Envoy's
    fault filter through the admin runtime at ``admin_url``; the TTL is kept by a watchdog
    process the harness starts (``gameday.targets.envoy_faults``)."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["fault-proxy", "envoy"]
    credential_file: Path | None = None
    credential_env: str | None = None
    admin_url: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> FaultBackendSpec:
        if self.backend == "fault-proxy" and not (self.credential_file or self.credential_env):
            raise ValueError(
                "a fault-proxy backend needs credential_file or credential_env (the token the "
                "proxy was started with, --token-file)"
            )
        if self.backend == "envoy" and not self.admin_url:
            raise ValueError("an envoy backend needs admin_url (Envoy's admin, on loopback)")
        return self


class KillSpec(BaseModel):
    """How a pod of a role is killed. ``process``: the one process whose command line
    holds every item of ``match`` (as whole arguments, in order) — or the PID in
    ``pidfile``, whose command line must then hold ``match`` too — gets SIGKILL after the
    check; whatever supervises it (supervisord, systemd, a kubelet) restarts it.
    ``kubernetes``: one pod of ``workload`` (KIND/NAME) matching ``selector`` in
    ``namespace`` is deleted with grace period 0 through chaostoolkit-kubernetes, after
    the same checks as a ``kind: kubernetes`` target (the namespace in
    ``blast_radius.namespaces``, the pod owned by that workload)."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["process", "kubernetes"] = "process"
    match: list[str] = Field(default_factory=list)
    pidfile: Path | None = None
    namespace: str | None = None
    selector: str | None = None
    workload: str | None = None
    kubeconfig: str | None = None
    context: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> KillSpec:
        if self.backend == "process" and not self.match:
            raise ValueError("a process kill needs match: the arguments naming the process")
        if self.backend == "kubernetes" and not (
            self.namespace and self.selector and self.workload
        ):
            raise ValueError(
                "a kubernetes kill needs namespace, selector and workload (KIND/NAME, e.g. "
                "deployment/vllm-canary)"
            )
        return self


class RolloutSpec(BaseModel):
    """Where a role's bad build is rolled out: ``workload`` (deployment/NAME) whose pods
    ``selector`` matches in ``namespace`` (in ``blast_radius.namespaces``), its engine
    container (default: the one named ``model``, else the only one)."""

    model_config = ConfigDict(extra="forbid")
    namespace: str
    workload: str
    selector: str
    container: str | None = None
    kubeconfig: str | None = None
    context: str | None = None


class RoleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: list[ReplicaSpec] = Field(default_factory=list)
    url: str | None = None  # a role with one replica: its URL (the replica is named after the role)
    health_url: str | None = None  # default: <replica url>/health
    faults: FaultBackendSpec | None = None
    kill: KillSpec | None = None
    rollout: RolloutSpec | None = None  # a bad build rolled out to the role's workload
    # A Kubernetes workload playing the role, for a staging cluster (read by observers
    # and documentation; pod kills there go through chaostoolkit-kubernetes' own actions
    # plus probes.faults.record_external_fault).
    workload: str | None = None  # KIND/NAME, e.g. deployment/vllm-canary
    namespace: str | None = None


Variant = Literal["baseline", "canary"]
DEFAULT_VARIANTS: dict[str, Variant] = {"baseline": "baseline", "canary": "canary"}


class VariantSpec(BaseModel):
    """How the served variant is read from an answer: the response ``header`` whose value
    ``values`` maps to a variant (a version header works the same way: ``header:
    x-model-version``, ``values: {v7: baseline, v8: canary}``)."""

    model_config = ConfigDict(extra="forbid")
    header: str = "x-served-by"
    values: dict[str, Variant] = Field(default_factory=lambda: dict(DEFAULT_VARIANTS))

    def load_args(self) -> list[str]:
        """The load generator's flags that read the variant this way."""
        args = ["--variant-header", self.header]
        for value, variant in self.values.items():
            args += ["--variant-value", f"{value}={variant}"]
        return args


class PinSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    header: str = "x-canary-variant"
    baseline: str = "baseline"
    canary: str = "canary"

    def load_args(self) -> list[str]:
        """The load generator's flags that pin this way (the oracle's pairs)."""
        return [
            "--pin-header",
            self.header,
            "--pin-value",
            f"baseline={self.baseline}",
            "--pin-value",
            f"canary={self.canary}",
        ]


class PrepareSpec(BaseModel):
    """A command ``gameday run`` runs before each experiment to bring the stack to its
    starting state (a redeploy, or ``deploy/foreign/foreign.py reset``)."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)
    timeout_s: float = Field(default=120.0, gt=0, le=1800)


class ExternalTargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["external"]
    name: str = "external"
    release: str = "default"
    model: str = "default"  # the model name the stack serves (requests must name it)
    components: dict[str, RoleSpec]
    variant: VariantSpec = Field(default_factory=VariantSpec)
    pin: PinSpec | None = None
    observer: ObserverSpec | None = None
    prepare: PrepareSpec | None = None
    # Where observations of the gate are kept (gameday run sets it to the run folder's
    # observations.jsonl); without it, only what one process saw.
    observations: Path | None = None
    blast_radius: BlastRadius = Field(default_factory=BlastRadius)

    @model_validator(mode="after")
    def _roles(self) -> ExternalTargetSpec:
        unknown = [r for r in self.components if r not in ROLES]
        if unknown:
            raise ValueError(
                f"components names {', '.join(map(repr, unknown))}: use roles from "
                f"{', '.join(ROLES)}"
            )
        if "router" not in self.components:
            raise ValueError("components.router is required: the URL users send requests to")
        return self


class ExternalTarget(Target):
    """A foreign stack, described by its target file (``ExternalTargetSpec``)."""

    kind = "external"
    spec_model = ExternalTargetSpec

    def __init__(self, spec: ExternalTargetSpec) -> None:
        super().__init__(spec)
        self.spec = spec
        self.release = spec.release
        self._observer: GateObserver | None = None

    @property
    def model_name(self) -> str | None:
        return self.spec.model

    def load_args(self) -> list[str]:
        """How the load generator reads the served variant and sends pins on this stack."""
        pin = self.spec.pin.load_args() if self.spec.pin is not None else []
        return [*self.spec.variant.load_args(), *pin]

    # --- where things are ----------------------------------------------------------------
    def _role(self, role: str) -> RoleSpec | None:
        return self.spec.components.get(role)

    def not_applicable(self, what: str) -> TargetError:
        return TargetError(
            f"not applicable: external target {self.name!r} has no {what} (a stack the "
            "project did not build: its target file names no such part)"
        )

    def service_url(self, role: str) -> str:
        spec = self._role(role)
        if spec is None:
            raise self.not_applicable(role)
        reps = self.replicas(role)
        if not reps:
            raise self.not_applicable(f"URL for {role}")
        return reps[0].url.rstrip("/")

    def replicas(self, role: str) -> list[Replica]:
        spec = self._role(role)
        if spec is None:
            return []
        reps = [Replica(r.name, role, r.url.rstrip("/")) for r in spec.replicas]
        if spec.url and not reps:
            reps = [Replica(role, role, spec.url.rstrip("/"))]
        return reps

    def health_urls(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for role, spec in self.spec.components.items():
            if spec.health_url:
                out.append((role, spec.health_url))
            else:
                out.extend((r.name, f"{r.url}/health") for r in self.replicas(role))
        return out

    # --- credentials ---------------------------------------------------------------------
    def admin_token(self) -> str:
        raise self.not_applicable("single admin credential")

    def credential(self, name: str) -> str:
        role = name.removeprefix("faults-")
        spec = self._role(role) if name.startswith("faults-") else None
        backend = spec.faults if spec is not None else None
        if backend is None:
            raise self.not_applicable(f"credential {name!r}")
        if backend.credential_file is not None:
            path = backend.credential_file
            return self.read_credential(
                path,
                lambda exc: (
                    f"external target {self.name!r}: cannot read {role}'s fault credential "
                    f"{path}: {exc.strerror} (components.{role}.faults.credential_file)"
                ),
            )
        env = backend.credential_env or ""
        token = os.environ.get(env, "").strip()
        if not token:
            raise TargetError(
                f"external target {self.name!r}: {role}'s fault credential is read from "
                f"${env}, which is empty: export it (components.{role}.faults.credential_env)"
            )
        return token

    # --- faults ---------------------------------------------------------------------------
    def fault_backend(self, role: str) -> EnvoyFaults | None:
        """The backend that harms ``role`` when it is not an ``/admin/faults`` API
        (Envoy); None for the fault proxy (the harness's usual admin path)."""
        spec = self._role(role)
        if spec is None or spec.faults is None:
            raise self.not_applicable(f"fault backend for {role}")
        if spec.faults.backend == "envoy":
            from gameday.targets.envoy_faults import EnvoyFaults

            return EnvoyFaults(str(spec.faults.admin_url), role)
        return None

    def fault_kinds(self, role: str) -> tuple[str, ...]:
        spec = self._role(role)
        if spec is None or spec.faults is None:
            return ()
        return FAULT_PROXY_KINDS if spec.faults.backend == "fault-proxy" else ENVOY_KINDS

    def capabilities(self) -> frozenset[str]:
        caps = {"observer"} if self.spec.observer is not None else set()
        if self.spec.pin is not None:
            caps.add("pins")
        for role, spec in self.spec.components.items():
            caps.update(f"faults:{role}:{kind}" for kind in self.fault_kinds(role))
            if spec.kill is not None:
                caps.add(f"kill:{role}")
            if spec.rollout is not None:
                caps.add(f"rollout:{role}")
        return frozenset(caps)

    # --- pod kills ------------------------------------------------------------------------
    def _match(self, argv: list[str], match: list[str]) -> bool:
        n = len(match)
        return any(argv[i : i + n] == match for i in range(len(argv) - n + 1))

    def _candidates(self, kill: KillSpec) -> list[int]:
        if kill.pidfile is not None:
            try:
                return [int(kill.pidfile.read_text().strip())]
            except (OSError, ValueError) as exc:
                raise TargetError(
                    f"external target {self.name!r}: cannot read a PID from {kill.pidfile}: "
                    f"{exc} (kill.pidfile)"
                ) from None
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                argv = read_cmdline(int(entry.name))
                if argv and self._match(argv, kill.match):
                    found.append(int(entry.name))
        return found

    def _cluster(self, role: str, where: KillSpec | RolloutSpec) -> KubernetesTarget:
        """A ``kind: kubernetes`` target for the one role: its checks, kill and rollout."""
        from gameday.targets.kubernetes import KubernetesTarget

        spec = KubernetesTargetSpec(
            kind="kubernetes",
            name=self.name,
            namespace=str(where.namespace),
            release=self.release,
            kubeconfig=where.kubeconfig,
            context=where.context,
            urls={},
            selectors={role: str(where.selector)},
            workloads={role: str(where.workload)},
            blast_radius=self.blast_radius,
        )
        return KubernetesTarget(spec)

    def rollout_cluster(self, role: str) -> KubernetesTarget:
        """The cluster the role's bad build is rolled out on (``components.ROLE.rollout``)."""
        spec = self._role(role)
        if spec is None or spec.rollout is None:
            raise self.not_applicable(
                f"workload to roll a bad build out to for {role} (components.{role}.rollout)"
            )
        return self._cluster(role, spec.rollout)

    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
        self.check_allowed(role)
        spec = self._role(role)
        if spec is None or spec.kill is None:
            raise self.not_applicable(f"way to kill a pod of {role} (components.{role}.kill)")
        kill = spec.kill
        if kill.backend == "kubernetes":
            return self._cluster(role, kill).kill_pod(role, replica)
        pids = self._candidates(kill)
        wanted = shlex.join(kill.match)
        if len(pids) != 1:
            seen = "; ".join(f"{p}: {shlex.join(read_cmdline(p) or [])[:200]}" for p in pids)
            raise TargetError(
                f"external target {self.name!r}: refusing to kill a pod of {role}: "
                f"{len(pids)} processes match `{wanted}` ({seen or 'none'}); make "
                f"components.{role}.kill.match name exactly one process"
            )
        pid = pids[0]
        with _pinned(pid) as fd:
            argv = read_cmdline(pid)
            if argv is None or not self._match(argv, kill.match):
                raise TargetError(
                    f"external target {self.name!r}: refusing to kill PID {pid} as {role}: "
                    f"it runs `{shlex.join(argv or [])[:300]}`, which does not hold `{wanted}`"
                )
            killed_at = time.time()
            try:
                send_signal(pid, fd, signal.SIGKILL)
            except ProcessLookupError:
                raise TargetError(
                    f"external target: process {pid} exited before the kill"
                ) from None
        name = replica or (self.replicas(role)[0].name if self.replicas(role) else role)
        return KilledPod(
            name=name,
            role=role,
            detail={
                "pid": pid,
                "signal": "SIGKILL",
                "time": killed_at,
                "verified": f"/proc cmdline holds `{wanted}`",
            },
        )

    # --- the gate ------------------------------------------------------------------------
    def observer(self) -> GateObserver:
        if self.spec.observer is None:
            raise self.not_applicable("gate observer (observer: in the target file)")
        if self._observer is None:
            from gameday.observers import observer_for

            self._observer = observer_for(self.spec.observer, self.spec.observations)
        return self._observer

    def describe(self) -> TargetDescription:
        return {**super().describe(), "capabilities": sorted(self.capabilities())}
