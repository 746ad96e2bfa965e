"""The local stack as a target: URLs from ``stack.json``, pod kills through supervisord."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
import xmlrpc.client
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict, cast
from urllib.parse import urlsplit

from supervisor.xmlrpc import SupervisorTransport

from canary_contract.json import JsonObject
from canary_contract.stack import StackDescription
from gameday.targets.base import (
    KilledPod,
    LocalTargetSpec,
    Replica,
    Target,
    TargetDescription,
    TargetError,
)

# The module each role's program runs (``python -m MODULE``): canarystack.cluster's programs.
ROLE_MODULES: dict[str, tuple[str, ...]] = {
    "router": ("canarystack.router",),
    "broker": ("canarystack.broker",),
    "gate": ("canarystack.gate",),
    "rollback": ("canarystack.rollback",),
    "model-baseline": ("canarystack.model", "canarystack.engine"),
    "model-canary": ("canarystack.model", "canarystack.engine"),
}
MODEL_VERSION_KEY = {"model-baseline": "stable", "model-canary": "canary"}


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (the last one)."""
    value = None
    for i, part in enumerate(argv):
        if part == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif part.startswith(name + "="):
            value = part.split("=", 1)[1]
    return value


def read_cmdline(pid: int) -> list[str] | None:
    """The argv of process ``pid`` (``/proc/<pid>/cmdline``), None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode("utf-8", errors="surrogateescape") for p in parts]


@contextlib.contextmanager
def _pinned(pid: int) -> Iterator[int | None]:
    """A pidfd for ``pid`` (None where the platform has none): the PID cannot be reused
    by another process while it is open, so a check and the signal hit the same one."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        yield None
        return
    try:
        fd = opener(pid)
    except ProcessLookupError:
        raise TargetError(
            f"local target: process {pid} is gone (it exited before the kill)."
        ) from None
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def send_signal(pid: int, fd: int | None, sig: signal.Signals) -> None:
    """``sig`` to the process ``_pinned`` gave ``fd`` for (``pid`` where there is none)."""
    if fd is not None:
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


class StoppedPod(TypedDict):
    """A pod ``stop_pod`` stopped: what ``resume_pod`` needs to resume the same process."""

    name: str
    role: str
    pid: int
    argv: list[str]
    stopped_at: float


