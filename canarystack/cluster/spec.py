"""What a local stack is made of: ports, programs and their command lines.

A ``StackSpec`` (from defaults, a YAML stack config and CLI flags) renders into the list
of ``Program`` s that supervisord runs and into ``stack.json``, the description the
harness reads (docs/ARCHITECTURE.md §6). Pure functions: no processes, no I/O except
reading a config file.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from canary_contract.json import JsonObject
from canary_contract.stack import StackDescription
from canarystack.common.error_fields import CanaryStackError
from canarystack.model.engine import BATCH_NOISE_KL

ROLES = ("broker", "router", "gate", "rollback", "model-baseline", "model-canary")
# The shared dependency (issue #16): a Debian redis-server, a program like any other but
# not an HTTP component, so stack.json lists it under "dependencies", not "components".
REDIS_ROLE = "redis"
REDIS_PROGRAM = "redis"
# Set explicitly (Redis's own default follows the file-descriptor limit), so the harness
# can check it at every experiment's start and restore it after a pool-exhaustion fault.
REDIS_MAXCLIENTS = 1000

# Offsets from the base port (docs/ARCHITECTURE.md §6).
BROKER_OFFSET = 0
ROUTER_OFFSET = 1
GATE_OFFSET = 2
ROLLBACK_OFFSET = 3
REDIS_OFFSET = 4
ROUTER_INSTANCE_OFFSET = 11
BASELINE_OFFSET = 20
CANARY_OFFSET = 30
HOST = "127.0.0.1"


class StackConfigError(CanaryStackError, ValueError):
    """A stack config file or flag is wrong; the message names it and says what to do."""


class StackSpec(BaseModel):
    """The shape of a local stack. Every field can come from a YAML stack config."""

    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Path(".stack")
    base_port: int = Field(18100, ge=1024, le=65000)
    release: str = Field("default", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    model_name: str = "default"
    stable_version: str = "v1"
    canary_version: str = "v2"
    canary_weight: int = Field(5, ge=0, le=100)
    router_replicas: int = Field(2, ge=1, le=9)
    baseline_replicas: int = Field(2, ge=1, le=9)
    canary_replicas: int = Field(1, ge=1, le=9)
    engine: str = Field("sim", pattern=r"^(sim|llamacpp|vllm)$")
    # llamacpp: the seed of the random-weight GGUF the model pods write into the state
    # folder on first start (canarystack.engine.gguf_gen); every pod serves the same file.
    # vllm: the seed of the random-weight model folder (canarystack/engine/vllm_model.py).
    engine_seed: int = Field(0, ge=0)
    # How long `stack up` waits for every component's /health (a vLLM starts in ~1-2 min).
    health_timeout_s: float = Field(60.0, gt=0, le=1800)
    # Extra command-line arguments per role, e.g. {"gate": ["--drift-kl-tolerance", "50"]}.
    args: dict[str, list[str]] = Field(default_factory=dict)
    # Roles left out of the stack (e.g. ["gate"] to watch an unguarded canary).
    without: list[str] = Field(default_factory=list)
    python: str = sys.executable
    # The redis-server binary (``stack up`` resolves it on PATH and refuses without it).
    redis_server: str = "redis-server"

    @field_validator("without")
    @classmethod
    def _optional_roles(cls, value: list[str]) -> list[str]:
        optional = ("gate", "rollback")
        for role in value:
            if role not in optional:
                raise ValueError(
                    f"cannot leave out {role!r}: only {', '.join(optional)} are optional"
                )
        return value

    @field_validator("args")
    @classmethod
    def _known_roles(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for role in value:
            if role not in (*ROLES, "model"):
                raise ValueError(
                    f"unknown role {role!r} under 'args': use one of {', '.join((*ROLES, 'model'))}"
                )
        return value

    def url(self, offset: int) -> str:
        return f"http://{HOST}:{self.base_port + offset}"

    @property
    def abs_state_dir(self) -> Path:
        return self.state_dir.resolve()

    @property
    def redis_port(self) -> int:
        return self.base_port + REDIS_OFFSET

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}"


@dataclass
class Program:
    """One supervisord program (a "pod")."""

    name: str
    role: str
    command: list[str]
    url: str  # where this replica answers /health and /admin/faults
    env: dict[str, str] = field(default_factory=dict)

    def command_line(self) -> str:
        return " ".join(shlex.quote(part) for part in self.command)


# Settings for the llama.cpp engine on a small CPU (replicas, router and gate flags
# calibrated against it); a stack config's own values win, role by role under 'args'.
ENGINE_DEFAULTS = {
    "llamacpp": Path(__file__).with_name("llamacpp.yaml"),
    "vllm": Path(__file__).with_name("vllm.yaml"),
}


def _read_yaml(p: Path) -> JsonObject:
    try:
        loaded = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise StackConfigError(f"stack config {p}: cannot read it ({exc.strerror}).") from None
    except yaml.YAMLError as exc:
        raise StackConfigError(f"stack config {p}: not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise StackConfigError(f"stack config {p}: the top level must be a mapping.")
    return loaded


def load_stack_config(path: str | Path | None, **overrides: Any) -> StackSpec:
    """Defaults, then the engine's defaults (``ENGINE_DEFAULTS``), then the YAML file (if
    any), then non-None ``overrides``."""
    data: dict[str, object] = {}
    if path:
        data.update(_read_yaml(Path(path)))
    data.update({k: v for k, v in overrides.items() if v is not None})
    defaults_file = ENGINE_DEFAULTS.get(str(data.get("engine", "sim")))
    if defaults_file is not None:
        defaults = _read_yaml(defaults_file)
        args = dict(defaults.get("args") or {})
        given = data.get("args")
        if isinstance(given, dict):
            args.update(given)
        data = {**defaults, **data, "args": args}
    try:
        return StackSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        source = f"stack config {path}" if path else "stack options"
        raise StackConfigError(f"{source}: field '{where}': {err['msg']}") from None


# Least privilege (docs/ARCHITECTURE.md §8): one credential per capability, each in its own
# file under <state>/credentials/, and each program is given only its own.
CREDENTIALS_DIR = "credentials"
BROKER_CREDENTIALS = ("operator", "trip", "rollback", "heartbeat")
FAULT_ROLES = ("router", "broker", "gate", "rollback", "model-baseline", "model-canary")
CREDENTIALS: tuple[str, ...] = (
    *BROKER_CREDENTIALS,
    "samples",
    *(f"faults-{role}" for role in FAULT_ROLES),
)
# What each role is given besides its own faults-<role> (--admin-token-file): flag -> name.
ROLE_CREDENTIALS: dict[str, tuple[tuple[str, str], ...]] = {
    "router": (("--broker-token-file", "heartbeat"), ("--gate-token-file", "samples")),
    "gate": (("--broker-token-file", "trip"), ("--samples-token-file", "samples")),
    "rollback": (("--broker-token-file", "rollback"), ("--operator-token-file", "operator")),
}


def credential_path(spec: StackSpec, name: str) -> Path:
    return spec.abs_state_dir / CREDENTIALS_DIR / name


def router_credential(router_id: str) -> str:
    """The file name of the heartbeat credential bound to one router (#27, finding 7):
    minted from ``heartbeat`` (``canarystack.broker.capabilities.router_token``) by
    ``stack up``, so no router holds a credential that could speak for another."""
    return f"router-credential-{router_id}"


def _credential_flags(spec: StackSpec, role: str, instance: str | None = None) -> list[str]:
    flags = ["--admin-token-file", str(credential_path(spec, f"faults-{role}"))]
    for flag, name in ROLE_CREDENTIALS.get(role, ()):
        if role == "router" and name == "heartbeat" and instance is not None:
            name = router_credential(instance)
        flags += [flag, str(credential_path(spec, name))]
    if role == "broker":
        # The broker reads operator, trip, rollback and heartbeat from the folder, and
        # takes heartbeats only from the router-bound credentials stack up mints.
        flags += [
            "--credentials-dir",
            str(spec.abs_state_dir / CREDENTIALS_DIR),
            "--require-router-credentials",
        ]
    return flags


def _command(
    spec: StackSpec, module: str, port: int, role: str, *args: str, instance: str | None = None
) -> list[str]:
    token = _credential_flags(spec, role, instance)
    return [spec.python, "-m", f"canarystack.{module}", "--host", HOST, "--port", str(port),
            *token, *args]  # fmt: skip


def _model_programs(
    spec: StackSpec, role: str, version: str, count: int, offset: int
) -> list[Program]:
    variant = role.removeprefix("model-")
    extra = [*spec.args.get("model", []), *spec.args.get(role, [])]
    # Every model pod, simulated or llama.cpp, baseline and canary alike, uses the one Redis.
    dependency = ["--redis-url", spec.redis_url]
    progs = []
    for i in range(count):
        port = spec.base_port + offset + i
        name = f"model-{variant}-{i}"
        if spec.engine == "llamacpp":
            # An engine pod (canarystack.engine): llama.cpp serving the generated GGUF.
            gguf = spec.abs_state_dir / f"model-seed{spec.engine_seed}.gguf"
            engine_log = spec.abs_state_dir / "logs" / f"{name}-engine.log"
            cmd = _command(spec, "engine", port, role, "--version", version,
                           "--served-model-name", spec.model_name,
                           "--model", str(gguf), "--gguf-seed", str(spec.engine_seed),
                           "--engine-log", str(engine_log), *dependency,
                           *extra)  # fmt: skip
        elif spec.engine == "vllm":
            # An engine pod with vLLM children (canarystack.engine.vllm) on the generated
            # model; each pod's OpenMP threads on a core of their own, round robin.
            folder = spec.abs_state_dir / f"vllm-model-seed{spec.engine_seed}"
            engine_log = spec.abs_state_dir / "logs" / f"{name}-engine.log"
            core = str(port % max(os.cpu_count() or 1, 1))
            cmd = _command(spec, "engine", port, role, "--version", version,
                           "--served-model-name", spec.model_name, "--engine-kind", "vllm",
                           "--model", str(folder), "--model-seed", str(spec.engine_seed),
                           "--omp-bind", core, "--engine-log", str(engine_log), *dependency,
                           *extra)  # fmt: skip
        else:
            # Real engines are not batch-invariant: every simulated pod runs with the
            # calibrated batch noise and a seed of its own (a stack config's 'args' win).
            noise = ["--batch-noise", f"{BATCH_NOISE_KL:g}", "--noise-seed", str(port)]
            cmd = _command(spec, "model", port, role, "--version", version,
                           "--served-model-name", spec.model_name, *noise, *dependency,
                           *extra)  # fmt: skip
        progs.append(Program(name, role, cmd, f"http://{HOST}:{port}"))
    return progs


def redis_program(spec: StackSpec) -> Program:
    """Redis on loopback, on the stack's port plan, without persistence (a restarted Redis
    comes back empty, as a cache does), its working folder in the state folder."""
    cmd = [spec.redis_server, "--port", str(spec.redis_port), "--bind", HOST,
           "--save", "", "--appendonly", "no", "--maxclients", str(REDIS_MAXCLIENTS),
           "--dir", str(spec.abs_state_dir)]  # fmt: skip
    return Program(REDIS_PROGRAM, REDIS_ROLE, cmd, spec.redis_url)


def programs(spec: StackSpec) -> list[Program]:
    """Every program of the stack, in start order (Redis first: the model pods use it,
    and serve without it when it is not up yet)."""
    sd = str(spec.abs_state_dir)
    broker_url = spec.url(BROKER_OFFSET)
    baseline = _model_programs(
        spec, "model-baseline", spec.stable_version, spec.baseline_replicas, BASELINE_OFFSET
    )
    canary = _model_programs(
        spec, "model-canary", spec.canary_version, spec.canary_replicas, CANARY_OFFSET
    )
    broker_cmd = _command(spec, "broker", spec.base_port + BROKER_OFFSET, "broker",
                          "--state-dir", sd,
                          *spec.args.get("broker", []))  # fmt: skip
    progs = [
        redis_program(spec),
        Program("broker", "broker", broker_cmd, broker_url),
        *baseline,
        *canary,
    ]
    gate = [] if "gate" in spec.without else ["--gate", spec.url(GATE_OFFSET)]
    for i in range(spec.router_replicas):
        instance_port = spec.base_port + ROUTER_INSTANCE_OFFSET + i
        cmd = _command(
            spec, "router", spec.base_port + ROUTER_OFFSET, "router",
            "--reuse-port", "--instance-port", str(instance_port),
            "--router-id", f"router-{i}", "--broker", broker_url, "--release", spec.release,
            "--baseline", ",".join(p.url for p in baseline),
            "--canary", ",".join(p.url for p in canary),
            "--state-dir", sd, *gate, *spec.args.get("router", []),
            instance=f"router-{i}",
        )  # fmt: skip
        progs.append(Program(f"router-{i}", "router", cmd, f"http://{HOST}:{instance_port}"))
    for role, offset in (("gate", GATE_OFFSET), ("rollback", ROLLBACK_OFFSET)):
        if role in spec.without:
            continue
        cmd = _command(spec, role, spec.base_port + offset, role, "--broker", broker_url,
                       "--release", spec.release, *spec.args.get(role, []))  # fmt: skip
        progs.append(Program(role, role, cmd, spec.url(offset)))
    return progs


def stack_description(spec: StackSpec, progs: list[Program]) -> StackDescription:
    """The content of ``stack.json`` (docs/ARCHITECTURE.md §6)."""
    sd = spec.abs_state_dir
    return {
        "state_dir": str(sd),
        "base_port": spec.base_port,
        "release": spec.release,
        "model": spec.model_name,
        "engine": spec.engine,
        "router_url": spec.url(ROUTER_OFFSET),
        "broker_url": spec.url(BROKER_OFFSET),
        "gate_url": spec.url(GATE_OFFSET),
        "rollback_url": spec.url(ROLLBACK_OFFSET),
        "supervisor_socket": str(sd / "supervisor.sock"),
        # One file per credential (docs/ARCHITECTURE.md §8); admin_token_file names the
        # operator credential for readers from before least privilege.
        "credentials": {name: str(credential_path(spec, name)) for name in CREDENTIALS},
        "admin_token_file": str(credential_path(spec, "operator")),
        "versions": {"stable": spec.stable_version, "canary": spec.canary_version},
        "components": [
            {"name": p.name, "role": p.role, "program": p.name, "url": p.url}
            for p in progs
            if p.role != REDIS_ROLE
        ],
        # Programs that are not HTTP components (no /health, no /admin/faults): the shared
        # dependency. The harness reaches Redis over its own protocol.
        "redis_url": spec.redis_url,
        "dependencies": [
            {
                "name": p.name,
                "role": p.role,
                "program": p.name,
                "url": p.url,
                "port": spec.redis_port,
                "maxclients": REDIS_MAXCLIENTS,
                "command": p.command[0],
            }
            for p in progs
            if p.role == REDIS_ROLE
        ],
    }
