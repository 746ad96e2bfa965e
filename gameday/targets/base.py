"""The target abstraction, the target file specs and the file loader.

This module must never import a concrete target: each joins ``KINDS`` by subclassing
``Target`` with a ``spec_model`` (the package imports them all).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NotRequired, Protocol, Self, TypedDict

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from canary_contract.json import JsonObject
from gameday.errors import GamedayError

if TYPE_CHECKING:
    from gameday.observers.base import GateObserver

# The roles a component can have; "model" in an action means both model roles.
ROLES = ("router", "broker", "gate", "rollback", "model-baseline", "model-canary")
SERVICE_ROLES = ("router", "broker", "gate", "rollback")
DEFAULT_TARGET_ENV = "GAMEDAY_TARGET"


class TargetError(GamedayError, ValueError):
    """The target file or the target is wrong; the message says what to do."""


class BlastRadiusError(TargetError):
    """A fault or kill aimed outside the target's blast-radius allowlist."""


@dataclass(frozen=True)
class Replica:
    """One pod of a component: its name and the URL of its own admin API."""

    name: str
    role: str
    url: str


class TargetDescription(TypedDict):
    """A target in a run's plan: its kind, name and release, and what its kind adds
    (a Kubernetes target's namespace, a local one's state folder, a foreign stack's
    capabilities)."""

    kind: str
    name: str
    release: str
    namespace: NotRequired[str]
    state_dir: NotRequired[str]
    capabilities: NotRequired[list[str]]


@dataclass(frozen=True)
class KilledPod:
    name: str
    role: str
    detail: Mapping[str, object]  # what the target did and checked (its keys differ per kind)


class BlastRadius(BaseModel):
    model_config = ConfigDict(extra="forbid")
    components: list[str] = Field(default_factory=lambda: list(ROLES))
    namespaces: list[str] = Field(default_factory=list)


class LocalTargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["local"] = "local"
    name: str = "local"
    state_dir: Path = Path(".stack")
    release: str | None = None  # default: the stack's own release
    blast_radius: BlastRadius = Field(default_factory=BlastRadius)


class LoadMasterSpec(BaseModel):
    """The Locust master as a pod: one per experiment, made from the pod template of
    ``template`` (a Deployment in the target's namespace, at 0 replicas), bound to
    ``bind_host``:``master_port`` for its workers, deleted after the run (and at its TTL,
    the run's bound plus ``ttl_margin_s``, if the harness is gone)."""

    model_config = ConfigDict(extra="forbid")
    template: str = "deployment/locust-master"
    bind_host: str = "0.0.0.0"
    ttl_margin_s: float = Field(default=300.0, ge=60.0, le=3600.0)


class LoadWorkersSpec(BaseModel):
    """Locust worker pods the harness starts for a game day's load (and stops after it):
    ``workload`` (a Deployment in the target's namespace, at 0 replicas between runs)
    scaled to ``replicas``; their master is the harness's own Locust, bound to
    127.0.0.1:``master_port`` (the workers use the host network on loopback), or, with
    ``master``, a pod of its own (``LoadMasterSpec``)."""

    model_config = ConfigDict(extra="forbid")
    workload: str = "deployment/locust-worker"
    replicas: int = Field(default=2, ge=1, le=64)
    master_port: int = Field(ge=1024, le=65535)
    # The master as a pod too (None: the harness's own Locust is the master).
    master: LoadMasterSpec | None = None


class KubernetesTargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["kubernetes"]
    name: str = "kubernetes"
    namespace: str
    release: str = "default"
    kubeconfig: str | None = None
    context: str | None = None
    # Service URLs for router, broker, gate, rollback (e.g. http://router.ns.svc:8000).
    urls: dict[str, str]
    # Label selectors per role, e.g. router: app.kubernetes.io/component=router
    selectors: dict[str, str] = Field(default_factory=dict)
    # Container port of each role's HTTP server (per-pod admin URLs are http://POD_IP:PORT).
    ports: dict[str, int] = Field(default_factory=dict)
    # The workload owning each role's pods, KIND/NAME (default: deployment/<role>,
    # statefulset/broker): read by the readiness probes.
    workloads: dict[str, str] = Field(default_factory=dict)
    # Least privilege (docs/ARCHITECTURE.md §8): the harness's credentials, operator and
    # faults-<role>, from files named so in credentials_dir (a mounted Secret folder), else
    # from env vars <credentials_env_prefix><NAME> (FAULTS_MODEL_CANARY, OPERATOR ...); the
    # single admin token (admin_token_file / admin_token_env) is the fallback for both.
    credentials_dir: str | None = None
    credentials_env_prefix: str = "CANARYSTACK_CREDENTIAL_"
    admin_token_env: str = "CANARYSTACK_ADMIN_TOKEN"
    admin_token_file: str | None = None
    # The game day's load from Locust worker pods (None: Locust runs here, as locally).
    load_workers: LoadWorkersSpec | None = None
    blast_radius: BlastRadius = Field(default_factory=BlastRadius)


class TargetSpec(Protocol):
    """A kind's ``spec_model`` (a pydantic model of its target file), as the base sees it:
    it validates a file's mapping and names the target and its blast radius."""

    @classmethod
    def model_validate(cls, obj: Any) -> Self: ...

    @property
    def name(self) -> str: ...

    @property
    def blast_radius(self) -> BlastRadius: ...


