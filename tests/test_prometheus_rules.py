"""The gate's SLO rules as shipped (deploy/prometheus/rules.yml), checked by Debian's own
promtool: `check rules`, the unit tests of rules.test.yml (a firing and a quiet case per
alert), and `check config` on the scrape config gameday.prom renders. A failure shows
promtool's own output. The rendered config's labels are the ones the rules rely on.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gameday.prom import (
    RULES_FILE,
    PrometheusError,
    ScrapeTarget,
    check_config,
    render_config,
    scrape_jobs,
)

RULES_DIR = RULES_FILE.parent
REPO = RULES_DIR.parents[1]
RULES_TEST = RULES_DIR / "rules.test.yml"


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed: run deploy/debian-packages.sh (package prometheus)"
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def assert_ok(res: subprocess.CompletedProcess[str]) -> None:
    assert res.returncode == 0, f"promtool {res.args[1:]} failed:\n{res.stdout}{res.stderr}"


def test_promtool_checks_the_shipped_rules() -> None:
    res = promtool("check", "rules", str(RULES_FILE))
    assert_ok(res)
    assert "SUCCESS" in res.stdout


def test_the_rule_unit_tests_pass() -> None:
    assert_ok(promtool("test", "rules", str(RULES_TEST)))


def test_every_alert_has_a_firing_and_a_quiet_case_and_a_severity() -> None:
    rules = yaml.safe_load(RULES_FILE.read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"CanaryGateSlowToTrip", "CanaryWeightAfterTrip", "CanaryServedAfterTrip",
            "CanaryGateDegraded", "CanaryGateDown", "CanaryGateBlind", "RouterFailSafe",
            "BrokerDown", "BrokerUnreachableFromRouters"} <= set(alerts)  # fmt: skip
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule.get("for"), f"{name} has no for: (it would page on one bad scrape)"
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    cases = yaml.safe_load(RULES_TEST.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == set(alerts) and quiet == set(alerts), (
        f"no firing case: {sorted(set(alerts) - firing)}; no quiet case: "
        f"{sorted(set(alerts) - quiet)}"
    )


def test_a_broken_rule_fails_with_promtools_words(tmp_path: Path) -> None:
    bad = tmp_path / "rules.yml"
    bad.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Broken\n"
        "    expr: sum(rate(router_requests_total[1m])\n"
    )
    res = promtool("check", "rules", str(bad))
    assert res.returncode != 0
    assert "unclosed left parenthesis" in res.stdout + res.stderr


def test_the_rendered_scrape_config_passes_promtool_and_labels_every_target(
    tmp_path: Path,
) -> None:
    targets = [
        ScrapeTarget("router", "127.0.0.1:20861", {"replica": "router-0"}),
        ScrapeTarget("router", "127.0.0.1:20862", {"replica": "router-1"}),
        ScrapeTarget("model", "127.0.0.1:20870", {"replica": "m-b-0", "variant": "baseline"}),
        ScrapeTarget("model", "127.0.0.1:20880", {"replica": "m-c-0", "variant": "canary"}),
        ScrapeTarget("gate", "127.0.0.1:20852", {"replica": "gate"}),
        ScrapeTarget("broker", "127.0.0.1:20850", {"replica": "broker"}),
        ScrapeTarget("rollback", "127.0.0.1:20853", {"replica": "rollback"}),
    ]
    text = render_config(targets, scrape_interval_s=1.0)
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    check_config(path)  # raises with promtool's output
    config = yaml.safe_load(text)
    assert config["rule_files"] == [str(RULES_FILE)]
    assert config["global"]["scrape_interval"] == "1000ms"
    jobs = {j["job_name"]: j["static_configs"] for j in config["scrape_configs"]}
    assert sorted(jobs) == ["broker", "gate", "model", "rollback", "router"]
    variants = {s["labels"].get("variant") for s in jobs["model"]}
    assert variants == {"baseline", "canary"}
    # the router's own series carry `variant`: a target label would rename theirs
    assert all("variant" not in s["labels"] for s in jobs["router"])


def test_a_config_promtool_refuses_is_reported_with_its_output(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(render_config([ScrapeTarget("gate", "127.0.0.1:1")],
                                  rule_files=[str(tmp_path / "missing.yml")]))  # fmt: skip
    with pytest.raises(PrometheusError, match=r"promtool check config .* failed:\n") as err:
        check_config(path)
    assert 'missing.yml" does not point to an existing file' in str(err.value)


@pytest.mark.parametrize("interval", [0, -1, 1e9, float("nan")])
def test_a_bad_interval_is_refused_with_its_name(interval: float) -> None:
    with pytest.raises(PrometheusError, match=r"scrape_interval_s must be in \(0, 3600\]"):
        render_config([ScrapeTarget("gate", "127.0.0.1:1")], scrape_interval_s=interval)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gameday.prom", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=False)  # fmt: skip


def test_the_cli_names_a_missing_target_file(tmp_path: Path) -> None:
    res = run_cli("up", "--target", str(tmp_path / "nope.yaml"), "--dir", str(tmp_path / "p"))
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and "nope.yaml" in res.stderr
    assert not (tmp_path / "p" / "prometheus.json").exists()


def test_the_cli_down_without_a_prometheus_says_so(tmp_path: Path) -> None:
    res = run_cli("down", "--dir", str(tmp_path))
    assert (res.returncode, res.stdout.strip()) == (0, f"no Prometheus was running for {tmp_path}")


def test_a_kubernetes_target_is_scraped_pod_by_pod_with_its_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pods come from a FAKED Kubernetes API here (tests/k8s_fake.py: the live
    loopback cluster takes minutes to start, see tests/test_k8s_live*.py): every serving
    pod of every role is a target at its own IP and port, labelled with the namespace
    probes.prometheus's default queries select on; the config passes promtool."""
    from gameday.targets import load_target
    from tests.k8s_fake import FakeApi, pod, point_client_at

    def role(r: str) -> dict[str, str]:
        return {"app.kubernetes.io/part-of": "canarystack", "app.kubernetes.io/component": r}

    api = FakeApi()
    pods = [("router-a", "router", "10.0.0.11"), ("router-b", "router", "10.0.0.12"),
            ("mb-0", "model-baseline", "10.0.1.1"), ("mc-0", "model-canary", "10.0.1.2"),
            ("gate-0", "gate", "10.0.2.1"), ("broker-0", "broker", "10.0.3.1"),
            ("rollback-0", "rollback", "10.0.4.1")]  # fmt: skip
    for name, r, ip in pods:
        api.add_pod(pod(name, role(r), ip))
    api.add_pod(pod("router-pending", role("router"), "10.0.0.13", phase="Pending"))
    api.start()
    try:
        point_client_at(api, tmp_path / "no-kubeconfig", monkeypatch)
        path = tmp_path / "target.yaml"
        path.write_text(yaml.safe_dump({"kind": "kubernetes", "name": "staging",
                                        "namespace": "stack", "ports": {"router": 8080},
                                        "urls": {"broker": "http://127.0.0.1:9"},
                                        "blast_radius": {"namespaces": ["stack"]}}))  # fmt: skip
        jobs = scrape_jobs(load_target(path))
    finally:
        api.stop()
    got = {(t.job, t.address, t.labels.get("variant"), t.labels["replica"]) for t in jobs}
    assert got == {
        ("router", "10.0.0.11:8080", None, "router-a"),
        ("router", "10.0.0.12:8080", None, "router-b"),
        ("model", "10.0.1.1:8000", "baseline", "mb-0"),
        ("model", "10.0.1.2:8000", "canary", "mc-0"),
        ("gate", "10.0.2.1:8000", None, "gate-0"),
        ("broker", "10.0.3.1:8000", None, "broker-0"),
        ("rollback", "10.0.4.1:8000", None, "rollback-0"),
    }
    assert all(t.labels["namespace"] == "stack" for t in jobs)
    config = tmp_path / "prometheus.yml"
    config.write_text(render_config(jobs, scrape_interval_s=15))
    check_config(config)
