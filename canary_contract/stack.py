"""``stack.json``, the description of a local stack: ``canarystack.cluster`` writes it
when it starts the stack, and reads it back; the harness's local target
(``gameday.targets.local``) reads it to find the stack's URLs, programs and credentials.

Pure data, no I/O.
"""

from __future__ import annotations

from typing import TypedDict


class ComponentEntry(TypedDict):
    """One HTTP component of ``stack.json`` (``components``)."""

    name: str
    role: str
    program: str
    url: str


class DependencyEntry(ComponentEntry):
    """One program of ``stack.json`` that is not an HTTP component (``dependencies``)."""

    port: int
    maxclients: int
    command: str


class VersionsEntry(TypedDict):
    stable: str
    canary: str


class StackDescription(TypedDict):
    """The content of ``stack.json`` (``canarystack.cluster.spec.stack_description``)."""

    state_dir: str
    base_port: int
    release: str
    model: str
    engine: str
    router_url: str
    broker_url: str
    gate_url: str
    rollback_url: str
    supervisor_socket: str
    credentials: dict[str, str]
    admin_token_file: str
    versions: VersionsEntry
    components: list[ComponentEntry]
    redis_url: str
    dependencies: list[DependencyEntry]


class ProcessStatus(TypedDict):
    """One supervised program in ``status``: a component or a dependency (Redis)."""

    name: str
    role: str
    pid: int | None
    url: str
    state: str
    restarts: int
    healthy: bool


class StackStatus(TypedDict):
    """``stack status`` (``--json``, and what ``stack up --json`` prints): supervisord,
    the stack's URLs and every program's row."""

    running: bool
    supervisord_pid: int | None
    dependencies: list[ProcessStatus]
    router_url: str
    broker_url: str
    gate_url: str
    rollback_url: str
    state_dir: str
    release: str
    components: list[ProcessStatus]
