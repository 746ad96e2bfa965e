"""``probes.kubernetes.roll_out_bad_canary`` (issue #15 item 4: a faulty canary as a real
rollout of a bad build) against the FAKED Kubernetes API of tests/k8s_fake.py (real HTTP,
offline, in ``make test``; a PATCHed Deployment "rolls out" at once). The live cluster
(tests/test_k8s_live.py, experiments/k8s/faulty-canary-rollout.yaml) runs the rollout and
its undo for real; the fake serves no ReplicaSet list, so the undo is checked there only.

- the rollout is one JSON patch of the canary Deployment: the model container's args gain
  ``--kernel-fault VALUE`` (an earlier one replaced, not stacked) and the pod template the
  ``canarystack.io/build`` annotation; it returns once the pods are that build;
- the ledger gets an ``inject`` of kind ``kernel`` per bad pod, timed when the bad build
  was seen serving (after the patch), so the SLO checks measure detection from it;
- a malformed value, and a target whose blast radius leaves out model-canary, are refused
  before any request to the API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from chaoslib.exceptions import ActivityFailed

from gameday.faults import FaultLedger
from gameday.targets import rollout as core
from gameday.targets.rollout import BuildRolloutDetail, first_of, serving_since
from probes.kubernetes import BUILD_ANNOTATION, VERSION_ANNOTATION, roll_out_bad_canary
from tests.k8s_fake import FakeApi, pod, serve_fake, workload

NS = "stack"
LABELS = {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": "model-canary"}
ARGS = ["serve", "model", "--port", "18011", "--kernel-fault", "garbage:1"]


class _Health(BaseHTTPRequestHandler):
    """The bad build's server as the harness sees it once its pod is Ready: ``/health``
    saying it has been up ``uptime_s``."""

    uptime_s = 0.0
    serving_s: float | None = None  # an engine pod's: since its engine could serve

    def do_GET(self) -> None:
        health: dict[str, Any] = {"status": "ok", "uptime_s": self.uptime_s}
        if self.serving_s is not None:
            health["serving_s"] = self.serving_s
        body = json.dumps(health).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApi]:
    api = FakeApi()
    dep = workload("Deployment", "model-canary", desired=1, ready=1, namespace=NS,
                   labels=LABELS, annotations={VERSION_ANNOTATION: "v2"})  # fmt: skip
    dep["spec"]["template"]["spec"]["containers"] = [
        {"name": "model", "image": "canarystack", "args": list(ARGS)}
    ]
    api.add_workload(dep)
    old = pod("model-canary-0", LABELS, "10.0.3.1", namespace=NS)
    old["metadata"]["annotations"] = {VERSION_ANNOTATION: "v2"}
    api.add_pod(old)
    yield from serve_fake(api, tmp_path, monkeypatch)


def config(tmp_path: Path, components: list[str], port: int = 18011) -> dict[str, Any]:
    target = {
        "kind": "kubernetes",
        "namespace": NS,
        "urls": {"broker": "http://127.0.0.1:9"},  # nothing listens: annotations are best effort
        "ports": {"model-canary": port},
        "blast_radius": {"namespaces": [NS], "components": components},
    }
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target))
    return {"gameday_target": str(path), "gameday_run_dir": str(tmp_path / "run")}


def test_the_bad_build_is_rolled_out_by_one_patch_and_ledgered_when_it_serves(
    fake: FakeApi, tmp_path: Path
) -> None:
    cfg = config(tmp_path, ["model-canary"])
    out = roll_out_bad_canary(kernel_fault="nan-logits:100", deadline_s=20, configuration=cfg)
    build = "kernel-fault=nan-logits:100"
    assert out["build"] == build and out["deployment"] == "model-canary"
    (patch,) = [s for s in fake.seen if s.method == "PATCH"]
    assert patch.path == f"/apis/apps/v1/namespaces/{NS}/deployments/model-canary"
    bad_args = ["serve", "model", "--port", "18011", "--kernel-fault", "nan-logits:100"]
    assert patch.body == [
        {"op": "replace", "path": "/spec/template/spec/containers",
         "value": [{"name": "model", "image": "canarystack", "args": bad_args}]},
        {"op": "replace", "path": "/spec/template/metadata/annotations",
         "value": {VERSION_ANNOTATION: "v2", BUILD_ANNOTATION: build}},
    ]  # fmt: skip
    pods = list(fake.pods[NS].values())
    assert [p["metadata"]["annotations"][BUILD_ANNOTATION] for p in pods] == [build]
    (entry,) = FaultLedger(tmp_path / "run" / "faults.jsonl").entries()
    assert (entry.action, entry.kind, entry.component) == ("inject", "kernel", "model-canary")
    assert entry.replica == pods[0]["metadata"]["name"]
    assert entry.params == {"mode": "nan-logits", "min_prompt_tokens": 100, "build": build}
    detail = cast(BuildRolloutDetail, entry.detail)  # what roll_out_build booked
    assert entry.time >= detail["patched_at"] == out["patched_at"]
    # the fault time is when the bad build's container started (it may serve before its
    # readiness is seen), not when the whole rollout was seen done; its pod's address
    # (10.9.0.1) is never called here: no /health says when its server began
    assert detail["listening_at"] is None
    started = detail["container_started_at"]
    assert started is not None and entry.time == started <= detail["rolled_out_at"]
    assert entry.url == "http://10.9.0.1:18011"


class _Release:
    """A broker's release in memory: what ``hold_traffic`` reads and patches, in order."""

    def __init__(self, phase: str = "progressing", weight: int = 5) -> None:
        self.state: dict[str, Any] = {"phase": phase, "weights": {"canary": weight}}
        self.patches: list[tuple[dict[str, Any], str]] = []
        self.deployment_patches_before: list[int] = []

    def broker(self, seen: Any = None) -> core.Broker:
        def patch(change: Any, reason: str) -> Any:
            self.patches.append((change, reason))
            self.state["weights"].update(change["weights"])
            if seen is not None:  # how many Deployment patches the API had seen by then
                self.deployment_patches_before.append(sum(1 for s in seen if s.method == "PATCH"))
            return json.loads(json.dumps(self.state))

        return core.Broker(
            lambda: json.loads(json.dumps(self.state)), patch, lambda v: v, lambda v, m: None
        )


