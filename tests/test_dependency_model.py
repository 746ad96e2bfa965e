"""The model server and its shared dependency (issue #16 items 2-3), against a real
``redis-server``: the context lookup and the prefix-cache write on every request, the
retrieved context in the prompt, and graceful degradation (a paused, full or dead Redis
makes the answer without context, ``x-dependency: degraded``, never a failure), the
circuit breaker, the metrics and ``/health``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from canarystack.dependency.keys import SEED_CONTEXTS, cache_key, context_key
from tests.model_helpers import FAST, done_line, module_spawner
from tests.procs import Proc, Spawner, wait_for
from tests.test_dependency_support import RedisServer, needs_redis, redis_server

pytestmark = needs_redis

PROMPT = "hello world"
CONTEXT = SEED_CONTEXTS[PROMPT]
# A short breaker so the tests see it open and close quickly.
BREAKER = ("--redis-breaker-failures", "3", "--redis-breaker-cooldown-s", "0.5")


@pytest.fixture
def rds(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        server.client().set(context_key(PROMPT), CONTEXT)
        yield server


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    with module_spawner(tmp_path) as spawner:
        yield spawner


def model(spawn: Spawner, rds: RedisServer, *extra: str) -> Proc:
    return spawn("canarystack.model", "--version", "v1", *FAST, "--redis-url", rds.url,
                 *BREAKER, *extra)  # fmt: skip


def ask(proc: Proc, prompt: str = PROMPT, **body: object) -> requests.Response:
    rid = uuid.uuid4().hex
    resp = requests.post(
        proc.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "temperature": 0, **body},
        headers={"x-request-id": rid},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    return resp


def metric(proc: Proc, result: str) -> float:
    text = requests.get(proc.url + "/metrics", timeout=5).text
    m = re.search(
        r'^canarystack_dependency_requests_total\{dependency="redis",result="'
        + re.escape(result)
        + r'"\} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else 0.0


def circuit(proc: Proc) -> str:
    health = requests.get(proc.url + "/health", timeout=5)
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "ok"
    return str(body["dependency"]["state"])


def test_a_hit_prepends_the_context_and_writes_the_prefix_cache(spawn, rds) -> None:
    proc = model(spawn, rds)
    resp = ask(proc)
    assert resp.headers["x-dependency"] == "ok"
    usage = resp.json()["usage"]
    assert usage["prompt_tokens"] == len(PROMPT.split()) + len(CONTEXT.split())
    assert done_line(proc, resp.headers["x-request-id"])["dependency"] == "ok"
    # The prompt-prefix cache entry, with its short TTL.
    ttl = rds.client().ttl(cache_key(PROMPT))
    assert 0 < ttl <= 30
    # A miss is normal: no context, still ok.
    miss = ask(proc, "an unseeded prompt of seven words here")
    assert miss.headers["x-dependency"] == "ok"
    assert miss.json()["usage"]["prompt_tokens"] == 7
    assert done_line(proc, miss.headers["x-request-id"])["dependency"] == "miss"
    assert metric(proc, "ok") == 1 and metric(proc, "miss") == 1


def test_two_servers_with_the_same_hit_answer_alike(spawn, rds) -> None:
    """The output is a pure function of prompt + context: a hit on both sides compares
    equal (the shadow comparison stays meaningful)."""
    a, b = model(spawn, rds), model(spawn, rds)
    ra, rb = ask(a, seed=7, logprobs=3), ask(b, seed=7, logprobs=3)
    assert ra.headers["x-dependency"] == rb.headers["x-dependency"] == "ok"
    assert ra.json()["choices"][0]["text"] == rb.json()["choices"][0]["text"]
    assert ra.json()["choices"][0]["logprobs"] == rb.json()["choices"][0]["logprobs"]


def test_a_server_without_a_dependency_sends_no_header(spawn) -> None:
    proc = spawn("canarystack.model", "--version", "v1", *FAST)
    resp = ask(proc)
    assert "x-dependency" not in resp.headers
    assert "dependency" not in requests.get(proc.url + "/health", timeout=5).json()


def test_a_paused_redis_degrades_answers_and_opens_the_circuit(spawn, rds) -> None:
    proc = model(spawn, rds)
    assert ask(proc).headers["x-dependency"] == "ok"
    rds.client().execute_command("CLIENT", "PAUSE", "20000", "ALL")
    try:
        results = []
        for _ in range(5):
            resp = ask(proc, stream=False)
            assert resp.headers["x-dependency"] == "degraded"
            # Without the context: the prompt alone.
            assert resp.json()["usage"]["prompt_tokens"] == len(PROMPT.split())
            results.append(done_line(proc, resp.headers["x-request-id"])["dependency"])
        # 3 timeouts open the circuit; then no call goes to Redis at all.
        assert results == ["timeout", "timeout", "timeout", "circuit_open", "circuit_open"]
        assert circuit(proc) == "open"
        health = requests.get(proc.url + "/health", timeout=5).json()
        assert health["dependency"]["last_error"].startswith("timeout")
        assert metric(proc, "timeout") == 3 and metric(proc, "circuit_open") == 2
    finally:
        rds.client().execute_command("CLIENT", "UNPAUSE")
    # Half-open after the cool-down: the probe succeeds and the circuit closes.
    wait_for(
        lambda: ask(proc).headers["x-dependency"] == "ok",
        timeout=20,
        interval=0.2,
        what="answers with the dependency again after the pause",
    )
    assert circuit(proc) == "closed"


def test_a_stream_carries_the_header_too(spawn, rds) -> None:
    proc = model(spawn, rds)
    rds.kill()
    resp = requests.post(
        proc.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 4, "stream": True},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.headers["x-dependency"] == "degraded"
    assert resp.content.endswith(b"data: [DONE]\n\n")


def test_a_dead_redis_degrades_and_a_restarted_one_is_used_again(spawn, rds, tmp_path) -> None:
    proc = model(spawn, rds)
    assert ask(proc).headers["x-dependency"] == "ok"
    rds.kill()
    resp = ask(proc)
    assert resp.headers["x-dependency"] == "degraded"
    assert done_line(proc, resp.headers["x-request-id"])["dependency"] == "error"
    assert circuit(proc) in ("closed", "open")  # the model serves either way
    assert requests.get(proc.url + "/health", timeout=5).json()["dependency"]["last_error"]
    again = RedisServer(tmp_path, port=rds.port)
    again.start()
    try:
        wait_for(
            lambda: ask(proc).headers["x-dependency"] == "ok",
            timeout=20,
            interval=0.2,
            what="answers with the dependency again after the restart",
        )
    finally:
        again.stop()


def test_a_full_redis_degrades_answers(spawn, rds) -> None:
    """maxclients reached: new connections are refused ('max number of clients
    reached'); the pool's connections were closed, so every lookup needs a new one."""
    proc = model(spawn, rds)
    assert ask(proc).headers["x-dependency"] == "ok"
    admin = rds.client()
    admin.ping()
    admin.config_set("maxclients", 1)
    try:
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        # The first finds its pooled connection closed, the second cannot open one.
        for _ in range(2):
            resp = ask(proc)
            assert resp.headers["x-dependency"] == "degraded"
            assert done_line(proc, resp.headers["x-request-id"])["dependency"] == "error"
        last = requests.get(proc.url + "/health", timeout=5).json()["dependency"]["last_error"]
        assert "max number of clients" in last
    finally:
        admin.config_set("maxclients", 10000)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--redis-url", "http://127.0.0.1:1", "redis://HOST:PORT"),
        ("--redis-max-connections", "0", "--redis-max-connections must be >= 1 and <= 1024, got 0"),
        ("--redis-deadline-ms", "0", "--redis-deadline-ms"),
        ("--redis-breaker-failures", "0", "--redis-breaker-failures must be >= 1, got 0"),
    ],
)
def test_bad_dependency_options_are_refused_by_name(flag, value, says) -> None:
    import subprocess
    import sys

    args = ["--redis-url", "redis://127.0.0.1:1"] if flag != "--redis-url" else []
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.model", *args, flag, value, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert says in res.stderr


def test_every_redis_call_is_a_coloured_hop(spawn, rds) -> None:
    """#16 item 4: the colour the request came with (id, trace, tag) is recorded at the
    hop 'redis' for each Redis call (the context GET and the prefix-cache SETEX)."""
    from tests.model_helpers import ADMIN

    proc = model(spawn, rds)
    trace = "ab" * 16
    resp = requests.post(
        proc.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2},
        headers={
            "x-request-id": "colour-req-1",
            "x-traffic-tag": "gameday",
            "traceparent": f"00-{trace}-{'cd' * 8}-01",
        },
        timeout=30,
    )
    assert resp.status_code == 200 and resp.headers["x-dependency"] == "ok"
    hops = requests.get(proc.url + "/v1/colour/hops", headers=ADMIN, timeout=5).json()["hops"]
    redis_hops = [h for h in hops if h["hop"] == "redis" and h["request_id"] == "colour-req-1"]
    assert len(redis_hops) == 2
    assert all(h["trace_id"] == trace and h["tag"] == "gameday" for h in redis_hops)