class LocalTarget(Target):
    """The stack ``gameday.stack`` runs under supervisord, in ``state_dir``.

    A pod kill is SIGKILL to the PID that supervisord reports for the program (by PID, never
    by name); supervisord then restarts it, like a ReplicaSet.

    Blast radius by identity, not by name: ``stack.json`` only *says* which program plays a
    role, so before a kill the program is checked against supervisord's own configuration
    (``supervisor.getAllConfigInfo``): its configured command must run the role's module
    (``python -m canarystack.<module>``, ``ROLE_MODULES``) listening on the replica's port
    (and, for a model, serving the variant's version from ``stack.json``); and the process
    behind the PID must be running exactly that command (``/proc/<pid>/cmdline``). The PID is
    pinned with a pidfd while it is checked, so the signal reaches the process that was
    checked. Anything else is refused with a TargetError that says what did not match.
    """

    kind = "local"
    spec_model = LocalTargetSpec

    def __init__(self, spec: LocalTargetSpec) -> None:
        super().__init__(spec)
        self.spec = spec
        self._desc: StackDescription | None = None

    @property
    def state_dir(self) -> Path:
        return self.spec.state_dir.resolve()

    def description(self, refresh: bool = False) -> StackDescription:
        """``stack.json`` as the stack wrote it (read once, again with ``refresh``)."""
        if self._desc is None or refresh:
            path = self.state_dir / "stack.json"
            try:
                self._desc = cast(StackDescription, dict(json.loads(path.read_text())))
            except OSError:
                raise TargetError(
                    f"local target: no stack in {self.state_dir} ({path.name} is missing). "
                    f"Start one with `gameday stack up --state-dir {self.spec.state_dir}`, "
                    "or let `gameday run` start it."
                ) from None
        return self._desc

    @property
    def release(self) -> str:  # type: ignore[override]
        if self.spec.release:
            return self.spec.release
        try:
            return str(self.description()["release"])
        except TargetError:
            return "default"

    def service_url(self, role: str) -> str:
        desc: Mapping[str, object] = self.description()
        key = f"{role}_url"
        if key not in desc:
            raise TargetError(f"local target: no service URL for {role!r}.")
        return str(desc[key])

    def replicas(self, role: str) -> list[Replica]:
        return [
            Replica(name=c["name"], role=c["role"], url=c["url"])
            for c in self.description()["components"]
            if c["role"] == role
        ]

    def admin_token(self) -> str:
        path = Path(self.description()["admin_token_file"])
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise TargetError(f"local target: cannot read the admin token {path}: {exc}") from None

    def credential(self, name: str) -> str:
        """From the stack's ``credentials`` (stack.json); a stack from before least
        privilege has only ``admin_token_file``, which then stands for every credential."""
        files = self.description().get("credentials")
        if not isinstance(files, dict):
            return self.admin_token()
        if name not in files:
            raise TargetError(
                f"local target: the stack has no credential {name!r} (it has "
                f"{', '.join(sorted(files))})."
            )
        path = Path(files[name])
        return self.read_credential(
            path,
            lambda exc: (
                f"local target: cannot read credential {name!r} at {path}: "
                f"{exc.strerror}; is the stack up (`gameday stack up`)?"
            ),
        )

    def _rpc(self) -> Any:
        sock = self.description()["supervisor_socket"]
        transport = SupervisorTransport(None, None, f"unix://{sock}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def pid_of(self, program: str) -> int:
        try:
            info = self._rpc().supervisor.getProcessInfo(program)
        except (OSError, xmlrpc.client.Error) as exc:
            raise TargetError(
                f"local target: supervisord did not answer for {program!r} ({exc}); "
                "is the stack running (`gameday stack status`)?"
            ) from None
        pid = int(info.get("pid") or 0)
        if pid <= 0:
            raise TargetError(
                f"local target: {program!r} has no running process (state {info.get('statename')})."
            )
        return pid

    def program_config(self, program: str) -> JsonObject:
        """supervisord's own configuration of ``program`` (``getAllConfigInfo``)."""
        try:
            infos = self._rpc().supervisor.getAllConfigInfo()
        except (OSError, xmlrpc.client.Error) as exc:
            raise TargetError(
                f"local target: supervisord did not answer for its configuration ({exc}); "
                "is the stack running (`gameday stack status`)?"
            ) from None
        for info in infos:
            if isinstance(info, dict) and info.get("name") == program:
                return dict(info)
        names = ", ".join(sorted(str(i.get("name")) for i in infos if isinstance(i, dict)))
        raise TargetError(
            f"local target: refusing to kill {program!r}: supervisord has no program of that "
            f"name (it runs: {names or 'nothing'}); stack.json does not describe this "
            "supervisord. Is state_dir the stack's own folder?"
        )

    def verify_program(self, role: str, pod: Replica, info: Mapping[str, object]) -> list[str]:
        """The program's configured argv, when it is ``role``'s; TargetError otherwise."""
        command = str(info.get("command") or "")
        try:
            argv = shlex.split(command)
        except ValueError:
            argv = []
        modules = ROLE_MODULES.get(role, ())
        where = f"local target: refusing to kill {pod.name!r} as {role}"
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in modules:
            raise TargetError(
                f"{where}: supervisord runs it as `{command[:300]}`, which is not a {role} "
                f"(expected `python -m {' or '.join(modules)} ...`). stack.json and "
                "supervisord disagree about this program; do not trust either: check the stack."
            )
        port = str(urlsplit(pod.url).port or "")
        ports = {_flag(argv, "--port"), _flag(argv, "--instance-port")}
        if not port or port not in ports:
            raise TargetError(
                f"{where}: its configured command listens on port(s) "
                f"{', '.join(sorted(p for p in ports if p)) or 'none'}, but stack.json gives "
                f"this replica the URL {pod.url}."
            )
        key = MODEL_VERSION_KEY.get(role)
        if key is not None:
            versions = self.description().get("versions")
            want = versions.get(key) if isinstance(versions, dict) else None
            got = _flag(argv, "--version")
            if want is not None and got != want:
                raise TargetError(
                    f"{where}: its configured command serves version {got!r}, but the "
                    f"{key} version of the stack is {want!r}."
                )
        return argv

    def verify_process(self, pod: Replica, pid: int, argv: list[str]) -> None:
        """The process behind ``pid`` runs exactly the program's configured command."""
        actual = read_cmdline(pid)
        if actual is None:
            raise TargetError(f"local target: process {pid} of {pod.name!r} is gone.")
        if actual != argv:
            raise TargetError(
                f"local target: refusing to kill {pod.name!r}: supervisord reports PID {pid}, "
                f"but that process runs `{shlex.join(actual)[:300]}`, not the program's "
                f"configured command `{shlex.join(argv)[:300]}`."
            )

    def _pod_to_signal(self, role: str, replica: str | None) -> tuple[Replica, list[str]]:
        """The pod of ``role`` to signal (``replica`` names it; default: the first) and
        its configured argv, after the blast-radius and program checks."""
        self.check_allowed(role)
        pods = self.replicas(role)
        if not pods:
            raise TargetError(f"local target: no pod has role {role!r}.")
        if replica is None:
            pod = pods[0]
        else:
            matches = [p for p in pods if p.name == replica]
            if not matches:
                names = ", ".join(p.name for p in pods)
                raise TargetError(f"no replica {replica!r} of {role}: use one of {names}.")
            pod = matches[0]
        return pod, self.verify_program(role, pod, self.program_config(pod.name))

    def stop_pod(self, role: str, replica: str | None = None) -> StoppedPod:
        """SIGSTOP one pod of ``role`` (a hung process: its port still accepts connections,
        nothing answers; supervisord does not restart it). ``resume_pod`` with what this
        returns sends SIGCONT to the same process."""
        pod, argv = self._pod_to_signal(role, replica)
        pid = self.pid_of(pod.name)
        with _pinned(pid) as fd:
            self.verify_process(pod, pid, argv)
            send_signal(pid, fd, signal.SIGSTOP)
        return {"name": pod.name, "role": role, "pid": pid, "argv": argv, "stopped_at": time.time()}

    def resume_pod(self, stopped: Mapping[str, object]) -> bool:
        """SIGCONT to the process ``stop_pod`` stopped, when it still runs that command;
        False when it is gone (nothing to resume) or the record names no process."""
        pid, argv = stopped.get("pid"), stopped.get("argv")
        if not isinstance(pid, int) or not isinstance(argv, list):
            return False
        with contextlib.suppress(TargetError), _pinned(pid) as fd:
            if read_cmdline(pid) != argv:
                return False
            send_signal(pid, fd, signal.SIGCONT)
            return True
        return False

    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
        pod, argv = self._pod_to_signal(role, replica)
        pid = self.pid_of(pod.name)
        with _pinned(pid) as fd:
            self.verify_process(pod, pid, argv)
            killed_at = time.time()
            try:
                send_signal(pid, fd, signal.SIGKILL)
            except ProcessLookupError:
                raise TargetError(
                    f"local target: process {pid} of {pod.name!r} exited before the kill."
                ) from None
        return KilledPod(
            name=pod.name,
            role=role,
            detail={
                "pid": pid,
                "signal": "SIGKILL",
                "time": killed_at,
                "module": argv[2],
                "verified": "supervisord config + /proc cmdline",
            },
        )

    def describe(self) -> TargetDescription:
        return {**super().describe(), "state_dir": str(self.state_dir)}
