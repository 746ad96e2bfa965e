"""probes.prometheus against a REAL Prometheus (Debian's, started by gameday.prom) scraping
a REAL local stack at 1 s — no fake HTTP server. One stack and one Prometheus for the
module.

What is proven: every component is scraped with the job and variant labels the rules rely
on, and every metric the shipped rules name exists in the live TSDB (a rename in a
component fails here); the probes' figures equal the requests the test sent (pinned, so
the split is known); a quantile over no traffic is NaN in Prometheus and the probe says
"no figure", never a NaN result; canary_drained on a local target reads the routers'
weight and traffic and passes only once the weight is 0 AND no canary request was served
while requests flowed; Prometheus is stopped by its PID and leaves nothing running.
What is not: the Kubernetes side (tests/test_k8s_probes.py still uses the faked
Prometheus of tests/k8s_fake.py for the cluster-only queries with a namespace label).
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from chaoslib.exceptions import ActivityFailed

from canary_contract import strictjson
from gameday.prom import (
    RULES_FILE,
    active_targets,
    start_for_target,
    stop_in,
    wait_for_targets,
)
from gameday.report import prometheus as report_prom
from gameday.targets import load_target
from probes import prometheus
from tests.procs import wait_for
from tests.router_support import completion
from tests.run_support import (
    admin_headers,
    local_stack,
    slo_detail,
    stack_description,
    write_target,
)

pytestmark = pytest.mark.slow

N_CANARY = 6
N_BASELINE = 9


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("prom-live")
    with local_stack(root / "stack") as status:
        target_file = write_target(root / "target.yaml", root / "stack")
        prom = start_for_target(load_target(target_file), root / "prom", scrape_interval_s=1.0)
        try:
            wait_for_targets(prom.url, timeout_s=30)
            desc = stack_description(root / "stack")
            routers = [c for c in desc["components"] if c["role"] == "router"]
            yield {
                "root": root,
                "state_dir": root / "stack",
                "status": status,
                "prom": prom,
                "cfg": {"gameday_target": str(target_file), "prometheus_url": prom.url},
                "router0": routers[0]["url"],  # every request of this module goes here
                "router1": routers[1]["url"],  # ... and none here
            }
        finally:
            prom.stop()


def q(live: dict[str, Any], promql: str) -> float | None:
    return prometheus.query_value(promql, configuration=live["cfg"])


def send(url: str, variant: str, n: int) -> None:
    for i in range(n):
        resp = completion(url, f"prometheus live {variant} {i}",
                          headers={"x-canary-variant": variant})  # fmt: skip
        assert resp.status_code == 200, resp.text


def scraped_total(live: dict[str, Any], want: float) -> bool:
    return q(live, "sum(router_requests_total)") == want


QUIET_SCRAPES = 8  # scrapes of the empty histograms before the traffic (1 s apart)
QUIET_S = 4  # the test window's start before the traffic: every point has >= 2 of them


@pytest.fixture(scope="module")
def traffic(live: dict[str, Any]) -> dict[str, Any]:
    """N_CANARY pinned canary and N_BASELINE pinned baseline requests to router-0, once,
    and the moment Prometheus has scraped all of them. Before: both routers at the
    release's 5% and QUIET_SCRAPES scrapes of their (empty) histograms, so the window
    before the traffic is a known quiet one."""
    wait_for(lambda: q(live, "min(router_canary_weight_percent)") == 5
             and (q(live, "min(count_over_time(router_ttft_seconds_count[1m]))") or 0)
             >= QUIET_SCRAPES,
             timeout=20, what="routers at 5% with a few quiet scrapes")  # fmt: skip
    started = time.time()
    # In two halves with a scrape between: a counter born with all its requests in one
    # scrape has no increase() yet (Prometheus has seen no rise).
    for n_canary, n_baseline in ((3, 4), (N_CANARY - 3, N_BASELINE - 4)):
        before = q(live, "sum(router_requests_total)") or 0
        send(live["router0"], "canary", n_canary)
        send(live["router0"], "baseline", n_baseline)
        want = before + n_canary + n_baseline
        wait_for(partial(scraped_total, live, want), timeout=20,
                 what=f"Prometheus to scrape {want:g} requests")  # fmt: skip
    # the model servers are scraped at their own offsets
    wait_for(lambda: (q(live, 'sum(vllm:request_success_total{variant="canary"})') or 0)
             >= N_CANARY, timeout=20, what="the canary model server's count")  # fmt: skip
    return {"started": started, "sent_until": time.time()}


def test_every_component_is_scraped_with_its_job_and_variant(live: dict[str, Any]) -> None:
    targets = active_targets(live["prom"].url)
    by_job: dict[str, list[dict[str, str]]] = {}
    for t in targets:
        assert t["health"] == "up", t
        by_job.setdefault(t["labels"]["job"], []).append(t["labels"])
    assert {j: len(v) for j, v in by_job.items()} == {
        "router": 2, "model": 3, "gate": 1, "broker": 1, "rollback": 1}  # fmt: skip
    assert sorted(lab["variant"] for lab in by_job["model"]) == ["baseline", "baseline", "canary"]
    assert q(live, 'count(up{job="model",variant="canary"} == 1)') == 1
    assert q(live, "count(up == 1)") == 8


KEYWORDS = {"by", "on", "and", "or", "unless", "without", "ignoring", "group_left",
            "group_right", "bool", "offset"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers outside label matchers, label
    lists and ranges that are not functions or keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}|\[[^]]*\]", " ", expr)  # matchers, ranges
    expr = re.sub(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
    return {n for n in names if n not in KEYWORDS}


def test_the_metric_name_reader_reads_the_rules_way() -> None:
    expr = 'max by (reason) (canarystack_gate_degraded) == 1 and on () rate(x_total{a="b"}[1m])'
    assert metric_names(expr) == {"canarystack_gate_degraded", "x_total"}
    assert metric_names("histogram_quantile(0.5, sum by (le) (rate(vllm:t_bucket[1m])))") == {
        "vllm:t_bucket"
    }


def test_every_metric_the_rules_name_is_exported_by_a_component(
    live: dict[str, Any], traffic: dict[str, Any]
) -> None:
    """Every metric a rule names is in the live TSDB, or (a counter nothing has counted yet,
    e.g. a degraded reason) declared by a scraped component's /metrics."""
    resp = requests.get(f"{live['prom'].url}/api/v1/label/__name__/values", timeout=5)
    in_tsdb = set(resp.json()["data"])
    declared = set()
    for t in active_targets(live["prom"].url):
        text = requests.get(t["scrapeUrl"], timeout=5).text
        declared |= set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    rules = yaml.safe_load(RULES_FILE.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    used = {n for e in exprs for n in metric_names(e)} - recorded
    missing = sorted(
        n
        for n in used
        if n not in in_tsdb and n != "up" and re.sub(r"_(bucket|count|sum)$", "", n) not in declared
    )
    assert not missing, f"the rules name metrics no component exports: {missing}"
    assert {"router_requests_total", "router_ttft_seconds_bucket", "up",
            "canarystack_gate_state", "canarystack_gate_degraded",
            "vllm:time_to_first_token_seconds_bucket"} <= used  # fmt: skip
    assert "router_requests_total" in in_tsdb and "canarystack_gate_state" in in_tsdb


def test_the_shipped_rules_evaluate_cleanly_on_the_live_series(
    live: dict[str, Any], traffic: dict[str, Any]
) -> None:
    """The Prometheus loaded deploy/prometheus/rules.yml, and on the stack's real label
    sets every rule evaluates without an error (no many-to-many match, no bad label);
    the recording rules give both variants' request rates."""
    wait_for(lambda: q(live, "count(variant:router_requests:rate1m)") == 2, timeout=20,
             what="the recording rule for both variants")  # fmt: skip
    groups = requests.get(f"{live['prom'].url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert {g["name"] for g in groups} == {"canarystack-recording", "canarystack-gate-slo"}
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 18
    never = [r["name"] for r in rules if r["lastEvaluation"].startswith("0001")]
    assert not never, f"rules never evaluated: {never}"
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    assert q(live, 'variant:router_request_errors:ratio_rate1m{variant="canary"}') == 0


def test_query_value_reads_the_requests_the_routers_served(
    live: dict[str, Any], traffic: dict[str, Any]
) -> None:
    assert q(live, 'sum(router_requests_total{variant="canary"})') == N_CANARY
    assert q(live, 'sum(router_requests_total{variant="baseline",status="200"})') == N_BASELINE
    assert q(live, 'sum(router_ttft_seconds_count{variant="canary"})') == N_CANARY
    # router-1 served nothing: its counter series, if any, are zero
    idle = live["router1"].split("://", 1)[1]
    assert (q(live, f'sum(router_requests_total{{instance="{idle}"}})') or 0) == 0
    # the canary model server answered every canary request (the variant scrape label)
    served = q(live, 'sum(vllm:request_success_total{variant="canary"})')
    assert served is not None and served >= N_CANARY
    assert q(live, "no_such_metric_anywhere") is None


def test_a_query_the_real_prometheus_refuses_is_named(live: dict[str, Any]) -> None:
    with pytest.raises(
        ActivityFailed, match=r"Prometheus refused the query 'up\{': HTTP 400 bad_data"
    ):
        q(live, "up{")
    with pytest.raises(ActivityFailed, match=r"with a 'matrix' result.*wrap the expression"):
        q(live, "up[5s]")
    out = prometheus.metric_at_most('sum(up{job="no-such-job"})', 0, configuration=live["cfg"])
    assert out["ok"] is False and "matched no series" in slo_detail(out)["why"]


def test_metric_bounds_on_live_ttft(live: dict[str, Any], traffic: dict[str, Any]) -> None:
    p99 = 'histogram_quantile(0.99, sum by (le) (router_ttft_seconds_bucket{variant="canary"}))'
    out = prometheus.metric_at_most(p99, 30.0, check="canary_ttft_p99", unit="s",
                                    configuration=live["cfg"])  # fmt: skip
    assert out["ok"] is True and out["detail"]["status"] == "measured", out
    assert out["measured"] is not None and 0 < out["measured"] <= 30.0
    out = prometheus.metric_at_least(
        'sum(router_requests_total{variant="canary"})', N_CANARY + 1, configuration=live["cfg"]
    )
    assert (out["ok"], out["measured"]) == (False, N_CANARY)
    assert out["detail"]["why"] == f"expected >= {N_CANARY + 1}, got {N_CANARY}"


def test_a_quantile_over_no_traffic_is_no_figure_not_nan(live: dict[str, Any]) -> None:
    """router-1 never served a request: its TTFT histogram's rates are all zero, so
    Prometheus answers NaN. That is no figure (failed, says why), not a NaN result that a
    strict JSON journal cannot hold."""
    instance = live["router1"].split("://", 1)[1]
    p99 = ("histogram_quantile(0.99, sum by (le) "
           f'(rate(router_ttft_seconds_bucket{{instance="{instance}"}}[{{window}}])))')  # fmt: skip
    scraped = f'min(count_over_time(router_ttft_seconds_count{{instance="{instance}"}}[30s]))'
    wait_for(lambda: (q(live, scraped) or 0) >= 2, timeout=20,
             what="two scrapes of router-1's histogram")  # fmt: skip
    endpoint = f"{live['prom'].url}/api/v1/query"
    raw = requests.post(endpoint, data={"query": p99.replace("{window}", "30s")}, timeout=5)
    assert raw.json()["data"]["result"][0]["value"][1] == "NaN"  # the real Prometheus says NaN
    out = prometheus.metric_at_most(p99, 1.0, unit="s", window_s=30, configuration=live["cfg"])
    assert out["ok"] is False and out["measured"] is None, out
    assert out["detail"]["status"] == "failed"
    assert "answered NaN" in slo_detail(out)["why"]
    strictjson.dumps(out)  # the result is a journal-safe JSON document
    assert prometheus.query_value(p99, window_s=30, configuration=live["cfg"]) is None


def _set_canary_weight(live: dict[str, Any], weight: int) -> None:
    broker = live["status"]["broker_url"]
    rel = requests.get(f"{broker}/v1/releases/default", timeout=5).json()
    resp = requests.patch(
        f"{broker}/v1/releases/default",
        json={
            "expected_revision": rel["revision"],
            "actor": "test",
            "weights": {"canary": weight},
        },
        headers={**admin_headers(live["state_dir"]), "x-actor": "test"},
        timeout=5,
    )
    assert resp.status_code == 200, resp.text


def test_canary_drained_on_a_live_local_target(
    live: dict[str, Any], traffic: dict[str, Any]
) -> None:
    cfg = live["cfg"]
    # Before the drain: the routers say 5% and served canary requests in the window.
    window = time.time() - traffic["started"] + 5
    out = prometheus.canary_drained(window_s=window, configuration=cfg)
    assert out["ok"] is False, out
    assert "still reports canary weight 5" in slo_detail(out)["why"]
    # the second half's canary requests, at least
    assert out["measured"] is not None and out["measured"] >= 3
    assert slo_detail(out)["queries"]["weight"] == "max(router_canary_weight_percent)"

    # Drain: weight 0 at the broker; both routers apply it and Prometheus scrapes it.
    _set_canary_weight(live, 0)
    wait_for(lambda: q(live, "max(router_canary_weight_percent)") == 0, timeout=20,
             what="both routers at 0% canary in Prometheus")  # fmt: skip
    # Baseline traffic keeps flowing (bounded) while the check runs.
    stop = threading.Event()
    deadline = time.monotonic() + 40

    def flow() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            completion(live["router0"], "drained traffic", timeout=10)

    flowing = threading.Thread(target=flow, daemon=True)
    flowing.start()
    try:
        wait_for(lambda: q(live, 'sum(increase(router_requests_total{variant="canary"}[3s]))')
                 == 0 and (q(live, "sum(increase(router_requests_total[3s]))") or 0) > 0,
                 timeout=25, what="a 3 s window with traffic and no canary request")  # fmt: skip
        out = prometheus.canary_drained(window_s=3, configuration=cfg)
    finally:
        stop.set()
        flowing.join(timeout=15)
    assert out["ok"] is True, out
    assert out["measured"] == 0 and slo_detail(out)["values"]["weight"] == 0
    assert slo_detail(out)["values"]["total"] > 0


def test_prometheus_is_started_and_stopped_by_its_pid_from_the_cli(
    tmp_path: Path, live: dict[str, Any]
) -> None:
    """``python -m gameday.prom up`` for the same target: every target up, its PID
    recorded; ``down`` stops that PID and nothing answers afterwards; a second ``down``
    finds nothing to stop."""
    cli = [sys.executable, "-m", "gameday.prom"]
    up = subprocess.run([*cli, "up", "--target", live["cfg"]["gameday_target"], "--dir",
                         str(tmp_path / "p2")], capture_output=True, text=True, timeout=90,
                        check=False)  # fmt: skip
    assert up.returncode == 0, up.stderr
    started = json.loads(up.stdout)
    pid, url = int(started["pid"]), str(started["url"])
    assert url.startswith("http://127.0.0.1:")
    assert json.loads((tmp_path / "p2" / "prometheus.json").read_text())["pid"] == pid
    assert len(active_targets(url)) == 8
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0].endswith(b"prometheus") and f"--web.listen-address={url[7:]}".encode() in argv
    down = subprocess.run([*cli, "down", "--dir", str(tmp_path / "p2")], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert (down.returncode, down.stdout.strip()) == (0, "stopped")
    assert (
        not Path(f"/proc/{pid}").exists()
        or b"prometheus" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/-/ready", timeout=2)
    assert stop_in(tmp_path / "p2") is False


def test_the_report_series_come_from_the_live_tsdb(
    live: dict[str, Any], traffic: dict[str, Any], tmp_path: Path
) -> None:
    """A run folder with one experiment whose window holds the module's traffic: its
    prometheus.csv has the requests/s of both variants and the canary's TTFT p99, the
    figure is a PNG; nothing is invented for a window without traffic (empty values)."""
    exp = tmp_path / "run" / "control"
    exp.mkdir(parents=True)
    rates = "count(sum by (variant) (rate(router_requests_total[10s])))"
    wait_for(lambda: q(live, rates) == 2, timeout=20, what="a request rate for both variants")
    end = time.time()
    # whole steps back to QUIET_S before the traffic (`end` is a point): a rate over the
    # quiet scrapes needs two of them in its window, which the first ones after the
    # routers start may not have had (CI once had no quiet point with a 2 s margin)
    start = end - math.ceil(end - traffic["started"] + QUIET_S)
    (exp / "journal.json").write_text(json.dumps({"start": start, "end": end}))
    results = report_prom.add_run_series(tmp_path / "run", live["prom"].url, step_s=1.0)
    res = results["control"]
    assert (exp / "prometheus.csv").is_file() and (exp / "prometheus.png").is_file()
    assert (exp / "prometheus.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (exp / "prometheus.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and set(rows[0]) == {"series", "variant", "time", "value"}
    rate = {(r["variant"]) for r in rows if r["series"] == "router_requests" and r["value"]}
    assert rate == {"baseline", "canary"}
    canary_p99 = [r for r in rows if (r["series"], r["variant"]) == ("router_ttft_p99", "canary")]
    p99 = [float(r["value"]) for r in canary_p99 if r["value"]]
    assert p99 and all(0 < v < 30 for v in p99)
    during = [r for r in rows if float(r["time"]) >= traffic["started"]]
    weights = {float(r["value"]) for r in during if r["series"] == "canary_weight"}
    assert 5.0 in weights and weights <= {0.0, 5.0}  # the release's 5% (0 once drained)
    assert all(start - 1 <= float(r["time"]) <= end + 1 for r in rows)
    assert all(math.isfinite(float(r["value"])) for r in rows if r["value"])
    # before the first request the quantile is no figure (Prometheus: NaN), not 0
    quiet = [r for r in canary_p99 if float(r["time"]) < traffic["started"] - 0.5]
    assert quiet and all(r["value"] == "" for r in quiet)
    assert res.points and all(p.value is None or math.isfinite(p.value) for p in res.points)


def test_the_report_series_say_what_they_could_not_get(tmp_path: Path) -> None:
    res = report_prom.write_series(tmp_path, "http://127.0.0.1:9", 1_700_000_000, 1_700_000_060)
    assert not res.points and not (tmp_path / "prometheus.csv").exists()
    text = (tmp_path / "prometheus.missing.txt").read_text()
    assert "cannot reach Prometheus at http://127.0.0.1:9/api/v1/query_range" in text
    res = report_prom.write_series(tmp_path, "http://127.0.0.1:9", 10.0, 5.0)
    assert res.problems == ["no window to query: start 10.0, end 5.0"]