class Target(ABC):
    """Where experiments act. Subclasses: LocalTarget (reading the ``stack.json`` that
    ``gameday stack up`` writes), KubernetesTarget.

    A target knows the service URLs, the per-replica admin URLs, the admin token, how to
    kill a pod, and its blast-radius allowlist.

    A subclass that sets ``spec_model`` (its target file's schema) joins ``KINDS`` under
    its ``kind``: ``parse_target`` builds it with ``from_spec``.
    """

    kind: str
    spec_model: ClassVar[type[TargetSpec]]
    name: str
    release: str
    blast_radius: BlastRadius

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "spec_model" in cls.__dict__:
            KINDS[cls.kind] = cls

    def __init__(self, spec: TargetSpec) -> None:
        """Each kind builds itself from its own ``spec_model`` and calls this first for
        what every spec gives: the name and the blast radius."""
        self.name = spec.name
        self.blast_radius = spec.blast_radius

    @classmethod
    def from_spec(cls, spec: TargetSpec) -> Self:
        """The target a validated ``spec_model`` describes."""
        if not isinstance(spec, cls.spec_model):
            raise TypeError(f"{cls.__name__} is built from a {cls.spec_model.__name__}")
        return cls(spec)

    def expand_role(self, component: str) -> list[str]:
        """``model`` means both model roles; anything else must be a role."""
        if component == "model":
            return ["model-baseline", "model-canary"]
        if component not in ROLES:
            raise TargetError(
                f"unknown component {component!r}: use one of {', '.join((*ROLES, 'model'))}."
            )
        return [component]

    def check_allowed(self, component: str) -> list[str]:
        """The roles ``component`` stands for, or BlastRadiusError if any is not allowed."""
        roles = self.expand_role(component)
        allowed = self.blast_radius.components
        refused = [r for r in roles if r not in allowed]
        if refused:
            raise BlastRadiusError(
                f"component {', '.join(refused)!s} is outside the blast radius of target "
                f"{self.name!r} (allowed: {', '.join(allowed) or 'nothing'}). Add it to "
                "blast_radius.components in the target file if it may be harmed."
            )
        return roles

    def observer(self) -> GateObserver | None:
        """How the harness reads the target's gate when it is not canarystack's own (None:
        canarystack's, read from its broker and gate API: ``gameday.api.StackApi.gate``)."""
        return None

    @abstractmethod
    def service_url(self, role: str) -> str:
        """The URL clients use for a service role (router, broker, gate, rollback)."""

    @abstractmethod
    def replicas(self, role: str) -> list[Replica]:
        """Every replica of a role, each with the URL of its own admin API."""

    @abstractmethod
    def admin_token(self) -> str:
        """The single-credential token (the fallback when a credential is not given)."""

    @abstractmethod
    def credential(self, name: str) -> str:
        """The token of credential ``name``: ``operator`` or ``faults-<role>``."""

    @abstractmethod
    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
        """Kill one pod of ``role`` (``replica`` names it; default: the first)."""

    def read_credential(self, path: Path, unreadable: Callable[[OSError], str]) -> str:
        """The token in credential file ``path``; TargetError with ``unreadable(exc)``
        when it cannot be read, or saying the file is empty."""
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise TargetError(unreadable(exc)) from None
        if not token:
            raise TargetError(f"{self.kind} target: credential file {path} is empty.")
        return token

    def operator_headers(self, actor: str = "gameday") -> dict[str, str]:
        """Headers for broker writes (versions, releases, annotations): operator."""
        return {"Authorization": f"Bearer {self.credential('operator')}", "x-actor": actor}

    def fault_headers(self, role: str, actor: str = "gameday") -> dict[str, str]:
        """Headers for ``role``'s ``/admin/faults``: that role's own fault credential."""
        if role not in ROLES:
            raise TargetError(f"unknown role {role!r}: use one of {', '.join(ROLES)}.")
        return {"Authorization": f"Bearer {self.credential(f'faults-{role}')}", "x-actor": actor}

    def admin_headers(self, actor: str = "gameday") -> dict[str, str]:
        """Kept for older callers: the operator headers (broker writes only; a
        component's /admin/faults needs ``fault_headers(role)``)."""
        return self.operator_headers(actor)

    @property
    def model_name(self) -> str | None:
        """The model name requests must name, when the target states one (None: the
        stack serves any name, as canarystack's model servers do)."""
        return None

    def describe(self) -> TargetDescription:
        return {"kind": self.kind, "name": self.name, "release": self.release}


# kind -> target class; the subclasses join it (``Target.__init_subclass__``).
KINDS: dict[str, type[Target]] = {}


def _read_yaml(path: Path) -> JsonObject:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TargetError(
            f"target file {path}: cannot read it ({exc.strerror}). Pass an existing file with "
            f"--target or set {DEFAULT_TARGET_ENV}."
        ) from None
    except yaml.YAMLError as exc:
        raise TargetError(f"target file {path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TargetError(f"target file {path}: the top level must be a mapping.")
    return data


def parse_target(data: JsonObject, source: str = "target") -> Target:
    kind = data.get("kind", "local")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        kinds = " or ".join(repr(k) for k in KINDS)
        raise TargetError(f"{source}: field 'kind' is {kind!r}: use {kinds}.")
    try:
        spec = cls.spec_model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise TargetError(f"{source}: field '{where}': {err['msg']}") from None
    return cls.from_spec(spec)


def load_target(path: str | Path | None = None) -> Target:
    """The target from ``path``, else ``$GAMEDAY_TARGET``, else the local stack in .stack."""
    chosen = path or os.environ.get(DEFAULT_TARGET_ENV)
    if not chosen:
        return parse_target({"kind": "local"}, source="default local target")
    p = Path(chosen)
    data = _read_yaml(p)
    target = parse_target(data, source=f"target file {p}")
    # Relative state_dir is relative to the working directory, as on the command line.
    return target