def test_held_traffic_comes_back_only_to_a_release_still_progressing_at_zero() -> None:
    quiet = _Release(weight=0)
    assert core.hold_canary_traffic(quiet.broker()) is None and quiet.patches == []
    tripped = _Release(phase="tripped")
    assert core.hold_canary_traffic(tripped.broker()) is None and tripped.patches == []
    held = _Release()
    broker = held.broker()
    assert core.hold_canary_traffic(broker) == 5
    assert held.patches == [({"weights": {"canary": 0}}, core.HOLD_REASON)]
    held.state["phase"] = "tripped"  # the gate (or an operator) acted meanwhile: it wins
    assert core.give_canary_traffic_back(broker, 5, "ready") is None
    held.state["phase"] = "progressing"
    assert core.give_canary_traffic_back(broker, 5, "ready") is not None
    assert held.state["weights"]["canary"] == 5


def test_a_held_rollout_gives_the_canary_traffic_only_once_its_pods_serve(
    fake: FakeApi, tmp_path: Path
) -> None:
    """hold_traffic (vLLM pods start for a minute): weight 0 before the Deployment's
    patch, back after the rollout, and the fault timed from then."""
    from probes._context import ledger
    from probes.kubernetes import canary_change

    cfg = config(tmp_path, ["model-canary"])
    release = _Release()
    with canary_change(cfg, "roll_out_bad_canary", 20, "testing") as change:
        broker = release.broker(fake.seen)
        value, mode, tokens = "nan-logits:100", "nan-logits", "100"
        core.roll_out_bad_build(change, value, mode, tokens, ledger(cfg), hold=broker)
    assert [c for c, _ in release.patches] == [
        {"weights": {"canary": 0}},
        {"weights": {"canary": 5}},
    ]
    assert release.deployment_patches_before == [0, 1]  # held before, back after the patch
    (entry,) = FaultLedger(tmp_path / "run" / "faults.jsonl").entries()
    detail = cast(BuildRolloutDetail, entry.detail)
    assert detail["traffic_held"] == 5
    assert entry.time == detail["traffic_back_at"] >= detail["rolled_out_at"]


