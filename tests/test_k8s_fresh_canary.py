"""``probes.kubernetes.start_fresh_canary`` with a REAL broker process and a FAKED Kubernetes
API (tests/k8s_fake.py: a PATCHed Deployment "rolls out" at once, its pods replaced).

- after a trip and rollback (canary quarantined), it rolls the canary Deployment to a new
  version — a JSON patch of the pod-template annotation only — waits until the pods carry
  it, registers the version and sets the release back to progressing with the weight;
- an already-progressing release with the weight is left alone (no request to the
  Kubernetes API, no broker write); a different weight is only a weight change;
- a target whose blast radius leaves out model-canary is refused before any request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from chaoslib.exceptions import ActivityFailed

from probes.kubernetes import VERSION_ANNOTATION, start_fresh_canary
from tests.broker_support import Api, drive_to, start_broker
from tests.k8s_fake import FakeApi, pod, serve_fake, workload
from tests.procs import ADMIN_TOKEN, Proc, Spawner

NS = "stack"
LABELS = {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": "model-canary"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeApi]:
    api = FakeApi()
    api.add_workload(workload("Deployment", "model-canary", desired=1, ready=1, namespace=NS,
                              labels=LABELS, annotations={VERSION_ANNOTATION: "v2"}))  # fmt: skip
    old = pod("model-canary-0", LABELS, "10.0.3.1", namespace=NS)
    old["metadata"]["annotations"] = {VERSION_ANNOTATION: "v2"}
    api.add_pod(old)
    monkeypatch.setenv("CANARYSTACK_ADMIN_TOKEN", ADMIN_TOKEN)
    yield from serve_fake(api, tmp_path, monkeypatch)


@pytest.fixture
def broker(spawn: Spawner, tmp_path: Path) -> Proc:
    proc = start_broker(spawn, tmp_path / "broker")
    api = Api(proc.url)
    api.register("v1")
    api.register("v2")
    api.create("default", stable="v1", canary="v2", weight=5)
    return proc


def config(tmp_path: Path, broker_url: str, components: list[str]) -> dict[str, Any]:
    target = {
        "kind": "kubernetes",
        "namespace": NS,
        "release": "default",
        "urls": {"broker": broker_url},
        "blast_radius": {"namespaces": [NS], "components": components},
    }
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target))
    return {"gameday_target": str(path), "gameday_run_dir": str(tmp_path / "run")}


def test_after_a_rollback_the_canary_is_rolled_to_a_fresh_version(
    fake: FakeApi, broker: Proc, tmp_path: Path
) -> None:
    api = Api(broker.url)
    drive_to(api, "default", "rolled_back")
    quarantine = api.write("POST", "/v1/versions/v2/quarantine", {"actor": "t", "reason": "bad"})
    assert quarantine.status_code == 200, quarantine.text
    cfg = config(tmp_path, broker.url, ["model-canary"])
    out = start_fresh_canary(weight=7, deadline_s=30, configuration=cfg)
    assert out["changed"] is True and out["previous_phase"] == "rolled_back"
    version = out["canary_version"]
    assert version.startswith("v2-g") and out["previous_canary_version"] == "v2"
    release = api.release("default")
    assert release["phase"] == "progressing"
    assert release["canary"]["version"] == version and not release["canary"]["quarantined"]
    assert release["weights"] == {"canary": 7}
    # one JSON patch of the annotation, nothing else
    (patch,) = [s for s in fake.seen if s.method == "PATCH"]
    assert patch.path == f"/apis/apps/v1/namespaces/{NS}/deployments/model-canary"
    assert patch.content_type.startswith("application/json-patch+json")
    path = "/spec/template/metadata/annotations/canarystack.io~1model-version"
    assert patch.body == [{"op": "add", "path": path, "value": version}]
    pods = fake.pods[NS].values()
    assert [p["metadata"]["annotations"][VERSION_ANNOTATION] for p in pods] == [version]
    # the version on the broker has the contract's digest and names its predecessor
    registered = requests.get(f"{broker.url}/v1/versions/{version}", timeout=5).json()
    assert registered["manifest"]["previous"] == "v2"
    # again: already fresh, nothing is touched
    seen = len(fake.seen)
    again = start_fresh_canary(weight=7, configuration=cfg)
    assert again == {"changed": False, "phase": "progressing", "canary_version": version}
    assert len(fake.seen) == seen
    # the next rollback's successor drops the old suffix instead of stacking them
    drive_to(api, "default", "rolled_back")
    third = start_fresh_canary(weight=7, deadline_s=30, configuration=cfg)
    assert third["canary_version"].count("-g") == 1


def test_a_progressing_release_only_gets_its_weight(
    fake: FakeApi, broker: Proc, tmp_path: Path
) -> None:
    cfg = config(tmp_path, broker.url, ["model-canary"])
    out = start_fresh_canary(weight=10, configuration=cfg)
    assert out == {"changed": True, "phase": "progressing", "canary_version": "v2", "weight": 10}
    assert Api(broker.url).release("default")["weights"] == {"canary": 10}
    assert not [s for s in fake.seen if s.method == "PATCH"]


def test_outside_the_blast_radius_nothing_is_touched(
    fake: FakeApi, broker: Proc, tmp_path: Path
) -> None:
    api = Api(broker.url)
    drive_to(api, "default", "rolled_back")
    before = api.release("default")["revision"]
    cfg = config(tmp_path, broker.url, ["router"])
    with pytest.raises(ActivityFailed, match="component model-canary is outside the blast radius"):
        start_fresh_canary(configuration=cfg)
    assert fake.seen == [] and api.release("default")["revision"] == before
    with pytest.raises(ActivityFailed, match="weight must be from 1 to 100"):
        start_fresh_canary(weight=0, configuration=cfg)
