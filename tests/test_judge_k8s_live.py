"""The drift judge's Argo Rollouts and Flagger examples (deploy/judge/) on the real
kube-apiserver of the loopback cluster (#29), live:

- the AnalysisTemplate, the Flagger MetricTemplate and the Canary are created through the
  API and validate against their CRDs (the stand-ins in deploy/loopback/crds/ with the real
  group, version and kind, applied here when the cluster lacks them); what the API server
  stored is what the files say, and an object the schema forbids is refused (422);
- the objects *as the API server returns them* then drive the requests their controllers
  would send to a real judge (between two real simulators): the AnalysisTemplate's web
  metric URL with its args filled in, GET with Go's default headers, its ``jsonPath`` and
  conditions evaluated on the answer; the Canary's rollout webhook, POSTed with Flagger's
  payload and metadata.

Skipped unless CANARY_GAMEDAY_K8S_LIVE=1. It never starts or stops the cluster: with none
running it skips, saying to run ``make k8s-up`` first. Run it alone with

    CANARY_GAMEDAY_K8S_LIVE=1 .venv/bin/python -m pytest -m k8s_live tests/test_judge_k8s_live.py
"""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from tests.procs import Proc, Spawner, pid_alive, stopping
from tests.test_judge import ENGINE, flagger_post
from tests.test_k8s_live import LOOPBACK, admin_call, live_marks, recorded_pids, recreate

ROOT = Path(__file__).resolve().parent.parent
JUDGE_DIR = ROOT / "deploy" / "judge"
NS = "judge-live"
CRDS = {
    "analysistemplates.argoproj.io": "argo-analysis.yaml",
    "metrictemplates.flagger.app": "flagger-metrics.yaml",
    "canaries.flagger.app": "flagger.yaml",
}
ANALYSIS = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/analysistemplates"
METRICS = f"/apis/flagger.app/v1beta1/namespaces/{NS}/metrictemplates"
CANARIES = f"/apis/flagger.app/v1beta1/namespaces/{NS}/canaries"

pytestmark = live_marks(300, "CANARY_GAMEDAY_K8S_LIVE=1 with the cluster up")


def _doc(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((JUDGE_DIR / name).read_text()))


def _ensure_crd(name: str, file: str) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    if admin_call("GET", path)[0] == 404:
        crd = yaml.safe_load((LOOPBACK / "crds" / file).read_text())
        code, body = admin_call(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
        )
        assert code in (201, 409), body
    deadline = time.monotonic() + 60
    while True:
        conditions = admin_call("GET", path)[1].get("status", {}).get("conditions", [])
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        assert time.monotonic() < deadline, f"CRD {name} not Established: {conditions}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster() -> None:
    pids = recorded_pids()
    if not pids or not all(pid_alive(p) for p in pids.values()):
        pytest.skip("the loopback cluster is not running: `make k8s-up` first (this test "
                    "never starts or stops it)")  # fmt: skip
    code, body = admin_call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert code in (201, 409), body
    for name, file in CRDS.items():
        _ensure_crd(name, file)


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A real judge between two real simulators (release ``llm``, as the examples)."""
    with stopping(Spawner(tmp_path_factory.mktemp("judge-live"))) as spawn:
        baseline = spawn("canarystack.model", *ENGINE)
        canary = spawn("canarystack.model", *ENGINE)
        yield spawn("canarystack.judge", "--release", f"llm={baseline.url},{canary.url}")


def _stored(collection: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Create ``doc`` through the API (validated by its CRD) and read it back."""
    path = recreate(collection, doc)
    code, stored = admin_call("GET", path)
    assert code == 200, stored
    return stored


def _args(template: dict[str, Any], **given: str) -> dict[str, str]:
    """An AnalysisRun's args: the template's defaults, then the Rollout's values."""
    out = {a["name"]: a.get("value") for a in template["spec"]["args"]}
    out.update(given)
    missing = [k for k, v in out.items() if v is None]
    assert not missing, f"args without a value: {missing}"
    return {k: str(v) for k, v in out.items()}


