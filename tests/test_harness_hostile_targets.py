"""Blast radius by identity, not by name, on the local target (#12 item 8).

A real supervisord (run in the foreground, stopped by its PID) with two programs: a real
broker, and an impostor (a sleeping Python) that a hand-written ``stack.json`` claims is a
router. The local target kills a program only when supervisord's own configuration says
it runs the role's module on the replica's port, and the PID runs exactly that command.
Before, it SIGKILLed whatever PID supervisord reported for the name in ``stack.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import xmlrpc.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from supervisor.xmlrpc import SupervisorTransport

from gameday.targets import TargetError
from gameday.targets.base import Replica, parse_target
from gameday.targets.local import LocalTarget, read_cmdline
from tests.procs import ADMIN_TOKEN, free_port, wait_for

PY = sys.executable
IMPOSTOR = f"{PY} -c 'import time; time.sleep(600)'"


def rpc(sock: Path) -> Any:
    transport = SupervisorTransport(None, None, f"unix://{sock}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def running_pid(sock: Path, name: str) -> int | None:
    try:
        info = rpc(sock).supervisor.getProcessInfo(name)
    except (OSError, xmlrpc.client.Error):
        return None
    return int(info["pid"]) if info.get("statename") == "RUNNING" and info["pid"] else None


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    sd = tmp_path_factory.mktemp("stack")
    token = sd / "admin-token"
    token.write_text(ADMIN_TOKEN)
    port = free_port()
    broker = (
        f"{PY} -m canarystack.broker --host 127.0.0.1 --port {port} "
        f"--admin-token-file {token} --state-dir {sd / 'broker'}"
    )
    sock = sd / "supervisor.sock"
    programs = ""
    for name, command in (("broker", broker), ("impostor", IMPOSTOR)):
        programs += (
            f"[program:{name}]\ncommand={command}\nautostart=true\nautorestart=true\n"
            f"startsecs=0\nstartretries=100\nstopwaitsecs=5\nredirect_stderr=true\n"
            f"stdout_logfile={sd / (name + '.log')}\n\n"
        )
    conf = sd / "supervisord.conf"
    conf.write_text(
        f"[unix_http_server]\nfile={sock}\nchmod=0700\n\n"
        f"[supervisord]\nnodaemon=true\nlogfile={sd / 'supervisord.log'}\n"
        f"pidfile={sd / 'supervisord.pid'}\ndirectory={sd}\n\n"
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
        + programs
    )
    daemon = subprocess.Popen(
        [PY, "-m", "supervisor.supervisord", "-n", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for name in ("broker", "impostor"):

            def up(n: str = name) -> int | None:
                return running_pid(sock, n)

            wait_for(up, timeout=30, what=f"{name} running")
        yield {"sd": sd, "sock": sock, "port": port}
    finally:
        children = [running_pid(sock, n) for n in ("broker", "impostor")]
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
            for pid in children:
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


def stack_json(sd: Path, components: list[dict[str, str]]) -> LocalTarget:
    (sd / "stack.json").write_text(
        json.dumps(
            {
                "release": "default",
                "supervisor_socket": str(sd / "supervisor.sock"),
                "admin_token_file": str(sd / "admin-token"),
                "versions": {"stable": "v1", "canary": "v2"},
                "components": components,
            }
        )
    )
    target = parse_target({"kind": "local", "state_dir": str(sd)})
    assert isinstance(target, LocalTarget)
    return target


def component(name: str, role: str, port: int) -> dict[str, str]:
    return {"name": name, "role": role, "program": name, "url": f"http://127.0.0.1:{port}"}


def test_a_program_that_is_not_the_roles_is_never_killed(supervised: dict[str, Any]) -> None:
    sd, sock, port = supervised["sd"], supervised["sock"], supervised["port"]
    target = stack_json(
        sd,
        [
            component("impostor", "router", 1),  # stack.json says router; it is a sleeper
            component("broker", "gate", port),  # a real broker, listed as the gate
            component("ghost", "rollback", 2),  # no such program in supervisord
            component("broker", "model-canary", port),
        ],
    )
    before = {n: running_pid(sock, n) for n in ("broker", "impostor")}
    with pytest.raises(
        TargetError,
        match=r"refusing to kill 'impostor' as router: supervisord runs it as .*time\.sleep"
        r".*which is not a router \(expected `python -m canarystack\.router \.\.\.`\)",
    ):
        target.kill_pod("router")
    with pytest.raises(TargetError, match=r"'broker' as gate: .*canarystack\.broker.*not a gate"):
        target.kill_pod("gate")
    with pytest.raises(TargetError, match=r"not a model-canary \(expected `python -m canarystack"):
        target.kill_pod("model-canary")
    with pytest.raises(TargetError, match=r"supervisord has no program of that name .*broker"):
        target.kill_pod("rollback")
    # nothing was signalled: the same processes still run
    assert {n: running_pid(sock, n) for n in ("broker", "impostor")} == before


def test_a_port_that_stack_json_does_not_give_the_program_is_refused(
    supervised: dict[str, Any],
) -> None:
    sd, port = supervised["sd"], supervised["port"]
    target = stack_json(sd, [component("broker", "broker", port + 1)])
    with pytest.raises(
        TargetError, match=rf"listens on port\(s\) {port}, but stack.json gives .*:{port + 1}"
    ):
        target.kill_pod("broker")


def test_a_pid_that_does_not_run_the_configured_command_is_refused(
    supervised: dict[str, Any],
) -> None:
    sd, sock, port = supervised["sd"], supervised["sock"], supervised["port"]
    target = stack_json(sd, [component("broker", "broker", port)])
    pod = Replica("broker", "broker", f"http://127.0.0.1:{port}")
    argv = target.verify_program("broker", pod, target.program_config("broker"))
    impostor = running_pid(sock, "impostor")
    assert impostor is not None
    with pytest.raises(TargetError, match=rf"supervisord reports PID {impostor}, but that process"):
        target.verify_process(pod, impostor, argv)
    broker = running_pid(sock, "broker")
    assert broker is not None and read_cmdline(broker) == argv
    target.verify_process(pod, broker, argv)  # the real one passes


def test_the_roles_own_program_is_killed_and_comes_back(supervised: dict[str, Any]) -> None:
    sd, sock, port = supervised["sd"], supervised["sock"], supervised["port"]
    target = stack_json(sd, [component("broker", "broker", port)])
    old = running_pid(sock, "broker")
    impostor = running_pid(sock, "impostor")
    killed = target.kill_pod("broker")
    assert killed.detail["pid"] == old and killed.detail["module"] == "canarystack.broker"
    wait_for(
        lambda: running_pid(sock, "broker") not in (None, old), timeout=30, what="a new broker"
    )
    assert running_pid(sock, "impostor") == impostor
