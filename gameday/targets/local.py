"""The local stack as a target: URLs from ``stack.json``, pod kills through supervisord.

A pod kill is SIGKILL to the PID that supervisord reports for the program (by PID, never
by name); supervisord then restarts it, like a ReplicaSet.
"""

from __future__ import annotations

import json
import os
import signal
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import SupervisorTransport

from gameday.targets.base import KilledPod, LocalTargetSpec, Replica, Target, TargetError


class LocalTarget(Target):
    kind = "local"

    def __init__(self, spec: LocalTargetSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.blast_radius = spec.blast_radius
        self._desc: dict[str, Any] | None = None

    @property
    def state_dir(self) -> Path:
        return self.spec.state_dir.resolve()

    def description(self, refresh: bool = False) -> dict[str, Any]:
        if self._desc is None or refresh:
            path = self.state_dir / "stack.json"
            try:
                self._desc = dict(json.loads(path.read_text()))
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
        desc = self.description()
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

    def kill_pod(self, role: str, replica: str | None = None) -> KilledPod:
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
        pid = self.pid_of(pod.name)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        return KilledPod(
            name=pod.name, role=role, detail={"pid": pid, "signal": "SIGKILL", "time": killed_at}
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "state_dir": str(self.state_dir)}
