"""`gameday stack up|status|logs|timeline|down` from the command line, on a real stack.

One stack for the module (it takes a few seconds to start): the `gameday` console script
is run as a user would, and every process the stack started is gone after `down`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.procs import pid_alive, wait_for
from tests.run_support import free_base_port

GAMEDAY = str(Path(sys.executable).with_name("gameday"))
pytestmark = pytest.mark.slow


def gameday(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GAMEDAY, *args], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def status(state_dir: Path) -> dict[str, Any]:
    res = gameday("stack", "status", "--state-dir", str(state_dir), "--json")
    assert res.returncode in (0, 3), res.stderr
    return dict(json.loads(res.stdout))


def cli_stack(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[dict[str, Any]]:
    """A real stack for a test module, up by ``gameday stack up`` on a free base port and
    down by ``gameday stack down`` after."""
    state_dir = tmp_path_factory.mktemp(name) / "state"
    base = free_base_port()
    res = gameday("stack", "up", "--state-dir", str(state_dir), "--base-port", str(base))
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        yield {"state_dir": state_dir, "base": base, "up_stdout": res.stdout}
    finally:
        gameday("stack", "down", "--state-dir", str(state_dir))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from cli_stack(tmp_path_factory, "stack")


def test_up_starts_every_component_and_creates_the_release(stack: dict[str, Any]) -> None:
    state_dir, base = stack["state_dir"], stack["base"]
    assert f"http://127.0.0.1:{base + 1}/v1/completions" in stack["up_stdout"]
    # `up` waited for /health; a status taken on a busy machine may still see a slow answer.
    st = wait_for(
        lambda: (lambda s: s if all(c["healthy"] for c in s["components"]) else None)(
            status(state_dir)
        ),
        timeout=30,
        interval=0.5,
        what="every component healthy in `stack status`",
    )
    assert isinstance(st, dict)
    assert st["running"] is True
    assert st["router_url"] == f"http://127.0.0.1:{base + 1}"
    for key in ("broker_url", "gate_url", "rollback_url"):
        assert st[key].startswith("http://127.0.0.1:")
    names = {c["name"] for c in st["components"]}
    assert names == {
        "broker",
        "router-0",
        "router-1",
        "model-baseline-0",
        "model-baseline-1",
        "model-canary-0",
        "gate",
        "rollback",
    }
    for comp in st["components"]:
        assert set(comp) >= {"name", "pid", "url", "state", "restarts"}
        assert comp["state"] == "RUNNING" and comp["healthy"], comp
        assert pid_alive(comp["pid"])
    release = requests.get(f"{st['broker_url']}/v1/releases/default", timeout=5).json()
    assert release["phase"] == "progressing"
    assert (release["stable"]["version"], release["canary"]["version"]) == ("v1", "v2")
    assert release["weights"]["canary"] == 5
    # One credential per capability (docs/ARCHITECTURE.md §8), each 0600, all distinct.
    creds = sorted((state_dir / "credentials").iterdir())
    assert {p.name for p in creds} == {
        "operator", "trip", "rollback", "heartbeat", "samples", "faults-router",
        "faults-broker", "faults-gate", "faults-rollback", "faults-model-baseline",
        "faults-model-canary", "router-credential-router-0", "router-credential-router-1",
    }  # fmt: skip
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in creds)
    assert len({p.read_text().strip() for p in creds}) == len(creds)
    # The router serves, and says who served it.
    resp = requests.post(
        f"{st['router_url']}/v1/completions",
        json={"model": "default", "prompt": "hello world", "max_tokens": 4},
        headers={"x-canary-variant": "canary"},
        timeout=10,
    )
    assert resp.status_code == 200
    assert resp.headers["x-served-by"] == "canary"
    assert resp.headers["x-model-version"] == "v2"


def test_each_component_holds_only_its_own_credentials(stack: dict[str, Any]) -> None:
    state_dir = stack["state_dir"]
    folder = state_dir / "credentials"
    desc = json.loads((state_dir / "stack.json").read_text())

    def token(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {(folder / name).read_text().strip()}"}

    canary = next(c for c in desc["components"] if c["role"] == "model-canary")
    # The canary model's fault API refuses another role's fault credential and the operator's.
    for other in ("faults-router", "faults-model-baseline", "operator"):
        resp = requests.get(f"{canary['url']}/admin/faults", headers=token(other), timeout=5)
        assert resp.status_code == 401, (other, resp.text)
    resp = requests.get(
        f"{canary['url']}/admin/faults", headers=token("faults-model-canary"), timeout=5
    )
    assert resp.status_code == 200, resp.text
    # What each running process was given: only its own files.
    expected = {
        "model-canary": {"faults-model-canary"},
        "model-baseline": {"faults-model-baseline"},
        # Each router its own heartbeat credential, bound to its id (#27, finding 7).
        "router": {"faults-router", "samples"},
        "gate": {"faults-gate", "trip", "samples"},
        "rollback": {"faults-rollback", "rollback", "operator"},
        "broker": {"faults-broker"},  # and the folder, from which it reads its four
    }
    for comp in status(state_dir)["components"]:
        argv = Path(f"/proc/{comp['pid']}/cmdline").read_bytes().split(b"\0")
        given = {Path(a.decode()).name for a in argv if a.decode().startswith(str(folder) + "/")}
        own = {f"router-credential-{comp['name']}"} if comp["role"] == "router" else set()
        assert given == expected[comp["role"]] | own, (comp["name"], given)
    # A router's credential speaks for that router only.
    beat = {"router_id": "router-1", "release": desc["release"], "applied_revision": 1}
    resp = requests.post(
        f"{desc['broker_url']}/v1/routers/heartbeat",
        json=beat,
        headers=token("router-credential-router-0"),
        timeout=5,
    )
    assert resp.status_code == 403 and "belongs to router 'router-0'" in resp.text, resp.text
    # The broker knows who is who.
    who = requests.get(f"{desc['broker_url']}/v1/whoami", headers=token("trip"), timeout=5)
    assert who.status_code == 200 and who.json()["capabilities"] == ["trip"], who.text


def test_up_on_a_running_stack_changes_nothing(stack: dict[str, Any]) -> None:
    before = {c["name"]: c["pid"] for c in status(stack["state_dir"])["components"]}
    res = gameday("stack", "up", "--state-dir", str(stack["state_dir"]))
    assert res.returncode == 0, res.stderr
    assert "already running" in res.stdout and "nothing changed" in res.stdout
    after = {c["name"]: c["pid"] for c in status(stack["state_dir"])["components"]}
    assert after == before


def test_a_killed_pod_is_restarted_and_counted(stack: dict[str, Any]) -> None:
    def router0() -> dict[str, Any]:
        return next(c for c in status(stack["state_dir"])["components"] if c["name"] == "router-0")

    old = router0()
    os.kill(old["pid"], signal.SIGKILL)
    restarted = wait_for(
        lambda: (lambda c: c if c["pid"] not in (None, old["pid"]) and c["healthy"] else None)(
            router0()
        ),
        timeout=30,
        interval=0.2,
        what="router-0 to come back with a new PID",
    )
    assert isinstance(restarted, dict)
    assert restarted["restarts"] == old["restarts"] + 1


def test_logs_and_timeline(stack: dict[str, Any]) -> None:
    sd = str(stack["state_dir"])
    logs = gameday("stack", "logs", "router", "--state-dir", sd, "-n", "5")
    assert logs.returncode == 0, logs.stderr
    assert "router-0.log" in logs.stdout and "router-1.log" in logs.stdout
    bad = gameday("stack", "logs", "nope", "--state-dir", sd)
    assert bad.returncode == 2
    assert "unknown component 'nope'" in bad.stderr
    tl = gameday("stack", "timeline", "--state-dir", sd, "--json")
    assert tl.returncode == 0, tl.stderr
    events = json.loads(tl.stdout)["events"]
    assert events[0]["actor"] == "stack-up"
    assert events[0]["t_rel_s"] == 0


def test_a_busy_port_is_refused_with_a_way_out(tmp_path: Path) -> None:
    base = free_base_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", base))
        s.listen()
        res = gameday("stack", "up", "--state-dir", str(tmp_path / "st"), "--base-port", str(base))
    assert res.returncode == 2
    assert f"ports {base} are in use" in res.stderr
    assert "--base-port" in res.stderr


def test_a_bad_stack_config_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "stack.yaml"
    cfg.write_text("canary_weight: 150\n")
    res = gameday("stack", "up", "--state-dir", str(tmp_path / "st"), "--config", str(cfg))
    assert res.returncode == 2
    assert f"stack config {cfg}: field 'canary_weight'" in res.stderr
    cfg.write_text("args: {gateway: [--x]}\n")
    res = gameday("stack", "up", "--state-dir", str(tmp_path / "st"), "--config", str(cfg))
    assert res.returncode == 2
    assert "unknown role 'gateway'" in res.stderr


def test_down_stops_every_process(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    res = gameday(
        "stack", "up", "--state-dir", str(state_dir), "--base-port", str(free_base_port())
    )
    assert res.returncode == 0, res.stdout + res.stderr
    st = status(state_dir)
    pids = [c["pid"] for c in st["components"]] + [st["supervisord_pid"]]
    down = gameday("stack", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0 and "stopped" in down.stdout
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=20, what="all PIDs gone")
    res = gameday("stack", "status", "--state-dir", str(state_dir), "--json")
    assert res.returncode == 3
    assert json.loads(res.stdout)["running"] is False
    again = gameday("stack", "down", "--state-dir", str(state_dir))
    assert again.returncode == 0 and "no running stack" in again.stdout
