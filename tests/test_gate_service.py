"""The gate as a real process against a real broker.

The routers are stood in for by this test: it POSTs sample batches to the gate's
``/v1/samples`` exactly as a router's pusher does (same body, same admin token) — real
API calls to real processes. The end-to-end tests with real routers and model servers
are in tests/test_gate_e2e.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

from tests.broker_support import Api, start_broker, trip_evidence
from tests.procs import ADMIN_TOKEN, Proc, Spawner, inject_fault, post_fault, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def setup_stack(spawn: Spawner, tmp_path: Path, *gate_args: str) -> tuple[Proc, Api, Proc]:
    broker = start_broker(spawn, tmp_path / "broker")
    api = Api(broker.url)
    for v in ("v1", "v2", "v3"):
        api.register(v)
    api.create("default", stable="v1", canary="v2", weight=5)
    gate = spawn("canarystack.gate", "--broker", broker.url, *gate_args)
    wait_for(lambda: gate_state(gate)["revision"] is not None, what="the gate to read the release")
    return broker, api, gate


def gate_state(gate: Proc, release: str = "default") -> dict[str, Any]:
    r = requests.get(f"{gate.url}/v1/gate/{release}", timeout=5)
    assert r.status_code == 200, r.text
    return dict(r.json())


def post(gate: Proc, body: dict[str, Any], headers: dict[str, str] | None = None):
    return requests.post(
        gate.url + "/v1/samples",
        json=body,
        headers=ADMIN if headers is None else headers,
        timeout=10,
    )


def comparison(bucket: str, kl: float, *, t: float | None = None, **over: Any) -> dict[str, Any]:
    tokens = {"0-512": 200, "512-1k": 700, "1k-2k": 1500, "2k-4k": 3000, "4k+": 5000}[bucket]
    c = {
        "time": time.time() if t is None else t,
        "pair": "baseline-canary",
        "bucket": bucket,
        "prompt_tokens": tokens,
        "positions": 3,
        "kl_mean": kl,
        "kl_first": kl,
        "top1_agree": 1.0,
        "ttft_a_s": 0.05 * tokens / 1000 + 0.02,
        "ttft_b_s": 0.05 * tokens / 1000 + 0.021,
        "version_a": "v1",
        "version_b": "v2",
        "request_id": "req",
    }
    c.update(over)
    return c


def outcome(variant: str, bucket: str = "0-512", ttft_s: float | None = 0.03, error=None):
    return {
        "time": time.time(),
        "variant": variant,
        "bucket": bucket,
        "prompt_tokens": 200,
        "ttft_s": ttft_s,
        "error": error,
        "request_id": "o",
    }


def batch(comparisons=(), outcomes=(), release: str = "default") -> dict[str, Any]:
    return {
        "router_id": "router-test",
        "release": release,
        "comparisons": list(comparisons),
        "outcomes": list(outcomes),
        "dropped": 0,
    }


def healthy_batches(rng: np.random.Generator, n_batches: int, per_batch: int = 50):
    buckets = ["0-512", "512-1k", "1k-2k", "2k-4k", "4k+"]
    for _ in range(n_batches):
        comps = [
            comparison(buckets[int(rng.integers(5))], float(rng.gamma(1.5, 0.01 / 1.5)))
            for _ in range(per_batch)
        ]
        outs = [outcome("baseline") for _ in range(19)] + [outcome("canary")]
        yield batch(comps, outs)


def test_gate_trips_on_long_prompt_drift_with_evidence(spawn: Spawner, tmp_path: Path) -> None:
    _, api, gate = setup_stack(spawn, tmp_path)
    rng = np.random.default_rng(11)
    for body in healthy_batches(rng, 10):
        assert post(gate, body).status_code == 200
    assert gate_state(gate)["state"] == "watching"
    fault_time = time.time()
    # The faulty kernel: only prompts >= 2k tokens drift (KL ~0.1-0.2), short ones do not.
    for i in range(30):
        comps = [
            comparison("2k-4k" if i % 2 else "4k+", float(rng.gamma(1.5, 0.12 / 1.5))),
            comparison("0-512", float(rng.gamma(1.5, 0.01 / 1.5))),
        ]
        r = post(gate, batch(comps))
        assert r.status_code == 200, r.text
        if r.json()["state"] == "tripped":
            break
    release = wait_for(
        lambda: (rel := api.release("default"))["phase"] == "tripped" and rel,
        what="phase=tripped in the broker",
    )
    assert isinstance(release, dict)
    trip = release["trip"]
    assert trip["test"] == "drift"
    assert trip["bucket"] in ("2k-4k", "4k+")
    assert trip["statistic"] >= trip["threshold"]
    assert trip["samples"] >= 2
    assert fault_time - 1 <= trip["first_sample_time"] <= trip["last_sample_time"]
    assert trip["tripped_at"] >= trip["last_sample_time"]
    assert trip["detail"]["metric"] in ("kl_mean", "top1_disagreement")
    events = api.events("default")
    trips = [e for e in events if "trip" in e["change"] and e["change"]["trip"]["new"]]
    assert len(trips) == 1 and trips[0]["actor"] == "gate"
    state = wait_for(lambda: (s := gate_state(gate))["trip_status"] == "written" and s)
    assert isinstance(state, dict)
    assert state["state"] == "tripped"
    assert state["trip"]["bucket"] == trip["bucket"]
    assert state["buckets"]["2k-4k"]["comparisons"] > 0
    metrics = requests.get(gate.url + "/metrics", timeout=5).text
    assert 'canarystack_gate_trips_total{bucket="' + trip["bucket"] in metrics
    assert 'canarystack_gate_state{release="default",state="tripped"} 1.0' in metrics
    assert "canarystack_gate_statistic{" in metrics
    # Samples after the trip are counted and not tested.
    r = post(gate, batch([comparison("4k+", 0.5)]))
    assert r.json()["ignored"] == {"after_trip": 1}


def test_gate_does_not_trip_on_healthy_version_drift(spawn: Spawner, tmp_path: Path) -> None:
    _, api, gate = setup_stack(spawn, tmp_path)
    rng = np.random.default_rng(12)
    # Baseline-baseline comparisons (identical replicas) give the live noise floor.
    bb = [comparison("2k-4k", 0.0, pair="baseline-baseline", version_b="v1") for _ in range(50)]
    assert post(gate, batch(bb)).status_code == 200
    for body in healthy_batches(rng, 60):
        r = post(gate, body)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "watching"
    state = gate_state(gate)
    assert state["state"] == "watching"
    assert state["trip"] is None
    assert state["samples"]["comparisons"] == 60 * 50
    assert state["noise_floor"]["2k-4k"]["samples"] == 50
    assert state["noise_floor"]["2k-4k"]["source"] == "2k-4k"
    for label, b in state["buckets"].items():
        assert b["drift"]["kl"]["statistic"] < b["drift"]["kl"]["threshold"], label
    assert api.release("default")["phase"] == "progressing"


def test_no_data_is_inconclusive_and_never_trips_by_default(spawn: Spawner, tmp_path: Path) -> None:
    _, api, gate = setup_stack(spawn, tmp_path, "--no-data-timeout-s", "1")
    wait_for(lambda: gate_state(gate)["state"] == "inconclusive", what="inconclusive")
    assert post(gate, batch(outcomes=[outcome("canary")])).status_code == 200
    assert gate_state(gate)["state"] == "watching"
    wait_for(lambda: gate_state(gate)["state"] == "inconclusive", what="inconclusive again")
    time.sleep(0.5)
    assert api.release("default")["phase"] == "progressing"
    metrics = requests.get(gate.url + "/metrics", timeout=5).text
    assert 'canarystack_gate_state{release="default",state="inconclusive"} 1.0' in metrics


def test_trip_on_no_data_when_asked(spawn: Spawner, tmp_path: Path) -> None:
    _, api, _ = setup_stack(spawn, tmp_path, "--no-data-timeout-s", "1", "--trip-on-no-data")
    release = wait_for(
        lambda: (rel := api.release("default"))["phase"] == "tripped" and rel, what="no-data trip"
    )
    assert isinstance(release, dict)
    assert release["trip"]["test"] == "no_data"
    assert release["trip"]["samples"] == 0


def test_never_trips_a_release_that_is_not_progressing_and_resets_on_a_new_canary(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, gate = setup_stack(spawn, tmp_path)
    rel = api.patch_ok("default", phase="rolling_back", weights={"canary": 0}, reason="manual")
    wait_for(lambda: gate_state(gate)["revision"] == rel["revision"], what="the gate to see it")
    r = post(gate, batch([comparison("4k+", 0.8) for _ in range(50)]))
    assert r.status_code == 200
    assert r.json()["ignored"] == {"phase_rolling_back": 50}
    assert api.release("default")["phase"] == "rolling_back"
    api.patch_ok("default", phase="rolled_back")
    rel = api.patch_ok("default", phase="progressing", canary="v3", weights={"canary": 5})
    state = wait_for(lambda: (s := gate_state(gate))["revision"] == rel["revision"] and s)
    assert isinstance(state, dict)
    assert state["canary_version"] == "v3"
    assert state["state"] == "watching"
    assert state["resets"] >= 1
    assert state["buckets"]["4k+"]["comparisons"] == 0
    # Samples still naming the old canary are not the new canary's evidence.
    r = post(gate, batch([comparison("4k+", 0.8) for _ in range(20)]))
    assert r.json()["ignored"] == {"other_canary_version": 20}
    assert api.release("default")["phase"] == "progressing"


def wait_trip_landed(api: Api, gate: Proc, bucket: str, what: str) -> None:
    """Until the broker's release is tripped (by ``bucket``) and the gate says its trip
    is written."""
    release = wait_for(
        lambda: (rel := api.release("default"))["phase"] == "tripped" and rel,
        timeout=20,
        what=what,
    )
    assert isinstance(release, dict)
    assert release["trip"]["bucket"] == bucket
    wait_for(lambda: gate_state(gate)["trip_status"] == "written", what="written")


def test_trip_waits_for_a_killed_broker_and_lands_after_restart(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, api, gate = setup_stack(spawn, tmp_path)
    broker.kill()
    r = post(gate, batch([comparison("4k+", 0.6) for _ in range(10)]))
    assert r.status_code == 200 and r.json()["state"] == "tripped"
    assert gate_state(gate)["trip_status"] == "writing"
    restarted = start_broker(spawn, tmp_path / "broker", "--port", str(broker.port))
    assert restarted.port == broker.port
    wait_trip_landed(api, gate, "4k+", what="the trip to land after the broker restart")


def test_a_restarted_gate_starts_fresh_and_shows_a_tripped_release(
    spawn: Spawner, tmp_path: Path
) -> None:
    broker, api, gate = setup_stack(spawn, tmp_path)
    post(gate, batch([comparison("4k+", 0.04) for _ in range(5)]))
    assert gate_state(gate)["buckets"]["4k+"]["comparisons"] == 5
    gate.kill()
    gate2 = spawn("canarystack.gate", "--broker", broker.url)
    state = wait_for(lambda: (s := gate_state(gate2))["revision"] is not None and s)
    assert isinstance(state, dict)
    assert state["buckets"]["4k+"]["comparisons"] == 0  # in-memory state starts fresh
    api.patch_ok("default", phase="tripped", trip=trip_evidence(), reason="someone else")
    state = wait_for(lambda: (s := gate_state(gate2))["state"] == "tripped" and s)
    assert isinstance(state, dict)
    assert state["trip_source"] == "broker"


BAD_BATCHES: list[tuple[dict[str, Any], str | None, str]] = [
    ({"release": "default", "comparisons": []}, "router_id", "Field required"),
    (batch([comparison("4k+", -0.1)]), "comparisons[0].kl_mean", "greater than or equal to 0"),
    (batch([comparison("4k+", 0.1, pair="canary-canary")]), "comparisons[0].pair", "pair"),
    (batch([comparison("4k+", 0.1, top1_agree=1.5)]), "comparisons[0].top1_agree", "1"),
    # NaN is not JSON: the strict reader refuses the body before any field is looked at.
    (batch([comparison("4k+", float("nan"))]), None, "NaN"),
    (batch([{**comparison("4k+", 0.1), "bucket": "3k-5k"}]), "comparisons[0].bucket", "3k-5k"),
    (batch(outcomes=[outcome("both")]), "outcomes[0].variant", "'baseline' or 'canary'"),
    ({**batch(), "dropped": -1}, "dropped", "greater than or equal to 0"),
    ({**batch(), "comparisons": "many"}, "comparisons", "list"),
]


def test_bad_batches_get_a_400_naming_the_field(spawn: Spawner, tmp_path: Path) -> None:
    _, _, gate = setup_stack(spawn, tmp_path)
    for body, param, text in BAD_BATCHES:
        # Sent raw: NaN is not JSON, but Python clients write it.
        raw = json.dumps(body).encode()
        r = requests.post(gate.url + "/v1/samples", data=raw, headers=ADMIN, timeout=5)
        assert r.status_code == 400, (param, r.text)
        err = r.json()["error"]
        assert err["param"] == param, err
        assert text in err["message"], err
    assert gate_state(gate)["samples"]["comparisons"] == 0


def test_auth_unknown_release_garbage_and_latency_fault(spawn: Spawner, tmp_path: Path) -> None:
    _, _, gate = setup_stack(spawn, tmp_path)
    assert post(gate, batch(), headers={}).status_code == 401
    r = post(gate, batch(release="other"))
    assert r.status_code == 404 and r.json()["error"]["param"] == "release"
    assert "--release other" in r.json()["error"]["message"]
    r = requests.post(gate.url + "/v1/samples", data=b"{not json", headers=ADMIN, timeout=5)
    assert r.status_code == 400
    r = requests.post(gate.url + "/v1/samples", json=[1, 2], headers=ADMIN, timeout=5)
    assert r.status_code == 400
    r = requests.get(gate.url + "/v1/gate/other", timeout=5)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        "Release 'other' is not watched by this gate (it serves: default); "
        "ask the gate that watches it."
    )
    # The latency fault delays batch processing by its ms (the same fault API as every
    # component: kind, ttl_s, params).
    inject_fault(gate.url, {"kind": "latency", "ttl_s": 30, "ms": 400})
    start = time.monotonic()
    assert post(gate, batch()).status_code == 200
    assert time.monotonic() - start >= 0.4
    bad = post_fault(gate.url, {"kind": "latency", "ttl_s": 30, "ms": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ms"
