"""The router with a real broker: weights from the broker drive the split (the HTTP path
agrees exactly with the hashing function, sticky across calls and replicas), phase
``tripped`` means 0% canary within one watch round, heartbeats report the applied
revision, when it was applied and since when the canary gets no traffic, the on-disk
cache covers a broker that is down at start, ``stale_config`` stops applying updates
until it expires, a dead canary pool falls back to the baseline, and baseline-vs-canary
comparisons reach a gate receiver."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from canarystack.router.routing import choose_variant
from canarystack.tokenizer import make_prompt
from tests import router_support as rs
from tests.broker_support import restartable_broker, start_broker
from tests.procs import Proc, Spawner, free_port, inject_fault, wait_for

models = rs.models_fixture(b0="v1", c0="v2")


def on_release(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], *extra: str, **kw: Any
) -> tuple[Proc, rs.Broker, dict[str, Any]]:
    """``router_on_release`` over the module's b0 (baseline) and c0 (canary) pools."""
    return rs.router_on_release(spawn, tmp_path, *rs.pools(models), *extra, **kw)


def served_by(router: Proc, user: str, prompt: str = "a b c") -> str:
    r = rs.completion(router.url, prompt, headers={"x-user-id": user}, max_tokens=1)
    assert r.status_code == 200, r.text
    return str(r.headers["x-served-by"])


