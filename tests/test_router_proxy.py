"""The router against real model servers (no broker: no config means 0% canary; a test
that pins the canary gives the router a cached release at weight 0, since a pin never
reaches a canary the router has no config for).

Pinning, routing headers and request identity, streaming chunk by chunk, passive health,
whole-pool-down answers, two SO_REUSEPORT replicas with a SIGKILL, faults with TTLs,
logprob stripping, baseline-vs-baseline comparisons reaching a gate receiver, and the
sample queue dropping when the gate is unreachable.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests import router_support as rs
from tests.procs import Proc, Spawner, free_port, wait_for
from tests.shadow_support import noise_router

models = rs.models_fixture(b0="v1", b1="v1", c0="v2")


def test_pin_headers_and_request_identity(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    rs.write_release_cache(tmp_path)  # canary at weight 0: pins may reach it
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = rs.completion(
        router.url,
        headers={
            "x-canary-variant": "canary",
            "x-request-id": "req-abc",
            "traceparent": tp,
            "x-traffic-tag": "gameday-1",
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-served-by"] == "canary"
    assert r.headers["x-model-version"] == "v2"
    assert r.headers["x-request-id"] == "req-abc"
    assert r.headers["x-router-id"] == "router-0"
    assert r.headers["x-config-revision"] == "7"  # the cached release

    pinned_base = rs.completion(router.url, headers={"x-canary-variant": "baseline"})
    assert pinned_base.headers["x-served-by"] == "baseline"
    assert pinned_base.headers["x-model-version"] == "v1"
    made = pinned_base.headers["x-request-id"]
    assert len(made) >= 16  # the router made one

    # Weight 0: every unpinned request goes to the baseline.
    for i in range(20):
        r = rs.completion(router.url, headers={"x-user-id": f"u{i}"})
        assert r.headers["x-served-by"] == "baseline"

    # Identity reached the model server and the router's own log line.
    def model_line() -> dict[str, object] | None:
        for ev in models["c0"].log_events():
            if ev.get("event") == "request_done" and ev.get("request_id") == "req-abc":
                return ev
        return None

    line = wait_for(model_line, what="model log line for req-abc")
    assert isinstance(line, dict)
    # The model server got a child span of the client's trace: same trace id, the
    # client's span is not reused (the router is a hop of its own).
    sent = str(line["traceparent"]).split("-")
    assert sent[1] == tp.split("-")[1] and sent[2] != tp.split("-")[2]
    assert line["traffic_tag"] == "gameday-1"
    router_line = wait_for(
        lambda: [
            e
            for e in router.log_events()
            if e.get("event") == "request_done" and e.get("request_id") == "req-abc"
        ],
        what="router log line",
    )
    assert isinstance(router_line, list)
    assert router_line[0]["traceparent"] == tp and router_line[0]["variant"] == "canary"
    assert router_line[0]["traffic_tag"] == "gameday-1"


def test_bad_input_is_a_clear_400(spawn: Spawner, tmp_path: Path, models: dict[str, Proc]) -> None:
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    r = rs.completion(router.url, headers={"x-canary-variant": "green"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "x-canary-variant" and "'baseline' or 'canary'" in err["message"]
    assert r.headers["x-router-id"] == "router-0"
    r = requests.post(router.url + "/v1/completions", data=b"{not json", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = requests.post(router.url + "/v1/completions", json=[1, 2], timeout=10)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    # The upstream's own 4xx passes through with the routing headers.
    r = requests.post(router.url + "/v1/completions", json={"model": "default"}, timeout=10)
    assert r.status_code == 400 and r.headers["x-served-by"] == "baseline"
    assert "prompt" in r.json()["error"]["message"]


def test_stream_passes_through_chunk_by_chunk(spawn: Spawner, tmp_path: Path) -> None:
    # A slow decoder (20 ms per token, 40 tokens) so the stream lasts well past its start.
    model = spawn("canarystack.model", "--version", "v1", "--itl-ms", "20", "--itl-jitter", "0")
    router = rs.start_router(spawn, tmp_path, [model.url])
    body = {
        "model": "default",
        "prompt": make_prompt(50),
        "max_tokens": 40,
        "stream": True,
        "temperature": 0,
    }
    t0 = time.monotonic()
    arrivals: list[float] = []
    raw = b""
    with requests.post(router.url + "/v1/completions", json=body, stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.iter_content(chunk_size=None):
            arrivals.append(time.monotonic() - t0)
            raw += chunk
    total = arrivals[-1]
    # The first chunk arrives long before the end, and the body came in many pieces.
    assert arrivals[0] < total / 2, (arrivals[0], total)
    assert len(arrivals) >= 10
    events = rs.sse_events(raw)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    direct = requests.post(model.url + "/v1/completions", json=body, timeout=30).content
    direct_text = "".join(
        e["choices"][0]["text"] for e in rs.sse_events(direct) if e.get("choices")
    )
    assert text == direct_text and len(text.split()) == 40


def test_passive_health_skips_a_dead_replica(spawn: Spawner, tmp_path: Path) -> None:
    alive = rs.start_model(spawn, "v1")
    doomed = rs.start_model(spawn, "v1")
    router = rs.start_router(spawn, tmp_path, [alive.url, doomed.url])
    served = {rs.completion(router.url).headers["x-model-version"] for _ in range(4)}
    assert served == {"v1"}
    doomed.kill()
    for _ in range(30):
        r = rs.completion(router.url)
        assert r.status_code == 200, r.text
    pools = rs.health(router)["pools"]["baseline"]
    dead = next(p for p in pools if p["url"] == doomed.url)
    assert dead["connect_failures"] >= 1
    # Skipped while marked down: far fewer connect attempts than requests sent to it.
    assert rs.metric(router, "router_upstream_errors_total", kind="connect") < 10


def test_whole_pool_down(spawn: Spawner, tmp_path: Path, models: dict[str, Proc]) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}"
    rs.write_release_cache(tmp_path)
    router = rs.start_router(spawn, tmp_path, [models["b0"].url], [dead_url])
    r = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert r.status_code == 503
    msg = r.json()["error"]["message"]
    assert "canary" in msg and "pinned" in msg
    assert r.json()["error"]["code"] == "pool_down"
    other = rs.start_router(spawn, tmp_path, [dead_url], [models["c0"].url], router_id="r-b")
    r = rs.completion(other.url)
    assert r.status_code == 503 and "baseline" in r.json()["error"]["message"]


def test_two_reuse_port_replicas_and_sigkill(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    port = free_port()
    a = rs.start_router(spawn, tmp_path, [models["b0"].url], router_id="router-a", port=port)
    b = rs.start_router(spawn, tmp_path, [models["b0"].url], router_id="router-b", port=port)
    url = f"http://127.0.0.1:{port}"
    seen: set[str] = set()
    for _ in range(60):  # a new connection each time: the kernel spreads them
        seen.add(rs.completion(url, headers={"connection": "close"}).headers["x-router-id"])
        if seen == {"router-a", "router-b"}:
            break
    assert seen == {"router-a", "router-b"}
    assert rs.health(a)["router_id"] == "router-a" and rs.health(b)["router_id"] == "router-b"
    a.kill()
    for _ in range(20):
        r = rs.completion(url, headers={"connection": "close"})
        assert r.status_code == 200 and r.headers["x-router-id"] == "router-b"


def test_faults_latency_abort_stale_with_ttl(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    rs.write_release_cache(tmp_path)
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    admin = rs.instance_url(router) + "/admin/faults"
    r = requests.post(admin, json={"kind": "latency", "ttl_s": 4, "ms": 600}, headers=rs.ADMIN)
    assert r.status_code == 201, r.text
    for variant in ("baseline", "canary"):
        t0 = time.monotonic()
        assert rs.completion(router.url, headers={"x-canary-variant": variant}).status_code == 200
        assert time.monotonic() - t0 >= 0.6  # added before forwarding, to every variant
    r = requests.post(admin, json={"kind": "abort", "ttl_s": 3, "rate": 1.0}, headers=rs.ADMIN)
    assert r.status_code == 201
    r = rs.completion(router.url)
    assert r.status_code == 503 and r.json()["error"]["code"] == "fault_abort"
    assert r.headers["x-router-id"] == "router-0"
    # Both expire by themselves (the router's own clock).
    wait_for(
        lambda: requests.get(admin, headers=rs.ADMIN, timeout=5).json()["faults"] == [],
        timeout=10,
        what="faults to expire",
    )
    assert rs.completion(router.url).status_code == 200
    kinds = [e.get("kind") for e in router.log_events() if e.get("event") == "fault_expired"]
    assert {"latency", "abort"} <= set(kinds)
    bad = requests.post(admin, json={"kind": "abort", "ttl_s": 5, "rate": 3}, headers=rs.ADMIN)
    assert bad.status_code == 400 and "rate" in bad.json()["error"]["message"]
    stale = requests.post(admin, json={"kind": "stale_config", "ttl_s": 5}, headers=rs.ADMIN)
    assert stale.status_code == 201
    no_token = requests.post(admin, json={"kind": "stale_config", "ttl_s": 5})
    assert no_token.status_code == 401


def noise_floor_router(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], gate: rs.GateReceiver
) -> Proc:
    """Two baseline replicas, every short request sampled, every sample also
    baseline-baseline (no config: the canary is not live)."""
    return noise_router(
        spawn,
        tmp_path,
        [models["b0"].url, models["b1"].url],
        rates="0-512=1,512-1k=1",
        canary=[models["c0"].url],
        gate=gate.url,
    )


def test_logprobs_stripped_and_noise_floor_comparisons_reach_the_gate(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], gate: rs.GateReceiver
) -> None:
    router = noise_floor_router(spawn, tmp_path, models, gate)
    prompt = make_prompt(40, seed=3)
    # Streaming, no logprobs asked: none in the answer, text as the model gives it.
    body: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "stream": True}
    r = rs.completion(router.url, prompt, **body)
    assert r.status_code == 200
    events = rs.sse_events(r.content)
    assert all(e["choices"][0]["logprobs"] is None for e in events if e.get("choices"))
    direct = rs.completion(models["b0"].url, prompt, **body)
    assert [e["choices"][0]["text"] for e in events] == [
        e["choices"][0]["text"] for e in rs.sse_events(direct.content)
    ]
    # Non-streaming and chat: stripped too.
    r = rs.completion(router.url, prompt, max_tokens=5, temperature=0)
    assert r.json()["choices"][0]["logprobs"] is None
    chat = requests.post(
        router.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "stream": True},
        timeout=30,
    )
    assert chat.status_code == 200
    assert all(e["choices"][0].get("logprobs") is None for e in rs.sse_events(chat.content))
    # The user asked for 2: gets exactly 2 although the router asked upstream for 5.
    r = rs.completion(router.url, prompt, max_tokens=3, temperature=0, logprobs=2)
    tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert len(tops) == 3 and all(len(t) == 2 for t in tops)

    def comparisons() -> list[dict[str, Any]]:
        return gate.records("comparisons")

    wait_for(lambda: len(comparisons()) >= 4, timeout=15, what="4 comparisons at the gate")
    comps = comparisons()
    assert gate.unauthorized == 0
    assert {c["pair"] for c in comps} == {"baseline-baseline"}  # no config: canary not live
    for c in comps:
        assert c["version_a"] == c["version_b"] == "v1"
        assert c["kl_mean"] == pytest.approx(0.0, abs=1e-9)  # same version: same numbers
        assert c["top1_agree"] == 1.0 and c["bucket"] == "0-512"
    # completions: 40 prompt tokens; chat: 40 + the role marker — both shapes compared
    assert {c["prompt_tokens"] for c in comps} == {40, 41}
    greedy = [c for c in comps if c["positions"] > 1]
    assert greedy, "greedy requests compare more than the first position"
    outcomes = gate.records("outcomes")
    assert len(outcomes) >= 4 and {o["variant"] for o in outcomes} == {"baseline"}
    assert all(o["error"] is None and o["ttft_s"] > 0 for o in outcomes)
    batch = gate.batches[0]
    assert batch["router_id"] == "router-0" and batch["release"] == "default"
    assert rs.metric(router, "router_shadow_comparisons_total") >= 4


def test_a_sampled_request_and_its_shadow_share_a_seed_and_compare_past_the_first_token(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], gate: rs.GateReceiver
) -> None:
    """At temperature 1 the router gives a request without a seed a fresh one and sends it
    to both sides (coupled sampling), and the copy decodes as many tokens as a greedy one:
    two replicas of one version then draw the same tokens, and every position is compared
    (was: the copy asked for one token, so a sampled request compared position 0 only)."""
    router = noise_floor_router(spawn, tmp_path, models, gate)
    prompt = make_prompt(40, seed=5)
    sampled: dict[str, Any] = {"max_tokens": 6, "temperature": 1.0}
    texts = set()
    for _ in range(4):
        r = rs.completion(router.url, prompt, **sampled)
        assert r.status_code == 200, r.text
        texts.add(r.json()["choices"][0]["text"])
    wait_for(
        lambda: len(gate.records("comparisons")) >= 4, timeout=15, what="4 comparisons at the gate"
    )
    comps = gate.records("comparisons")
    assert {c["pair"] for c in comps} == {"baseline-baseline"}
    # Same version, same seed: the same six tokens on both sides, all six compared.
    assert [c["positions"] for c in comps] == [6] * len(comps)
    # A fresh seed each request: the user's answers stay as random as without the router.
    assert len(texts) > 1
    # A seed the user gave is theirs: the answer is the model's own answer to it.
    seeded = {**sampled, "seed": 1234}
    via = rs.completion(router.url, prompt, **seeded)
    direct = rs.completion(models["b0"].url, prompt, **seeded)
    assert via.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]


def test_sample_queue_drops_when_gate_unreachable(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    dead_gate = f"http://127.0.0.1:{free_port()}"
    router = rs.start_router(
        spawn,
        tmp_path,
        [models["b0"].url],
        None,
        "--sample-queue-size",
        "5",
        gate=dead_gate,
    )
    for i in range(40):
        r = rs.completion(router.url, headers={"x-user-id": f"u{i}"})
        assert r.status_code == 200
    h = rs.health(router)
    assert h["sample_queue"]["length"] <= 5
    assert h["sample_queue"]["dropped_total"] >= 20
    assert "gate_error" in h["sample_queue"] and h["sample_queue"]["gate_error"]
    assert rs.metric(router, "router_samples_dropped_total", kind="outcome") >= 20
    assert rs.metric(router, "router_gate_pushes_total", result="error") >= 1


def test_metrics_by_variant_and_status(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    rs.write_release_cache(tmp_path)
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    for variant in ("baseline", "canary", "canary"):
        rs.completion(router.url, headers={"x-canary-variant": variant}, stream=True)
    assert rs.metric(router, "router_requests_total", variant="canary", status="200") == 2
    assert rs.metric(router, "router_requests_total", variant="baseline", status="200") == 1
    assert rs.metric(router, "router_ttft_seconds_count", variant="canary") == 2
    text = requests.get(rs.instance_url(router) + "/metrics", timeout=5).text
    for name in (
        "router_config_revision",
        "router_broker_watch_errors_total",
        "router_upstream_errors_total",
        "router_shadow_requests_total",
        "router_samples_dropped_total",
    ):
        assert name in text
    assert rs.health(router)["config"]["source"] == "cache"


def test_upstream_failures_reach_the_client_and_the_gate_as_errors(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    model = rs.start_model(spawn, "v1")
    router = rs.start_router(spawn, tmp_path, [model.url], None, "--no-shadow", gate=gate.url)
    faults = model.url + "/admin/faults"

    def inject(kind: str) -> None:
        requests.delete(faults, headers=rs.ADMIN, timeout=5)
        body = {"kind": "errors", "ttl_s": 30, "error_kind": kind}
        assert requests.post(faults, json=body, headers=rs.ADMIN, timeout=5).status_code == 201

    inject("truncate")
    body = {"model": "default", "prompt": "a b c", "max_tokens": 12, "stream": True}
    with requests.post(
        router.url + "/v1/completions", json=body, headers={"x-request-id": "trunc"}, stream=True
    ) as r:
        assert r.status_code == 200
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            # The router does not end a cut stream cleanly: the client sees it broken.
            b"".join(r.iter_content(chunk_size=None))
    inject("http_500")
    r = rs.completion(router.url, headers={"x-request-id": "five"})
    assert r.status_code == 500 and r.headers["x-served-by"] == "baseline"
    requests.delete(faults, headers=rs.ADMIN, timeout=5)
    assert rs.completion(router.url, headers={"x-request-id": "fine"}).status_code == 200

    def outcome(rid: str) -> dict[str, Any] | None:
        return next((o for o in gate.records("outcomes") if o["request_id"] == rid), None)

    wait_for(lambda: outcome("fine"), what="outcomes at the gate")
    assert outcome("trunc")["error"] == "broken_stream"  # type: ignore[index]
    assert outcome("five")["error"] == "http_5xx"  # type: ignore[index]
    assert outcome("fine")["error"] is None  # type: ignore[index]
    assert rs.metric(router, "router_upstream_errors_total", kind="http_5xx") == 1
    # Cut off (connection dropped) or ended early without [DONE]: either is one error.
    cut = rs.metric(router, "router_upstream_errors_total", kind="broken_stream")
    assert cut + rs.metric(router, "router_upstream_errors_total", kind="truncated") == 1


def test_shadow_cap_drops_and_counts(spawn: Spawner, tmp_path: Path) -> None:
    # Slow decoders so shadow copies stay in flight; at most one at a time is allowed.
    slow = ("--itl-ms", "40", "--itl-jitter", "0")
    b0 = spawn("canarystack.model", "--version", "v1", *slow)
    b1 = spawn("canarystack.model", "--version", "v1", *slow)
    router = noise_router(
        spawn,
        tmp_path,
        [b0.url, b1.url],
        "--shadow-max-inflight",
        "1",
    )
    with ThreadPoolExecutor(6) as pool:
        codes = list(
            pool.map(
                lambda i: (
                    rs.completion(router.url, make_prompt(20, seed=i), temperature=0).status_code
                ),
                range(6),
            )
        )
    assert codes == [200] * 6
    assert rs.metric(router, "router_shadow_requests_total", result="dropped_cap") >= 1
    wait_for(
        lambda: rs.metric(router, "router_shadow_requests_total", result="ok") >= 1,
        what="the one allowed shadow to finish",
    )
    wait_for(lambda: rs.health(router)["shadow_inflight"] == 0, what="shadows to drain")


def test_client_hanging_up_stops_the_upstream_stream(spawn: Spawner, tmp_path: Path) -> None:
    # 200 tokens at 50 ms: the model would stream for 10 s if nobody hung up.
    model = spawn("canarystack.model", "--version", "v1", "--itl-ms", "50", "--itl-jitter", "0")
    router = rs.start_router(spawn, tmp_path, [model.url])
    body = {"model": "default", "prompt": "a b c", "max_tokens": 200, "stream": True}
    t0 = time.monotonic()
    with requests.post(
        router.url + "/v1/completions",
        json=body,
        headers={"x-request-id": "hangup"},
        stream=True,
        timeout=30,
    ) as r:
        next(r.iter_content(chunk_size=None))
    # The connection is closed here, after the first chunk.

    def done(proc: Proc) -> dict[str, Any] | None:
        return next(
            (
                e
                for e in proc.log_events()
                if e.get("event") == "request_done" and e.get("request_id") == "hangup"
            ),
            None,
        )

    router_line = wait_for(lambda: done(router), timeout=8, what="router request_done")
    model_line = wait_for(lambda: done(model), timeout=8, what="model request_done")
    assert time.monotonic() - t0 < 9  # both ended well before the 10 s stream would have
    assert isinstance(router_line, dict) and router_line["error"] == "client_abort"
    assert isinstance(model_line, dict)
    assert int(model_line["completion_tokens"]) < 200


def test_a_batch_the_gate_refuses_is_dropped_not_resent(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], gate: rs.GateReceiver
) -> None:
    gate.reject_next = 1
    router = rs.start_router(
        spawn, tmp_path, [models["b0"].url], None, "--no-shadow", gate=gate.url
    )
    assert rs.completion(router.url, headers={"x-request-id": "first"}).status_code == 200
    wait_for(lambda: gate.rejected, what="the first batch to be refused")
    assert rs.completion(router.url, headers={"x-request-id": "second"}).status_code == 200
    wait_for(
        lambda: any(o["request_id"] == "second" for o in gate.records("outcomes")),
        what="the next batch to arrive",
    )
    ids = [o["request_id"] for o in gate.records("outcomes")]
    assert "first" not in ids  # refused once, never resent
    assert [o["request_id"] for o in gate.rejected[0]["outcomes"]] == ["first"]
    assert rs.metric(router, "router_gate_pushes_total", result="rejected") == 1
