"""The local stack's lifecycle: up, status, down, logs, timeline.

Never kills anything by name: supervisord is stopped by the PID in its pidfile, and it
stops its programs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import redis
import requests

from canary_contract.stack import ComponentEntry, ProcessStatus, StackDescription, StackStatus
from canarystack.broker.capabilities import router_token
from canarystack.broker.records import EventJson
from canarystack.cluster import supervisor
from canarystack.cluster.spec import (
    CREDENTIALS,
    CREDENTIALS_DIR,
    HOST,
    REDIS_ROLE,
    Program,
    StackSpec,
    credential_path,
    programs,
    router_credential,
    stack_description,
)
from canarystack.common.error_fields import CanaryStackError
from canarystack.dependency.keys import seed_items

HTTP_TIMEOUT_S = 2.0
EVENT_PAGE_LIMIT = 10_000  # the broker's largest page
MAX_EVENT_PAGES = 10_000  # a bound on the loop: 10^8 events


class StackError(CanaryStackError, RuntimeError):
    """Something a person must act on; the message says what."""


def _write_token(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def write_credentials(spec: StackSpec) -> dict[str, str]:
    """Every credential of the stack (kept if already there), name -> token."""
    folder = spec.abs_state_dir / CREDENTIALS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    tokens = {name: _write_token(credential_path(spec, name)) for name in CREDENTIALS}
    for i in range(spec.router_replicas):
        # Each router's own heartbeat credential, minted from the shared one (which then
        # stays with the broker): rewritten each time, since it follows from heartbeat.
        router_id = f"router-{i}"
        path = credential_path(spec, router_credential(router_id))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(router_token(tokens["heartbeat"], router_id) + "\n")
    return tokens


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        # As the servers bind (asyncio sets SO_REUSEADDR): connections of a stack stopped
        # a moment ago linger in TIME_WAIT and must not count as "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _check_ports(spec: StackSpec, progs: list[Program]) -> None:
    ports = sorted({int(p.url.rsplit(":", 1)[1]) for p in progs} | {spec.base_port + 1})
    busy = [port for port in ports if _port_in_use(port)]
    if busy:
        raise StackError(
            f"ports {', '.join(map(str, busy))} are in use on 127.0.0.1, so the stack cannot "
            f"start on base port {spec.base_port}. Stop what holds them, or pick another "
            "base port with --base-port."
        )


def redis_ping(port: int, timeout_s: float = HTTP_TIMEOUT_S) -> bool:
    """Whether a Redis answers PING on loopback ``port`` (its readiness check)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _ready(prog: Program) -> bool:
    if prog.role == REDIS_ROLE:
        return redis_ping(int(prog.url.rsplit(":", 1)[1]))
    return _healthy(prog.url)


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=HTTP_TIMEOUT_S).status_code == 200
    except requests.RequestException:
        return False