def test_split_follows_broker_weight_sticky_across_replicas(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    broker = start_broker(spawn, tmp_path / "broker")
    api = rs.Broker(broker.url)
    release = api.create(weight=30)
    kw: dict[str, Any] = {"broker": broker.url}
    r0 = rs.start_router(spawn, tmp_path, *rs.pools(models), **kw)
    r1 = rs.start_router(spawn, tmp_path, *rs.pools(models), router_id="router-1", **kw)
    rs.wait_revision(r0, release["revision"])
    rs.wait_revision(r1, release["revision"])
    users = [f"user-{i}" for i in range(300)]
    got = {u: served_by(r0, u) for u in users}
    expected = {
        u: choose_variant(release="default", user_key=u, weight_pct=30, prompt_tokens=3)
        for u in users
    }
    assert got == expected  # the HTTP path is the hashing function (20k-user split: units)
    share = sum(v == "canary" for v in got.values()) / len(users)
    assert 0.2 < share < 0.4
    # Sticky: the same user again, and on the other replica.
    for u in users[:60]:
        assert served_by(r0, u) == got[u]
        assert served_by(r1, u) == got[u]
    r = rs.completion(r0.url, headers={"x-user-id": "user-1"})
    assert r.headers["x-config-revision"] == str(release["revision"])
    assert r.headers["x-model-version"] == ("v2" if got["user-1"] == "canary" else "v1")
    # Raising the weight moves users baseline -> canary only.
    raised = api.patch(weights={"canary": 60})
    rs.wait_revision(r0, raised["revision"])
    for u in users[:100]:
        now = served_by(r0, u)
        if got[u] == "canary":
            assert now == "canary", u


def test_tripped_phase_is_zero_canary_within_one_watch_round(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    router, api, release = on_release(spawn, tmp_path, models, weight=100)
    assert {served_by(router, f"u{i}") for i in range(10)} == {"canary"}

    # Heartbeat: the broker lists this router with the applied revision, when it applied
    # it, and no canary_off_since (the canary gets traffic).
    def beat(revision: int) -> dict[str, Any]:
        found = wait_for(
            lambda: next(
                (
                    r
                    for r in api.routers()
                    if r["router_id"] == "router-0" and r["applied_revision"] == revision
                ),
                None,
            ),
            what=f"heartbeat with revision {revision}",
        )
        assert isinstance(found, dict)
        return found

    on = beat(release["revision"])
    assert on["canary_off_since"] is None
    assert on["applied_at"] == rs.health(router)["config"]["applied_at"]
    before_trip = time.time()
    tripped = api.trip()
    # The long-poll returns on the change: one watch round, no polling interval.
    h = rs.wait_revision(router, tripped["revision"], timeout=5)
    assert h["config"]["phase"] == "tripped"
    assert h["config"]["effective_canary_weight"] == 0
    # The canary gets no traffic since this apply; the heartbeat says so.
    off_since = h["config"]["canary_off_since"]
    assert off_since == h["config"]["applied_at"]
    assert before_trip <= off_since <= time.time()
    off = beat(tripped["revision"])
    assert (off["applied_at"], off["canary_off_since"]) == (off_since, off_since)
    assert {served_by(router, f"u{i}") for i in range(30)} == {"baseline"}
    assert api.release()["weights"]["canary"] == 100  # weights untouched, still 0% applied
    wait_for(
        lambda: any(r["applied_revision"] == tripped["revision"] for r in api.routers()),
        what="heartbeat of the tripped revision",
    )
    # A pin no longer reaches the tripped canary: 409 canary_off naming the phase.
    pinned = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert pinned.status_code == 409, pinned.text
    err = pinned.json()["error"]
    assert err["code"] == "canary_off" and "phase tripped" in err["message"]
    # The cache holds the tripped release.
    cache = json.loads((tmp_path / "router-router-0.json").read_text())
    assert cache["revision"] == tripped["revision"] and cache["phase"] == "tripped"
    assert rs.metric(router, "router_config_revision") == tripped["revision"]
    assert rs.metric(router, "router_canary_weight_percent") == 0
    # A later revision that keeps the canary at 0% (the rollback's) is applied later, but
    # the canary has been off since the trip.
    rolling = api.patch(phase="rolling_back", weights={"canary": 0})
    later = beat(rolling["revision"])
    assert later["applied_at"] > off_since
    assert later["canary_off_since"] == off_since


def test_broker_down_at_start_with_and_without_cache(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    broker, restart_broker = restartable_broker(spawn, tmp_path / "broker")
    api = rs.Broker(broker.url)
    release = api.create(weight=100)
    pools = rs.pools(models)
    first = rs.start_router(spawn, tmp_path, *pools, broker=broker.url)
    rs.wait_revision(first, release["revision"])
    first.stop()
    broker.kill()

    # With a cache: the last-known release (100% canary) is served.
    cached = rs.start_router(spawn, tmp_path, *pools, broker=broker.url)
    h = rs.health(cached)
    assert h["config"]["source"] == "cache" and h["config"]["revision"] == release["revision"]
    assert served_by(cached, "someone") == "canary"
    # Without one (another router id, no file): no config, 0% canary.
    fresh = rs.start_router(spawn, tmp_path, *pools, broker=broker.url, router_id="router-new")
    h = rs.health(fresh)
    assert h["config"]["source"] == "none" and h["config"]["effective_canary_weight"] == 0
    assert {served_by(fresh, f"u{i}") for i in range(20)} == {"baseline"}
    wait_for(lambda: rs.metric(fresh, "router_broker_watch_errors_total") >= 2, what="retries")

    # The broker comes back on its port: both routers pick the release up by themselves.
    restart_broker()
    wait_for(lambda: rs.health(fresh)["config"]["source"] == "broker", timeout=15, what="fresh")
    wait_for(lambda: rs.health(cached)["config"]["source"] == "broker", timeout=15, what="cached")
    assert served_by(fresh, "someone") == "canary"


def test_stale_config_fault_stops_applying_until_it_expires(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    router, api, release = on_release(spawn, tmp_path, models, weight=100)
    inject_fault(rs.instance_url(router), {"kind": "stale_config", "ttl_s": 5})
    tripped = api.trip()
    # The router sees the new revision but does not apply it while the fault lasts.
    wait_for(
        lambda: rs.health(router)["last_seen_revision"] == tripped["revision"],
        what="router to see the revision",
    )
    h = rs.health(router)
    assert h["config"]["revision"] == release["revision"]
    assert served_by(router, "u1") == "canary"
    # Its heartbeat keeps reporting what it really applied.
    assert any(r["applied_revision"] == release["revision"] for r in api.routers())
    # The TTL ends the fault; the watch applies the pending revision.
    rs.wait_revision(router, tripped["revision"], timeout=15)
    assert served_by(router, "u1") == "baseline"


def test_dead_canary_pool_falls_back_to_baseline_unless_pinned(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    router, _, _ = rs.router_on_release(spawn, tmp_path, [models["b0"].url], [dead], weight=100)
    for i in range(5):
        r = rs.completion(router.url, headers={"x-user-id": f"u{i}"})
        assert r.status_code == 200 and r.headers["x-served-by"] == "baseline"
    assert rs.metric(router, "router_canary_fallbacks_total") == 5
    pinned = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert pinned.status_code == 503 and "pinned" in pinned.json()["error"]["message"]


def test_long_prompts_stay_off_the_canary(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    router, _, _ = on_release(
        spawn, tmp_path, models, "--max-canary-prompt-tokens", "100", weight=100
    )
    assert served_by(router, "u", make_prompt(100)) == "canary"
    assert served_by(router, "u", make_prompt(101)) == "baseline"


def test_baseline_canary_comparisons_reach_the_gate(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], gate: rs.GateReceiver
) -> None:
    router, _, _ = on_release(
        spawn, tmp_path, models, "--shadow-rates", "0-512=1,512-1k=1", weight=50, gate=gate.url
    )
    served = set()
    for i in range(12):
        r = rs.completion(
            router.url,
            make_prompt(600 if i % 2 else 30, seed=i),
            headers={"x-user-id": f"user-{i}"},
            max_tokens=6,
            temperature=0,
            stream=bool(i % 3),
        )
        assert r.status_code == 200
        served.add(r.headers["x-served-by"])
    assert served == {"baseline", "canary"}
    wait_for(lambda: len(gate.records("comparisons")) >= 10, timeout=20, what="comparisons")
    comps = gate.records("comparisons")
    assert {c["pair"] for c in comps} == {"baseline-canary"}
    assert {c["bucket"] for c in comps} == {"0-512", "512-1k"}
    for c in comps:
        # a is always the baseline side, whichever variant served the user.
        assert (c["version_a"], c["version_b"]) == ("v1", "v2")
        assert c["kl_first"] >= 0 and 0 <= c["top1_agree"] <= 1
        assert c["ttft_a_s"] > 0 and c["ttft_b_s"] > 0
        assert 1 <= c["positions"] <= 8
    # v2 drifts from v1 (the healthy drift): some distributions differ.
    assert max(c["kl_mean"] for c in comps) > 0
    outcomes = gate.records("outcomes")
    assert {o["variant"] for o in outcomes} == {"baseline", "canary"}
    assert time.time() - max(o["time"] for o in outcomes) < 120


def test_a_slow_shadow_target_never_delays_the_user(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    router, _, _ = rs.router_on_release(
        spawn,
        tmp_path,
        [baseline.url],
        [canary.url],
        "--shadow-rates",
        "0-512=1",
        weight=50,
        gate=gate.url,
    )
    fault = {"kind": "latency", "ttl_s": 30, "ttft_ms": 2500}
    r = requests.post(canary.url + "/admin/faults", json=fault, headers=rs.ADMIN, timeout=5)
    assert r.status_code == 201
    # An unpinned user the split sends to the baseline (a pinned request gets no shadow).
    user = next(
        u
        for u in (f"user-{i}" for i in range(1000))
        if choose_variant(release="default", user_key=u, weight_pct=50, prompt_tokens=3)
        == "baseline"
    )
    t0 = time.monotonic()
    r = rs.completion(router.url, headers={"x-user-id": user, "x-request-id": "slow-shadow"})
    user_s = time.monotonic() - t0
    assert r.status_code == 200 and r.headers["x-served-by"] == "baseline"
    assert user_s < 2.5  # answered before the shadow copy's first token even exists
    assert rs.metric(router, "router_shadow_comparisons_total") == 0
    wait_for(
        lambda: any(c["request_id"] == "slow-shadow" for c in gate.records("comparisons")),
        timeout=15,
        what="the late comparison",
    )
    late = next(c for c in gate.records("comparisons") if c["request_id"] == "slow-shadow")
    assert late["ttft_b_s"] >= 2.5 > late["ttft_a_s"]