def _argo_measure(metric: dict[str, Any], args: dict[str, str]) -> tuple[str, str]:
    """What Argo Rollouts' web provider does with ``metric``: fill the args, GET the URL
    with the metric's headers and Go's defaults, take ``jsonPath``, and decide the phase
    from the conditions (a ``result == "x"`` comparison, as these templates write them)."""
    web = metric["provider"]["web"]
    url = re.sub(r"\{\{\s*args\.([\w-]+)\s*\}\}", lambda m: args[m.group(1)], web["url"])
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=web["timeoutSeconds"]
    )
    conn.putrequest(web.get("method", "GET"), parts.path, skip_accept_encoding=True)
    conn.putheader("User-Agent", "Go-http-client/1.1")
    conn.putheader("Accept-Encoding", "gzip")
    for header in web.get("headers", []):
        conn.putheader(header["key"], header["value"])
    conn.endheaders()
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    if not 200 <= resp.status < 300:
        return "Error", str(resp.status)
    key = re.fullmatch(r"\{\$\.(\w+)\}", web["jsonPath"])
    assert key, web["jsonPath"]
    result = str(body[key.group(1)])

    def holds(condition: str) -> bool:
        m = re.fullmatch(r'result == "(\w+)"', condition)
        assert m, condition
        return result == m.group(1)

    if holds(metric["successCondition"]):
        return "Successful", result
    if holds(metric["failureCondition"]):
        return "Failed", result
    return "Inconclusive", result


def test_the_examples_validate_against_their_crds_and_are_stored_as_written(
    cluster: None,
) -> None:
    for collection, file in (
        (ANALYSIS, "analysis-template.yaml"),
        (METRICS, "flagger-metric-template.yaml"),
        (CANARIES, "flagger-canary.yaml"),
    ):
        doc = _doc(file)
        stored = _stored(collection, doc)
        assert stored["spec"] == doc["spec"], file


def test_the_crds_refuse_what_the_real_schemas_refuse(cluster: None) -> None:
    at = _doc("analysis-template.yaml")
    at["metadata"]["name"] = "no-url"
    del at["spec"]["metrics"][0]["provider"]["web"]["url"]
    code, body = admin_call("POST", ANALYSIS, at)
    assert code == 422 and "url" in body.get("message", ""), body
    mt = _doc("flagger-metric-template.yaml")
    mt["metadata"]["name"] = "bad-provider"
    mt["spec"]["provider"]["type"] = "carrier-pigeon"
    code, body = admin_call("POST", METRICS, mt)
    assert code == 422 and "provider.type" in body.get("message", ""), body


def test_the_stored_analysis_template_drives_argos_request_to_a_real_judge(
    cluster: None, judge: Proc
) -> None:
    template = _stored(ANALYSIS, _doc("analysis-template.yaml"))
    (metric,) = template["spec"]["metrics"]
    args = _args(template, release="llm", **{"judge-url": judge.url})
    phase, result = _argo_measure(metric, args)
    # A fresh judge has no comparisons yet: neither pass nor fail, the Rollout waits.
    assert (phase, result) == ("Inconclusive", "inconclusive")
    args["release"] = "not-judged"
    assert _argo_measure(metric, args)[0] == "Error"  # 404: a measurement error


def test_the_stored_canarys_webhook_is_answered_as_flagger_expects(
    cluster: None, judge: Proc
) -> None:
    canary = _stored(CANARIES, _doc("flagger-canary.yaml"))
    (hook,) = canary["spec"]["analysis"]["webhooks"]
    assert urlsplit(hook["url"]).path == "/v1/flagger"
    answer = flagger_post(judge, hook["metadata"], name=canary["metadata"]["name"], namespace=NS)
    # inconclusive + metadata inconclusive=fail: non-2xx halts the canary, body says why.
    assert answer.status_code == 412
    assert answer.json()["verdict"] == "inconclusive"
    assert requests.get(judge.url + "/health", timeout=5).status_code == 200