def _log_tail(state_dir: Path, program: str, lines: int = 20) -> str:
    try:
        text = (state_dir / "logs" / f"{program}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(spec: StackSpec, progs: list[Program], timeout_s: float) -> None:
    pending = {p.name: p for p in progs}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for name, prog in list(pending.items()):
            if _ready(prog):
                del pending[name]
        if pending:
            time.sleep(0.1)
    if pending:
        details = "\n".join(
            f"--- {name} ({p.url}), last log lines:\n{_log_tail(spec.abs_state_dir, name)}"
            for name, p in pending.items()
        )
        raise StackError(
            f"components did not answer /health within {timeout_s:g}s: "
            f"{', '.join(pending)}\n{details}"
        )


class ManifestJson(TypedDict):
    """A version's manifest as ``up`` registers it."""

    name: str
    version: str
    engine: str
    args: list[str]


def _manifest(spec: StackSpec, version: str) -> ManifestJson:
    return {
        "name": spec.model_name,
        "version": version,
        "engine": spec.engine,
        "args": spec.args.get("model", []),
    }


def _bootstrap_release(spec: StackSpec, token: str) -> None:
    from canarystack.broker.bootstrap import ReleaseSetupError, ensure_release

    try:
        ensure_release(
            spec.url(0),
            token,
            release=spec.release,
            manifests={v: _manifest(spec, v) for v in (spec.stable_version, spec.canary_version)},
            stable=spec.stable_version,
            canary=spec.canary_version,
            weight=spec.canary_weight,
            actor="stack-up",
            reason="local stack created",
            timeout_s=HTTP_TIMEOUT_S,
        )
    except ReleaseSetupError as exc:
        raise StackError(f"setting up release {spec.release}: {exc}") from None


def resolve_redis_server(spec: StackSpec) -> StackSpec:
    """The spec with ``redis_server`` resolved on PATH, or a StackError saying how to
    install it: the stack does not start without its dependency."""
    found = shutil.which(spec.redis_server)
    if found is None:
        raise StackError(
            f"{spec.redis_server!r} is not on PATH: the stack runs a Redis server as the model "
            "servers' shared dependency. Install it with `deploy/debian-packages.sh` or "
            "`sudo apt-get install redis-server`, then run `stack up` again."
        )
    # Not resolved further: Debian links redis-server to redis-check-rdb, which picks
    # what it is from the name it was started as.
    return spec.model_copy(update={"redis_server": found})


def seed_redis(spec: StackSpec) -> int:
    """Write the seeded contexts (``canarystack.dependency.keys``) into the stack's Redis."""
    client = redis.Redis(host=HOST, port=spec.redis_port, socket_timeout=HTTP_TIMEOUT_S)
    try:
        items = seed_items()
        client.mset(items)
        return len(items)
    except redis.RedisError as exc:
        raise StackError(f"seeding the stack's Redis at {spec.redis_url}: {exc}") from None
    finally:
        client.close()


def up(spec: StackSpec, health_timeout_s: float | None = None) -> tuple[bool, StackStatus]:
    """Start the stack. Returns (started, status); started is False if it was running (and
    nothing changed). Writes the supervisord config and ``stack.json`` into the state
    folder, one credential per capability (``credentials/<name>``, mode 0600,
    docs/ARCHITECTURE.md §8), starts supervisord, waits until every component answers
    ``/health``, seeds Redis, then creates the release (stable and canary versions
    registered with their digests, canary weight as configured). The health wait is
    ``health_timeout_s``, else the spec's (``health_timeout_s``: an engine's start)."""
    sd = spec.abs_state_dir
    if supervisor.is_running(sd):
        return False, status(sd)
    spec = resolve_redis_server(spec)
    (sd / "logs").mkdir(parents=True, exist_ok=True)
    progs = programs(spec)
    _check_ports(spec, progs)
    token = write_credentials(spec)["operator"]
    (sd / "supervisord.conf").write_text(supervisor.render_conf(sd, progs))
    (sd / "stack.json").write_text(json.dumps(stack_description(spec, progs), indent=2) + "\n")
    supervisor.start_daemon(sd)
    try:
        _wait_healthy(spec, progs, health_timeout_s or spec.health_timeout_s)
        seed_redis(spec)
        _bootstrap_release(spec, token)
    except Exception:
        supervisor.stop_daemon(sd)
        raise
    return True, status(sd)


def read_description(state_dir: Path) -> StackDescription:
    """``stack.json`` as ``up`` wrote it (``stack_description``)."""
    try:
        return cast(StackDescription, dict(json.loads((state_dir / "stack.json").read_text())))
    except OSError:
        raise StackError(
            f"no stack in {state_dir}: stack.json is missing. Start one with "
            f"`gameday stack up --state-dir {state_dir}`."
        ) from None


class SupervisedInfo(TypedDict, total=False):
    """What ``status`` reads of supervisord's ``getAllProcessInfo`` entry for a program."""

    name: str
    statename: str
    pid: int


def status(state_dir: Path) -> StackStatus:
    sd = state_dir.resolve()
    desc = read_description(sd)
    running = supervisor.is_running(sd)
    infos: dict[str, SupervisedInfo] = {}
    if running:
        for info in supervisor.rpc(sd).supervisor.getAllProcessInfo():
            infos[info["name"]] = info
    restarts = supervisor.restart_counts(sd) if running else {}

    def row(entry: ComponentEntry, program: str, healthy: Callable[[], bool]) -> ProcessStatus:
        info = infos.get(program, {})
        state = info.get("statename", "STOPPED")
        return {
            "name": entry["name"],
            "role": entry["role"],
            "pid": info.get("pid") or None,
            "url": entry["url"],
            "state": state,
            "restarts": restarts.get(program, 0),
            "healthy": state == "RUNNING" and healthy(),
        }

    components = [
        row(comp, comp["name"], partial(_healthy, comp["url"])) for comp in desc["components"]
    ]
    dependencies = [
        row(dep, dep["program"], partial(redis_ping, int(dep["port"])))
        for dep in desc.get("dependencies", [])
    ]
    return {
        "running": running,
        "supervisord_pid": supervisor.daemon_pid(sd),
        "dependencies": dependencies,
        "router_url": desc["router_url"],
        "broker_url": desc["broker_url"],
        "gate_url": desc["gate_url"],
        "rollback_url": desc["rollback_url"],
        "state_dir": str(sd),
        "release": desc["release"],
        "components": components,
    }


def down(state_dir: Path) -> bool:
    return supervisor.stop_daemon(state_dir.resolve())


def log_paths(state_dir: Path, component: str) -> list[Path]:
    """Log files of a component: a program name (``router-0``) or a role (``router``)."""
    sd = state_dir.resolve()
    desc = read_description(sd)
    names = [c["name"] for c in desc["components"] if component in (c["name"], c["role"])]
    if component == "supervisord":
        names = ["supervisord"]
    if not names:
        known = ", ".join(c["name"] for c in desc["components"])
        raise StackError(f"unknown component {component!r}: use one of {known} (or a role).")
    return [sd / "logs" / f"{name}.log" for name in names]


def read_events(
    broker_url: str, release: str, *, page_limit: int = EVENT_PAGE_LIMIT
) -> list[TimelineEvent]:
    """Every event of ``release``, oldest first, read page by page (``after_seq`` =
    ``next_after_seq`` until a page is shorter than its limit), so a long history is never
    cut at the broker's page size."""
    events: list[TimelineEvent] = []
    after_seq = 0
    for _ in range(MAX_EVENT_PAGES):
        url = f"{broker_url}/v1/releases/{release}/events"
        try:
            resp = requests.get(
                url, params={"after_seq": str(after_seq), "limit": str(page_limit)}, timeout=5
            )
        except requests.RequestException as exc:
            raise StackError(f"cannot reach the broker at {broker_url}: {exc}") from None
        if resp.status_code == 404:
            raise StackError(f"release {release!r} does not exist on the broker.")
        if resp.status_code != 200:
            raise StackError(
                f"GET {url}: the broker answered {resp.status_code}: {resp.text[:300]}"
            )
        data = resp.json()
        page = data["events"]
        events.extend(page)
        if len(page) < page_limit:
            return events
        after_seq = int(data.get("next_after_seq", page[-1]["seq"]))
    raise StackError(
        f"release {release!r}: more than {MAX_EVENT_PAGES} pages of {page_limit} events; "
        "refusing to read further."
    )


class TimelineEvent(EventJson):
    """An event as ``timeline`` lists it: ``t_rel_s`` once ``timeline`` added it."""

    t_rel_s: NotRequired[float]


class Timeline(TypedDict):
    """``stack timeline``: the release's events, ``t_rel_s`` from ``t0`` (the first
    injected fault, else the first event)."""

    release: str
    t0: float
    t0_is_fault: bool
    events: list[TimelineEvent]


def timeline(state_dir: Path, release: str | None = None) -> Timeline:
    """The release's event history with times relative to the first injected fault."""
    desc = read_description(state_dir.resolve())
    name = release or desc["release"]
    events = read_events(desc["broker_url"], name)
    faults = [e for e in events if (e.get("change") or {}).get("annotation") == "fault_injected"]
    t0 = faults[0]["time"] if faults else (events[0]["time"] if events else 0.0)
    for e in events:
        e["t_rel_s"] = round(e["time"] - t0, 3)
    return {"release": name, "t0": t0, "t0_is_fault": bool(faults), "events": events}
