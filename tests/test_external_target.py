"""``kind: external``: the target file, what a foreign stack can and cannot run, pod kills by
a checked command line, the gate observer's history, and Envoy faults' TTL watchdog.

Real processes where they matter (a process to kill, a watchdog that outlives its parent);
the Envoy admin in the watchdog test is a small recording HTTP server, since what is under
test is the watchdog's clock, not Envoy (tests/test_foreign_stack.py runs the real one).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from gameday.observers import GateSnapshot, history, release_now
from gameday.observers.kubernetes import ArgoRolloutsObserver, route_share
from gameday.run.capabilities import missing, needs
from gameday.targets import TargetError, envoy_faults, load_target, parse_target
from gameday.targets.external import ExternalTarget
from gameday.targets.local import read_cmdline

ROOT = Path(__file__).resolve().parent.parent
FOREIGN = ROOT / "targets" / "foreign.yaml"
# What the foreign stack (Envoy, the fault proxy, an alert) can run: the list.
APPLICABLE = {
    "control.yaml",
    "control/benign-noise.yaml",
    "control/small-drift.yaml",
    "router/latency.yaml",
    "router/pod-kill.yaml",
    "router/faulty-kernel.yaml",
    "router/broken-kernel.yaml",
    "router/canary-errors.yaml",
    "hostile/broken-kernel.yaml",
    "hostile/client-flood.yaml",
    "hostile/pins-after-trip.yaml",
    "hostile/pins-after-errors.yaml",
}


def _experiments() -> dict[str, dict]:
    found = {}
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        rel = path.relative_to(ROOT / "experiments").as_posix()
        if rel.startswith(("k8s/", "stack-configs/")):
            continue
        found[rel] = yaml.safe_load(path.read_text())
    return found


def test_the_foreign_target_file_loads_and_says_what_it_can_do() -> None:
    target = load_target(FOREIGN)
    assert isinstance(target, ExternalTarget)
    assert target.capabilities() >= {
        "observer",
        "pins",
        "faults:router:latency",
        "faults:model-canary:kernel",
        "faults:model-canary:errors",
        "kill:router",
        "kill:model-canary",
    }
    assert "broker" not in target.capabilities()
    assert target.replicas("broker") == []
    with pytest.raises(
        TargetError, match="not applicable: external target 'foreign' has no broker"
    ):
        target.service_url("broker")


def test_exactly_the_expected_experiments_apply_to_the_foreign_stack() -> None:
    target = load_target(FOREIGN)
    applicable = {name for name, exp in _experiments().items() if not missing(target, exp)}
    assert applicable == APPLICABLE


def test_a_not_applicable_experiment_names_what_the_target_lacks() -> None:
    target = load_target(FOREIGN)
    reasons = missing(target, _experiments()["broker/latency.yaml"])
    assert reasons == [
        "not applicable: target 'foreign' lacks a way to inject latency into broker "
        "(components.broker.faults), which action 'slow-the-broker' needs"
    ]
    dep = missing(target, _experiments()["dependency/latency.yaml"])
    assert any("the stack's shared Redis" in r for r in dep)


def test_canarystack_targets_have_every_capability() -> None:
    local = parse_target({"kind": "local"})
    for exp in _experiments().values():
        assert missing(local, exp) == []


def test_needs_reads_the_method_and_the_declared_requirements() -> None:
    exp = {
        "extensions": [{"name": "gameday", "requires": ["pins"]}],
        "method": [
            {
                "type": "action",
                "name": "slow",
                "provider": {
                    "type": "python",
                    "module": "probes.faults",
                    "func": "inject_latency",
                    "arguments": {"component": "model", "ms": 5},
                },
            }
        ],
    }
    assert needs(exp) == {
        "pins": "declared in the experiment's gameday extension (requires)",
        "faults:model-baseline:latency": "action 'slow'",
        "faults:model-canary:latency": "action 'slow'",
    }


def test_a_bad_external_target_file_gets_a_clear_message() -> None:
    with pytest.raises(TargetError, match=r"components\.router is required"):
        parse_target({"kind": "external", "components": {"model-canary": {"url": "x"}}})
    with pytest.raises(TargetError, match="needs credential_file or credential_env"):
        parse_target(
            {
                "kind": "external",
                "components": {"router": {"url": "u", "faults": {"backend": "fault-proxy"}}},
            }
        )
    with pytest.raises(TargetError, match="use roles from"):
        parse_target({"kind": "external", "components": {"router": {"url": "u"}, "db": {}}})


def _target(match: list[str]) -> ExternalTarget:
    target = parse_target(
        {
            "kind": "external",
            "components": {
                "router": {"url": "http://127.0.0.1:1"},
                "model-canary": {"url": "http://127.0.0.1:2", "kill": {"match": match}},
            },
            "blast_radius": {"components": ["model-canary"]},
        }
    )
    assert isinstance(target, ExternalTarget)
    return target


def _sleeper(tag: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--pod", tag],
        stdin=subprocess.DEVNULL,
    )
    # Until the new program has replaced the forked test process, /proc shows pytest's argv.
    assert _wait(lambda: tag in (read_cmdline(proc.pid) or []))
    return proc


def test_a_pod_kill_hits_the_one_process_whose_command_line_matches() -> None:
    tag = f"canary-{time.time_ns()}"
    proc = _sleeper(tag)
    try:
        killed = _target(["--pod", tag]).kill_pod("model-canary")
        assert proc.wait(timeout=10) == -9
        assert killed.detail["pid"] == proc.pid
        assert killed.detail["verified"] == f"/proc cmdline holds `--pod {tag}`"
    finally:
        proc.kill()
        proc.wait()


def test_a_pod_kill_refuses_when_the_match_is_not_exactly_one_process() -> None:
    tag = f"twin-{time.time_ns()}"
    twins = [_sleeper(tag), _sleeper(tag)]
    try:
        with pytest.raises(TargetError, match="refusing to kill a pod of model-canary: 2"):
            _target(["--pod", tag]).kill_pod("model-canary")
        with pytest.raises(TargetError, match="0 processes match"):
            _target(["--pod", "nobody-" + tag]).kill_pod("model-canary")
        assert all(p.poll() is None for p in twins)
    finally:
        for p in twins:
            p.kill()
            p.wait()


def test_a_pod_kill_outside_the_blast_radius_is_refused() -> None:
    with pytest.raises(TargetError, match="outside the blast radius"):
        _target(["--pod", "x"]).kill_pod("router")


def _snap(t: float, **kw: Any) -> GateSnapshot:
    base: dict[str, Any] = {
        "tripped": False,
        "tripped_since": None,
        "canary_weight": 5.0,
        "pins_to_canary": True,
    }
    base.update(kw)
    return GateSnapshot(t, sees=True, **base)


def test_the_observers_history_reads_like_the_brokers() -> None:
    snaps = [
        _snap(100.0),
        _snap(101.0, tripped=True, tripped_since=100.6, signal="CanaryErrorRate"),
        _snap(101.2, tripped=True, canary_weight=0.0, signal="CanaryErrorRate"),
    ]
    events = history(snaps, "observer:x")
    assert [(e["seq"], e["time"], e["change"]) for e in events] == [
        (
            1,
            100.6,
            {
                "phase": {"old": "progressing", "new": "tripped"},
                "trip": {"test": "CanaryErrorRate", "bucket": None, "samples": None},
            },
        ),
        (2, 101.2, {"weights": {"canary": 0}}),
        (3, 101.2, {"annotation": "routers_applied", "canary_off_at": 101.2}),
        (4, 101.2, {"phase": {"old": "tripped", "new": "rolled_back"}}),
    ]
    release = release_now(snaps[:-1], snaps[-1], "default")
    assert release["phase"] == "rolled_back"
    assert release["weights"] == {"canary": 0.0, "stable": 100.0}


def test_a_healthy_gate_has_no_history_and_a_progressing_release() -> None:
    snaps = [_snap(1.0), _snap(2.0)]
    assert history(snaps, "o") == []
    assert release_now(snaps, snaps[-1], "r")["phase"] == "progressing"


def test_a_weight_set_to_zero_without_an_alert_is_a_trip_at_that_moment() -> None:
    events: Sequence[Mapping[str, Any]] = history([_snap(1.0), _snap(2.0, canary_weight=0.0)], "o")
    assert events[0]["time"] == 2.0
    assert events[0]["change"]["phase"]["new"] == "tripped"


class _Admin(http.server.BaseHTTPRequestHandler):
    calls: list[tuple[float, str]] = []

    def do_POST(self) -> None:
        _Admin.calls.append((time.time(), self.path))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def admin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GAMEDAY_ENVOY_FAULTS_DIR", str(tmp_path))
    _Admin.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _wait(cond, deadline_s: float = 15.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_an_envoy_fault_is_reset_by_its_watchdog_at_its_ttl(admin: str) -> None:
    faults = envoy_faults.EnvoyFaults(admin, "router")
    fault_id = faults.inject("latency", 1.0, {"ms": 200}, None)
    assert "fixed_delay_percent=100" in _Admin.calls[0][1]
    assert faults.active()
    # The watchdog is a process of its own: it resets the keys with nobody else acting.
    assert _wait(lambda: any("fixed_delay_percent=0" in p for _, p in _Admin.calls))
    assert _wait(lambda: not faults.active())
    assert faults.clear(fault_id, None) is False  # already gone: expired


def test_clearing_an_envoy_fault_resets_it_and_stops_its_watchdog(admin: str) -> None:
    faults = envoy_faults.EnvoyFaults(admin, "router")
    fault_id = faults.inject("errors", 60.0, {"rate": 0.5}, None)
    (state,) = faults._states()
    assert "abort_percent=50" in _Admin.calls[0][1]
    assert faults.clear(fault_id, None) is True
    assert "abort_percent=0" in _Admin.calls[-1][1]
    assert _wait(lambda: not Path(f"/proc/{state['pid']}").exists() or _zombie(state["pid"]))
    assert faults.active() == []


def _zombie(pid: int) -> bool:
    try:
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True


def test_a_newer_envoy_fault_of_a_kind_replaces_the_older(admin: str) -> None:
    faults = envoy_faults.EnvoyFaults(admin, "router")
    faults.inject("latency", 60.0, {"ms": 100}, None)
    second = faults.inject("latency", 60.0, {"ms": 300}, None)
    assert [s["fault_id"] for s in faults._states()] == [second]
    faults.clear(second, None)


def test_bad_envoy_fault_params_are_refused_with_the_param_named(admin: str) -> None:
    faults = envoy_faults.EnvoyFaults(admin, "router")
    with pytest.raises(TargetError, match="envoy latency fault: ms is -1"):
        faults.inject("latency", 10.0, {"ms": -1}, None)
    with pytest.raises(TargetError, match="envoy has no fault kind 'hang'"):
        faults.inject("hang", 10.0, {}, None)
    assert _Admin.calls == []


def test_route_weights_are_read_as_the_canary_share() -> None:
    httproute = {
        "spec": {
            "rules": [
                {"backendRefs": [{"name": "b", "weight": 95}, {"name": "c", "weight": 5}]},
                {"backendRefs": [{"name": "b"}]},  # a rule without the canary: not counted
            ]
        }
    }
    assert route_share(httproute, "HTTPRoute", "c") == 5.0
    assert route_share(httproute, "HTTPRoute", "nobody") is None
    vs = {
        "spec": {
            "http": [
                {"route": [{"destination": {"host": "llm", "subset": "canary"}}]},  # a pin
                {
                    "route": [
                        {"destination": {"host": "llm", "subset": "stable"}, "weight": 80},
                        {"destination": {"host": "llm", "subset": "canary"}, "weight": 20},
                    ]
                },
            ]
        }
    }
    # The worst rule: a pin route that sends everything to the canary is 100 %.
    assert route_share(vs, "VirtualService", "canary") == 100.0


def test_a_kubernetes_observer_is_built_from_the_target_file(tmp_path: Path) -> None:
    target = parse_target(
        {
            "kind": "external",
            "components": {"router": {"url": "http://127.0.0.1:1"}},
            "observations": str(tmp_path / "o.jsonl"),
            "observer": {"kind": "argo-rollouts", "namespace": "llm", "name": "vllm"},
        }
    )
    assert isinstance(target, ExternalTarget)
    observer = target.observer()
    assert isinstance(observer, ArgoRolloutsObserver)
    assert observer.log.path == tmp_path / "o.jsonl"
    with pytest.raises(TargetError, match=r"field 'observer\.argo-rollouts\.name'"):
        parse_target(
            {
                "kind": "external",
                "components": {"router": {"url": "u"}},
                "observer": {"kind": "argo-rollouts", "namespace": "llm"},
            }
        )


def _records(folder: Path, rows: list[tuple[float, str, int]]) -> None:
    from gameday.load.records import LOAD_SCHEMA, ParquetSink

    sink = ParquetSink(folder / "records.parquet", LOAD_SCHEMA)
    for i, (start, served_by, tokens) in enumerate(rows):
        sink.add({"request_id": f"r{i}", "start_time": start, "served_by": served_by,
                  "prompt_tokens": tokens, "ok": True, "status": 200})  # fmt: skip
    sink.close()


def test_exposed_answers_counts_what_the_faulty_canary_served_after_its_fault(
    tmp_path: Path,
) -> None:
    from gameday.evidence.ledger import FaultEntry
    from gameday.faults import FaultLedger
    from gameday.run.external import exposed_answers

    assert exposed_answers(tmp_path) is None  # no fault on the canary: nothing to be exposed to
    FaultLedger(tmp_path / "faults.jsonl").append(
        FaultEntry(
            "inject",
            100.0,
            "model-canary",
            "c",
            "u",
            "kernel",
            "f1",
            60.0,
            {"min_prompt_tokens": 2048},
        )
    )
    _records(
        tmp_path,
        [
            (99.0, "canary", 4000),  # before the fault
            (101.0, "canary", 4000),  # exposed
            (102.0, "canary", 100),  # a short prompt: the kernel fault does not reach it
            (103.0, "baseline", 4000),
            (104.0, "canary", 2048),  # exposed
        ],
    )
    assert exposed_answers(tmp_path) == 2


# The docs' examples of users' stacks (targets/examples/): what applies to each.
EXAMPLE_APPLICABLE = {
    "control.yaml",
    "control/benign-noise.yaml",
    "control/small-drift.yaml",
    "router/canary-errors.yaml",
    "hostile/broken-kernel.yaml",
    "hostile/client-flood.yaml",
    "hostile/pins-after-trip.yaml",
    "hostile/pins-after-errors.yaml",
}


@pytest.mark.parametrize("name", ["argo-rollouts-istio-vllm", "flagger-gateway-vllm"])
def test_the_docs_example_targets_load_and_say_what_applies(name: str) -> None:
    target = load_target(ROOT / "targets" / "examples" / f"{name}.yaml")
    assert isinstance(target, ExternalTarget)
    applicable = {n for n, exp in _experiments().items() if not missing(target, exp)}
    assert applicable == EXAMPLE_APPLICABLE
    assert target.model_name == "llama-3-8b-instruct"


def test_a_kill_spec_says_what_each_backend_needs() -> None:
    base = {"kind": "external", "components": {"router": {"url": "u"}, "model-canary": {}}}

    def with_kill(kill: dict[str, Any]) -> Any:
        data = json.loads(json.dumps(base))
        data["components"]["model-canary"]["kill"] = kill
        return parse_target(data)

    with pytest.raises(TargetError, match="a process kill needs match"):
        with_kill({"backend": "process"})
    with pytest.raises(TargetError, match="a kubernetes kill needs namespace, selector and"):
        with_kill({"backend": "kubernetes", "namespace": "llm"})
    target = with_kill(
        {
            "backend": "kubernetes",
            "namespace": "llm",
            "selector": "app=x",
            "workload": "deployment/x",
        }
    )
    assert "kill:model-canary" in target.capabilities()