def test_a_hold_that_is_not_a_bool_is_refused(fake: FakeApi, tmp_path: Path) -> None:
    cfg = config(tmp_path, ["model-canary"])
    with pytest.raises(ActivityFailed, match="argument hold_traffic is 'yes': give true or false"):
        roll_out_bad_canary(kernel_fault="nan-logits:100", hold_traffic="yes", configuration=cfg)  # type: ignore[arg-type]


def test_the_fault_time_is_when_the_bad_builds_server_could_first_serve(
    fake: FakeApi, health_port: int, tmp_path: Path
) -> None:
    """The API's container start is whole seconds and precedes the interpreter's start-up
    (the loopback cluster's router first sent the bad build users ~3 s after it): the
    ledger times the fault by the server's own /health uptime, read once it is Ready (the
    fake rolls out at once, so a server up since just now)."""
    fake.rollout_host_network = True  # its server on 127.0.0.1:health_port
    cfg = config(tmp_path, ["model-canary"], port=health_port)
    out = roll_out_bad_canary(kernel_fault="nan-logits:100", deadline_s=20, configuration=cfg)
    after = time.time()
    (entry,) = FaultLedger(tmp_path / "run" / "faults.jsonl").entries()
    detail = cast(BuildRolloutDetail, entry.detail)  # what roll_out_build booked
    listening = detail["listening_at"]
    assert entry.url == f"http://127.0.0.1:{health_port}"
    assert listening is not None and detail["patched_at"] <= listening <= after
    assert detail["container_started_at"] is not None
    assert detail["container_started_at"] <= listening
    # a server up since just now answered after the rollout was seen done: never later
    assert entry.time == min(listening, detail["rolled_out_at"]) == out["serving_at"]


def test_the_fault_time_prefers_the_servers_word_then_the_container_then_the_rollout() -> None:
    assert first_of(10.5, 10.0, 12.0) == 10.5  # the server could serve from 10.5
    assert first_of(None, 10.0, 12.0) == 10.0  # no /health uptime: the container start
    assert first_of(None, None, 12.0) == 12.0  # neither: when the rollout was seen done
    assert first_of(13.0, 10.0, 12.0) == 12.0  # Ready (so serving) by 12 whatever it says


def test_serving_since_is_the_answer_time_less_the_uptime_never_before_the_bound(
    health_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Health, "uptime_s", 0.75)
    url = f"http://127.0.0.1:{health_port}"
    before = time.time()
    since = serving_since([url], not_before=0.0)
    after = time.time()
    assert since is not None and before - 0.75 <= since <= after - 0.75
    assert serving_since([url], not_before=after) == after  # a server cannot predate its pod
    # nothing answers (a port nothing listens on): no estimate, the caller falls back
    assert serving_since(["http://127.0.0.1:9"], not_before=0.0) is None


def test_an_engine_pod_is_serving_since_its_engine_could_not_since_its_wrapper_started(
    health_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vLLM pod's wrapper answers a minute before its engine serves: the fault time is
    the engine's (serving_s), else the bad build's minute of start-up counts as detection
    time."""
    monkeypatch.setattr(_Health, "uptime_s", 90.0)
    monkeypatch.setattr(_Health, "serving_s", 2.5)
    before = time.time()
    since = serving_since([f"http://127.0.0.1:{health_port}"], not_before=0.0)
    assert since is not None and before - 2.5 <= since <= time.time() - 2.5


@pytest.mark.parametrize("value", ["", "nan logits", ":100", "nan-logits:many"])
def test_a_malformed_kernel_fault_is_refused_before_any_request(
    fake: FakeApi, tmp_path: Path, value: str
) -> None:
    with pytest.raises(ActivityFailed, match="argument kernel_fault"):
        roll_out_bad_canary(kernel_fault=value, configuration=config(tmp_path, ["model-canary"]))
    assert fake.seen == []


def test_a_canary_outside_the_blast_radius_is_never_rolled(fake: FakeApi, tmp_path: Path) -> None:
    with pytest.raises(ActivityFailed, match="model-canary"):
        roll_out_bad_canary(configuration=config(tmp_path, ["router"]))
    assert fake.seen == []
