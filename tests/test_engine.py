"""Tests with a real engine: llama.cpp serving a generated GGUF (marker ``engine``).

They need the ``engine`` extra (llama-cpp-python[server], gguf): ``make test-engine``
installs it (a ~6-8 minute compile the first time) and runs them; ``make test``
deselects them, and without the extra they skip with that reason.

What they prove: the GGUF generator is deterministic and its model loads and is peaked
enough for drift tests; the engine pod keeps the model-server contract (headers, usage
chunk, ``request_done``, 4xx for bad input); the ``kernel`` fault is a real rollout to a
quantized KV cache that ends with its TTL; a pod kill takes its engine along; the drift
the harness's oracle measures over HTTP (top-5 logprobs keyed by token text) equals the
engine's own (direct logits) within a stated tolerance; and in a whole stack a q4_0
canary trips the gate on drift and is rolled back while the benign controls do not trip:
an f16 canary of the same GGUF, a batch-size variant (real rounding noise) and a q8_0
canary (a small acceptable drift).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.dependency.keys import SEED_CONTEXTS, cache_key, context_key
from tests.engine_support import (
    DirectEngine,
    Stack,
    Traffic,
    drive_to_rollback,
    engine_config,
    engine_stack,
    full_kl,
    inject_kernel,
    kv_cache_type,
    prompt,
)
from tests.procs import ADMIN_TOKEN, Proc, Spawner, post_fault, wait_for
from tests.test_dependency_support import needs_redis, redis_server

pytestmark = pytest.mark.engine

REASON = "needs the engine extra (llama-cpp-python[server], gguf): run `make test-engine`"
pytest.importorskip("llama_cpp", reason=REASON)
pytest.importorskip("gguf", reason=REASON)

from canarystack.engine.gguf_gen import (  # noqa: E402 - after the skip
    ModelShape,
    silent_token_ids,
    vocabulary,
    write_gguf,
)
from gameday.oracle import (  # noqa: E402
    compare_positions,
    compare_responses,
    kl_topk,
    parse_logprobs,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "x-actor": "test"}
START_TIMEOUT_S = 90.0  # a pod answers /health once its engine is up (seconds on 2 cores)
# A prompt that shares no prefix (beyond BOS) with the pseudo-word prompts: sent between
# measured prompts so llama.cpp's prefix reuse does not change what is measured.
RESET_PROMPT = "0 1 2 3 4 5 6 7 8 9"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "model.gguf", seed=0)


def start_pod(spawn: Spawner, gguf: Path, tmp_path: Path, version: str = "v1", *extra: str) -> Proc:
    return spawn(
        "canarystack.engine",
        "--model", str(gguf), "--version", version,
        "--engine-log", str(tmp_path / f"engine-{version}.log"), *extra,
        timeout=START_TIMEOUT_S,
    )  # fmt: skip


def complete(url: str, text: str, **extra: object) -> requests.Response:
    body = {"prompt": text, "max_tokens": 4, "temperature": 0, "logprobs": 5, **extra}
    return requests.post(url + "/v1/completions", json=body, timeout=60)


def wait_cache(url: str, cache_type: str, timeout: float = 60) -> None:
    wait_for(lambda: kv_cache_type(url) == cache_type, timeout=timeout, what=cache_type)


# ------------------------------------------------------------------------ the model
def test_gguf_generator_is_deterministic_and_loads(tmp_path: Path) -> None:
    from llama_cpp import Llama

    a = write_gguf(tmp_path / "a.gguf", seed=7)
    b = write_gguf(tmp_path / "b.gguf", seed=7)
    c = write_gguf(tmp_path / "c.gguf", seed=8)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert not list(tmp_path.glob("*.tmp"))

    engine = DirectEngine(a, "f16", n_ctx=512)
    llama: Llama = engine.llama
    text = "kabo lumo shai teazou, 42!"
    assert llama.detokenize(llama.tokenize(text.encode(), add_bos=True)).decode() == text
    assert llama.n_vocab() == ModelShape().vocab
    # "medium" scales: peaked enough for drift tests, not one-hot.
    lp = engine.next_logprobs(prompt(1, 64))
    p = __import__("numpy").exp(lp)
    entropy = float(-(p * lp).sum())
    assert 0.8 < entropy < 4.0, entropy
    assert 0.15 < float(p.max()) < 0.95, float(p.max())
    # Every token that can reach a top-k prints as a text no other such token has, so
    # top_logprobs keyed by text lose nothing.
    _, types, _ = vocabulary(ModelShape().vocab)
    silent = set(silent_token_ids(types))
    texts = [
        llama.detokenize([i]).decode("utf-8", errors="ignore")
        for i in range(llama.n_vocab())
        if i not in silent
    ]
    assert len(texts) == len(set(texts))
    assert float(p[sorted(silent)].max()) < float(p.max()) / 10


def test_gguf_command_line(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    ok = subprocess.run(
        [sys.executable, "-m", "canarystack.engine.gguf_gen", "--out", str(out), "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "sha256" in ok.stdout and out.stat().st_size > 10_000_000
    bad = subprocess.run(
        [sys.executable, "-m", "canarystack.engine.gguf_gen", "--out", str(out), "--seed", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--seed -1" in bad.stderr


# ------------------------------------------------------------------------- the pod
def test_engine_pod_keeps_the_model_server_contract(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    pod = start_pod(spawn, gguf_path, tmp_path, version="v7")
    health = requests.get(pod.url + "/health", timeout=5).json()
    assert health["engine"] == "llama.cpp" and health["kv_cache_type"] == "f16"
    assert health["kernel_modes"] == ["kv-quant", "fp8-kv-scale"]  # the builds it can make
    models = requests.get(pod.url + "/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "default" and models["data"][0]["max_model_len"] == 8192
    # The pod publishes the same API as the simulator, every route described.
    spec = requests.get(pod.url + "/openapi.json", timeout=5).json()
    assert spec["openapi"].startswith("3.") and "/v1/completions" in spec["paths"]
    assert not spec.get("x-undocumented-routes")

    text = prompt(11, 48)
    resp = requests.post(
        pod.url + "/v1/completions",
        json={
            "prompt": text,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        headers={"x-request-id": "req-1", "x-traffic-tag": "tag-1"},
        stream=True,
        timeout=60,
    )
    assert resp.status_code == 200
    assert resp.headers["x-model-version"] == "v7" and resp.headers["x-request-id"] == "req-1"
    events = [line[5:].strip() for line in resp.iter_lines() if line.startswith(b"data:")]
    assert events[-1] == b"[DONE]"
    chunks = [__import__("json").loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    tokens = [c for c in chunks if c["choices"] and c["choices"][0].get("logprobs")]
    assert usage["completion_tokens"] == len(tokens) == 6
    for c in tokens:
        top = c["choices"][0]["logprobs"]["top_logprobs"][0]
        assert isinstance(top, dict) and 1 <= len(top) <= 4  # keyed by token text

    # The same prompt, not streamed: the engine's own usage agrees with the pod's count.
    plain = complete(pod.url, text, max_tokens=6).json()
    assert plain["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    assert plain["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks[:-1])

    def done_line() -> dict[str, object] | None:
        for ev in pod.log_events():
            if ev.get("event") == "request_done" and ev.get("request_id") == "req-1":
                return ev
        return None

    line = wait_for(done_line, timeout=10, what="request_done")
    assert isinstance(line, dict)
    assert line["traffic_tag"] == "tag-1" and line["version"] == "v7"
    assert line["prompt_tokens"] == usage["prompt_tokens"]
    assert line["completion_tokens"] == 6 and line["finish_reason"] == "length"
    assert line["kv_cache_type"] == "f16" and line["error"] is None
    assert isinstance(line["ttft_s"], float) and 0 < line["ttft_s"] <= line["e2e_s"]
    metrics = requests.get(pod.url + "/metrics", timeout=5).text
    assert "vllm:time_to_first_token_seconds_count" in metrics


@needs_redis
def test_engine_pod_uses_the_shared_redis_and_degrades_without_it(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    """#16 item 1: an engine pod does the simulator's per-request context lookup and
    prefix-cache write (coloured ``redis`` hops), puts the retrieved context in front of
    what llama.cpp gets, and says ``x-dependency: ok``; with Redis killed the same
    request is answered without the context, ``x-dependency: degraded``, never failed."""
    text = "hello world"
    with redis_server(tmp_path) as rds:
        rds.client().set(context_key(text), SEED_CONTEXTS[text])
        pod = start_pod(spawn, gguf_path, tmp_path, "v1", "--redis-url", rds.url)
        wait_cache(pod.url, "f16")
        health = requests.get(pod.url + "/health", timeout=5).json()
        assert health["dependency"]["name"] == "redis"
        assert health["dependency"]["state"] == "closed"
        trace = "ab" * 16
        ok = requests.post(
            pod.url + "/v1/completions",
            json={"prompt": text, "max_tokens": 2, "temperature": 0},
            headers={
                "x-request-id": "dep-ok",
                "x-traffic-tag": "gameday",
                "traceparent": f"00-{trace}-{'cd' * 8}-01",
            },
            timeout=60,
        )
        assert ok.status_code == 200, ok.text
        assert ok.headers["x-dependency"] == "ok"
        with_context = ok.json()["usage"]["prompt_tokens"]  # as llama.cpp counted it
        assert rds.client().exists(cache_key(text)) == 1  # the prefix-cache write
        hops = requests.get(pod.url + "/v1/colour/hops", headers=ADMIN, timeout=5).json()
        redis_hops = [h for h in hops["hops"] if h["hop"] == "redis"]
        assert [h["request_id"] for h in redis_hops] == ["dep-ok", "dep-ok"]  # GET, SETEX
        assert all(h["trace_id"] == trace and h["tag"] == "gameday" for h in redis_hops)
        chat = requests.post(
            pod.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 2,
                  "stream": True},
            timeout=60,
        )  # fmt: skip
        assert chat.status_code == 200 and chat.headers["x-dependency"] == "ok"
        assert chat.text.rstrip().endswith("[DONE]")

        rds.kill()
        down = requests.post(
            pod.url + "/v1/completions",
            json={"prompt": text, "max_tokens": 2, "temperature": 0},
            headers={"x-request-id": "dep-down"},
            timeout=60,
        )
        assert down.status_code == 200, down.text
        assert down.headers["x-dependency"] == "degraded"
        # The engine got the prompt alone: fewer prompt tokens than with the context.
        assert down.json()["usage"]["prompt_tokens"] < with_context

    def done(rid: str) -> dict[str, object] | None:
        return next(
            (e for e in pod.log_events()
             if e.get("event") == "request_done" and e.get("request_id") == rid),
            None,
        )  # fmt: skip

    line = wait_for(lambda: done("dep-ok"), timeout=10, what="request_done")
    assert isinstance(line, dict) and line["dependency"] == "ok"
    line = wait_for(lambda: done("dep-down"), timeout=10, what="request_done")
    assert isinstance(line, dict)
    assert line["dependency"] == "error" and line["error"] is None  # refused: degraded
    assert line["prompt_tokens"] == down.json()["usage"]["prompt_tokens"]
    dependency = requests.get(pod.url + "/health", timeout=5).json()["dependency"]
    assert str(dependency["last_error"]).startswith("error: ")


def test_bad_dependency_options_are_refused_by_name(gguf_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.engine", "--model", str(gguf_path),
         "--redis-url", "http://127.0.0.1:6379", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--redis-url 'http://127.0.0.1:6379': give redis://HOST:PORT" in res.stderr


BAD_REQUESTS: list[tuple[str, dict[str, object], int, str]] = [
    ("completions", {"prompt": "kabo", "max_tokens": "x"}, 400, "max_tokens"),
    ("completions", {"prompt": "kabo", "max_tokens": 9000}, 400, "max_tokens"),
    ("completions", {"prompt": "kabo", "logprobs": 50}, 400, "logprobs"),
    ("completions", {"prompt": "   "}, 400, "prompt"),
    ("completions", {"prompt": "kabo", "n": 2}, 400, "n"),
    ("completions", {"prompt": "kabo", "model": "other"}, 404, "model"),
    ("completions", {"messages": []}, 400, "prompt"),
    ("chat/completions", {"messages": "hi"}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "messages"),
]


def test_bad_requests_get_a_4xx_naming_the_field(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    pod = start_pod(spawn, gguf_path, tmp_path)
    for path, body, status, param in BAD_REQUESTS:
        resp = requests.post(f"{pod.url}/v1/{path}", json=body, timeout=30)
        assert resp.status_code == status, (path, body, resp.text)
        assert str(resp.json()["error"]["param"]).startswith(param), (body, resp.text)
    assert requests.post(pod.url + "/v1/completions", data=b"{", timeout=30).status_code == 400
    # Bodies are read within limits sized from the context length (8192 tokens: 8192 x 16
    # bytes of prompt, plus 64 KiB around it), as the simulator reads them: a body over the
    # limit is a 413 before it is parsed, a prompt over its bytes a 400 before it is
    # tokenised.
    big = requests.post(
        pod.url + "/v1/completions",
        data=b'{"prompt": "' + b"kabo " * 60_000 + b'"}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert big.status_code == 413, big.text
    assert big.json()["error"]["code"] == "body_too_large"
    long_prompt = complete(pod.url, "kabo " * 27_000)  # 135,000 bytes > 8192 x 16
    assert long_prompt.status_code == 400, long_prompt.text
    assert long_prompt.json()["error"]["code"] == "prompt_too_large"
    many = requests.post(
        pod.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "a"}] * 3000},
        timeout=30,
    )
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages", many.text
    assert "at most 2048" in many.json()["error"]["message"]
    # none of that reached the engine, which still answers
    assert complete(pod.url, "kabo lumo").status_code == 200


def test_broken_kernel_modes_are_refused_naming_the_engines_modes(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    """The simulator's broken-kernel modes cannot be produced by llama.cpp: a 400 that
    names the mode and the modes the engine pod has, and no rollout starts."""
    pod = start_pod(spawn, gguf_path, tmp_path)
    for mode in ("nan-logits", "inf-logits", "garbage"):
        resp = post_fault(
            pod.url, {"kind": "kernel", "ttl_s": 30, "mode": mode}, {"x-actor": "test"}
        )
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        assert mode in message and "simulator only" in message, message
        assert "kv-quant" in message and "fp8-kv-scale" in message, message
    assert requests.get(pod.url + "/admin/faults", headers=ADMIN, timeout=5).json() == {
        "faults": []
    }
    assert kv_cache_type(pod.url) == "f16"


def test_a_non_finite_engine_event_is_relayed_and_recorded_not_accepted() -> None:
    """A stream event from the engine with a NaN logprob: relayed as the engine wrote it
    (the router and the oracle count it as a broken canary), its token counted, and the
    pod records why it was not strict JSON."""
    from canarystack.engine.pod import EnginePod, _StreamState

    state = _StreamState(chat=False, include_usage=False, prompt_tokens=3)
    sound = b'data: {"id": "c1", "choices": [{"text": " kabo", "logprobs": {"tokens": [" kabo"]}}]}'
    assert EnginePod._event(sound, state) == (sound, True)
    assert state.invalid is None
    broken = (
        b'data: {"id": "c1", "choices": [{"text": " lumo", "logprobs": {"tokens": [" lumo"], '
        b'"top_logprobs": [{" lumo": NaN}]}}]}'
    )
    assert EnginePod._event(broken, state) == (broken, True)
    assert state.invalid is not None and "NaN" in state.invalid
    assert state.completion_tokens == 2


def test_kernel_fault_rolls_over_to_a_quantized_cache_and_back(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    pod = start_pod(spawn, gguf_path, tmp_path)
    texts = [prompt(100 + i, 64) for i in range(3)]

    def measure() -> list[Mapping[str, float]]:
        out = []
        for t in texts:
            complete(pod.url, RESET_PROMPT, max_tokens=1)
            out.append(parse_logprobs(complete(pod.url, t, max_tokens=1).json())[0].top)
        return out

    reference = measure()
    # Refused: the simulator's parameters the engine cannot honour, and unknown ones.
    for bad in ({"min_prompt_tokens": 2048}, {"magnitude": 2}, {"cache_type": "q2_k"}):
        resp = post_fault(pod.url, {"kind": "kernel", "ttl_s": 30, **bad}, {"x-actor": "test"})
        assert resp.status_code == 400, resp.text
        assert next(iter(bad)) in resp.json()["error"]["message"]

    # A q4_0 cache via the TTL: it rolls over, serves quantized, and rolls back by itself.
    inject_kernel(pod.url, ADMIN, "q4_0", ttl_s=6)
    wait_cache(pod.url, "q4_0")
    quantized = measure()
    drift = [kl_topk(a, b) for a, b in zip(reference, quantized, strict=True)]
    assert sum(drift) / len(drift) > 1e-3, drift
    resp = complete(pod.url, texts[0])
    assert resp.headers["x-engine-kv-cache"] == "q4_0"
    wait_cache(pod.url, "f16", timeout=60)
    assert measure() == reference  # f16 again: the same numbers as before the fault

    # q8_0, cleared by hand.
    fault_id = inject_kernel(pod.url, ADMIN, "q8_0", ttl_s=300)
    wait_cache(pod.url, "q8_0")
    small = [kl_topk(a, b) for a, b in zip(reference, measure(), strict=True)]
    assert 0 < sum(small) / len(small) < sum(drift) / len(drift)
    requests.delete(pod.url + f"/admin/faults/{fault_id}", headers=ADMIN, timeout=5)
    wait_cache(pod.url, "f16", timeout=60)

    def events() -> list[object]:
        return [e.get("event") for e in pod.log_events()]

    # every old engine is stopped once its requests are done
    wait_for(lambda: events().count("engine_retired") == 4, timeout=20, what="4 retired")
    assert events().count("rollout_done") == 5  # start, q4_0, f16, q8_0, f16
    assert "rollout_failed" not in events()


def test_a_pod_started_as_a_bad_build_serves_it_for_its_life(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    """--kernel-fault (the Kubernetes rollout of a bad build, as the simulator's): the pod
    serves the build the kernel fault's mode rolls out to from its start, /health says so
    and how long its engine has served (the harness times the fault from then), and
    clearing faults does not heal it: only a pod started without the flag does."""
    healthy = start_pod(spawn, gguf_path, tmp_path, "v1")
    bad = start_pod(spawn, gguf_path, tmp_path, "v2", "--kernel-fault", "kv-quant:0")
    health = requests.get(bad.url + "/health", timeout=5).json()
    assert health["build_kernel_fault"] == "kv-quant:0"
    assert health["kv_cache_type"] == "q4_0"
    assert 0 <= health["serving_s"] <= health["uptime_s"]
    good = requests.get(healthy.url + "/health", timeout=5).json()
    assert (good["build_kernel_fault"], good["kv_cache_type"]) == (None, "f16")
    text = prompt(100, 64)
    got = [
        parse_logprobs(complete(p.url, text, max_tokens=1).json())[0].top for p in (healthy, bad)
    ]
    assert kl_topk(*got) > 1e-3  # the bad build drifts, as the q4_0 fault does
    assert complete(bad.url, text).headers["x-engine-kv-cache"] == "q4_0"
    # no injected fault to clear: the build stays what it is
    assert requests.delete(bad.url + "/admin/faults", headers=ADMIN, timeout=5).ok
    time.sleep(1.0)
    assert requests.get(bad.url + "/health", timeout=5).json()["kv_cache_type"] == "q4_0"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("kv-quant:2048", "acts on every prompt"),
        ("nan-logits", "simulator only"),
        ("kv-quant:many", "not a whole number"),
        ("bogus", "mode:"),
    ],
)
def test_a_bad_build_the_engine_cannot_make_is_refused_at_start(
    gguf_path: Path, value: str, says: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "canarystack.engine", "--model", str(gguf_path),
         "--kernel-fault", value],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--kernel-fault {value!r}" in done.stderr and says in done.stderr


def _process_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status  # a zombie no one reaped has stopped running


def test_a_killed_pod_takes_its_engine_with_it(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    pod = start_pod(spawn, gguf_path, tmp_path)
    engine_pid = requests.get(pod.url + "/health", timeout=5).json()["engine_pid"]
    assert not _process_gone(engine_pid)
    pod.kill()  # SIGKILL: no cleanup code runs in the pod
    wait_for(lambda: _process_gone(engine_pid), timeout=10, what="the engine to exit")


def test_a_stopped_pod_stops_its_engine(spawn: Spawner, gguf_path: Path, tmp_path: Path) -> None:
    pod = start_pod(spawn, gguf_path, tmp_path)
    engine_pid = requests.get(pod.url + "/health", timeout=5).json()["engine_pid"]
    os.kill(pod.pid, signal.SIGTERM)
    pod.popen.wait(timeout=20)
    assert _process_gone(engine_pid)
    assert any(e.get("event") == "engine_stopped" for e in pod.log_events())


def test_engine_pod_without_a_model_says_how_to_make_one(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.engine", "--model", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "canarystack.engine.gguf_gen" in res.stderr and str(missing) in res.stderr


def test_router_and_oracle_read_llamacpp_logprobs(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    """Both readers of logprobs — the router's shadow collector (streamed, as the router
    sees shadow copies) and the oracle's parser (whole responses) — get the same positions
    from llama.cpp's shapes: completions' ``top_logprobs`` dicts keyed by token text, and
    chat's ``content`` lists."""
    from canarystack.router.shadow import Collector, LogprobRequest

    pod = start_pod(spawn, gguf_path, tmp_path)
    text = prompt(21, 40)
    for chat in (False, True):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body: dict[str, object] = {"max_tokens": 4, "temperature": 0}
        if chat:
            body.update(messages=[{"role": "user", "content": text}], logprobs=True)
            body["top_logprobs"] = 5
        else:
            body.update(prompt=text, logprobs=5)
        complete(pod.url, RESET_PROMPT, max_tokens=1)
        answer = requests.post(pod.url + path, json=body, timeout=60).json()
        whole = parse_logprobs(answer)  # raises BrokenLogprobs on a broken shape
        # llama.cpp's logprobs are sound to the oracle: compared with themselves, no side
        # reads as broken and the divergence is 0.
        same = compare_responses(answer, answer)
        assert same.canary_broken is None and same.kl_mean == 0.0, (chat, same)
        complete(pod.url, RESET_PROMPT, max_tokens=1)
        collector = Collector(LogprobRequest(chat=chat, k=5, user_k=5), 16, time.perf_counter)
        with requests.post(
            pod.url + path, json={**body, "stream": True}, stream=True, timeout=60
        ) as resp:
            for chunk in resp.iter_content(None):
                collector.feed_chunk(chunk)
        collector.flush()
        assert collector.broken is None, (chat, collector.broken)
        streamed = collector.positions
        assert len(whole) == len(streamed) == 4, (chat, whole, streamed)
        for w, s in zip(whole, streamed, strict=True):
            assert w.token == s.token and len(w.top) == len(s.top) == 5
            assert set(w.top) == set(s.top)
            assert all(abs(w.top[t] - s.top[t]) < 1e-4 for t in w.top)
        assert collector.first_content_t is not None


# ------------------------------------------------------------------ the drift check
# Tolerance: per prompt, the oracle's KL over HTTP equals the same top-5 construction on
# the engine's direct logits within 1e-3 + 5 %; on the mean over prompts within 5 %. (The
# engine's numbers over HTTP and in-process agree to ~1e-7 in logprob; what is left is
# llama.cpp's own batch-split noise.) The top-5 KL tracks the full-vocabulary KL: their
# means are within a factor 2 (measured: ~0.8).
KL_ABS_TOL = 1e-3
KL_REL_TOL = 0.05


def test_oracle_drift_matches_the_engines_own_logits(
    spawn: Spawner, gguf_path: Path, tmp_path: Path
) -> None:
    baseline = start_pod(spawn, gguf_path, tmp_path, version="v1")
    canary = start_pod(spawn, gguf_path, tmp_path, version="v2")
    inject_kernel(canary.url, ADMIN, "q4_0", ttl_s=300)
    wait_cache(canary.url, "q4_0")
    direct_f16 = DirectEngine(gguf_path, "f16")
    direct_q4 = DirectEngine(gguf_path, "q4_0")

    http, top5, full = [], [], []
    for i in range(12):
        text = prompt(300 + i, (16, 32, 64, 128)[i % 4])  # < 512 tokens: one batch
        sides = []
        for pod in (baseline, canary):
            complete(pod.url, RESET_PROMPT, max_tokens=1)
            sides.append(parse_logprobs(complete(pod.url, text, max_tokens=1).json()))
        http.append(compare_positions(sides[0], sides[1]).kl_first)
        a, b = direct_f16.next_logprobs(text), direct_q4.next_logprobs(text)
        top5.append(kl_topk(direct_f16.top_k(a, 5), direct_q4.top_k(b, 5)))
        full.append(full_kl(a, b))
    for h, d in zip(http, top5, strict=True):
        assert abs(h - d) <= KL_ABS_TOL + KL_REL_TOL * d, (h, d)
    mean_http, mean_top5, mean_full = (sum(x) / len(x) for x in (http, top5, full))
    assert abs(mean_http - mean_top5) <= KL_REL_TOL * mean_top5, (mean_http, mean_top5)
    assert 0.5 <= mean_top5 / mean_full <= 2.0, (mean_top5, mean_full)
    assert mean_full > 1e-3  # q4_0 is a drift the gate must see


# -------------------------------------------------------------------- the whole stack
def _comparisons(stack: Stack) -> tuple[int, int]:
    """(canary comparisons, baseline-vs-baseline noise comparisons) the gate has seen."""
    b = stack.gate()["buckets"].values()
    return sum(x["comparisons"] for x in b), sum(x["noise_comparisons"] for x in b)


def _watch_without_trip(stack: Stack, what: str, comparisons: int, noise: int) -> None:
    """Wait until the gate has ``comparisons``/``noise`` more, failing on any trip."""
    c0, n0 = _comparisons(stack)

    def enough() -> bool:
        gate = stack.gate()
        assert gate["trip"] is None, f"{what}: the gate tripped: {gate['trip']}"
        c, n = _comparisons(stack)
        return c - c0 >= comparisons and n - n0 >= noise

    wait_for(enough, timeout=180, interval=0.5, what=f"{comparisons} comparisons ({what})")


def _assert_quiet(stack: Stack, traffic: Traffic) -> dict[str, Any]:
    gate = stack.gate()
    assert gate["state"] == "watching" and gate["trip"] is None
    assert stack.release()["phase"] == "progressing"
    assert traffic.served["canary"] > 0 and not traffic.errors, traffic.errors[:3]
    return gate


def _quiet_under_traffic(
    tmp_path: Path, what: str, config: Path | None = None, *, max_s: float
) -> dict[str, Any]:
    """A stack (on ``config``) whose canary serves traffic (for at most ``max_s``) until the
    gate has seen 80 more comparisons and 15 noise comparisons without a trip; the quiet
    gate's state (``_assert_quiet``)."""
    with engine_stack(tmp_path, config) as stack:
        traffic = Traffic(stack.desc["router_url"], users=2, max_s=max_s).start()
        try:
            _watch_without_trip(stack, what, comparisons=80, noise=15)
        finally:
            traffic.stop()
        return _assert_quiet(stack, traffic)


def test_an_f16_canary_does_not_trip(tmp_path: Path) -> None:
    gate = _quiet_under_traffic(tmp_path, "f16 canary", max_s=150)
    for label, bucket in gate["buckets"].items():
        if bucket["comparisons"]:
            assert bucket["drift"]["kl"]["mean"] < 1e-3, (label, bucket["drift"])


def test_a_batch_size_variant_canary_differs_and_does_not_trip(tmp_path: Path) -> None:
    """A benign numerical variant (#14 item 2): the canary processes prompts in batches of 8
    instead of 512 — different matmul shapes, different rounding, as a batch-size or
    tensor-parallel change gives on a GPU. Its logprobs differ from the baseline's (the
    drift the gate measures is above 0) and the gate must not trip. Smaller batches also
    make the canary's prompt processing slower for real (a busy machine stretches that
    past the latency test's 1.5x + 0.1 s), and a latency trip would say nothing about the
    numerics: the latency test is set out of reach, as for q4_0 below."""
    config = engine_config(
        tmp_path, {"model-canary": ["--n-batch", "8"], "gate": ["--latency-ratio=1000"]}
    )
    gate = _quiet_under_traffic(tmp_path, "n_batch 8 canary", config, max_s=170)
    means = [b["drift"]["kl"]["mean"] for b in gate["buckets"].values() if b["comparisons"]]
    assert max(means) > 0.0, gate["buckets"]  # the variant really differs...
    assert max(means) < 1e-3, gate["buckets"]  # ...by much less than q4_0's ~1e-2


def test_a_q8_0_canary_does_not_trip(tmp_path: Path) -> None:
    """A small acceptable drift (#14 item 2): the canary rolls over to a q8_0 KV cache
    (full-vocabulary KL ~1.5e-4 on this model) and then serves 80 more comparisons; the
    gate, tuned to trip on q4_0 (~2e-2), must stay quiet."""
    with engine_stack(tmp_path) as stack:
        canary = stack.url("model-canary-0")
        traffic = Traffic(stack.desc["router_url"], users=2, max_s=200).start()
        try:
            _watch_without_trip(stack, "f16 canary before the rollover", comparisons=20, noise=5)
            inject_kernel(canary, stack.fault_headers("model-canary"), "q8_0", ttl_s=300)
            wait_for(lambda: kv_cache_type(canary) == "q8_0", timeout=60, what="q8_0 cache")
            _watch_without_trip(stack, "q8_0 canary", comparisons=80, noise=10)
        finally:
            traffic.stop()
        _assert_quiet(stack, traffic)
        assert kv_cache_type(canary) == "q8_0"  # it served quantized the whole time


def test_a_q4_0_canary_trips_on_drift_and_is_rolled_back(tmp_path: Path) -> None:
    """q4_0 must trip on **drift**: the rollover to the quantized cache also slows the
    canary for a moment, so the gate's latency test is set out of reach here (a latency
    trip would prove nothing about the numerics)."""
    config = engine_config(tmp_path, {"gate": ["--latency-ratio=1000"]})
    with engine_stack(tmp_path, config) as stack:
        canary = stack.url("model-canary-0")
        headers = stack.fault_headers("model-canary")
        run = drive_to_rollback(stack, lambda: inject_kernel(canary, headers, "q4_0", 300))
        release, traffic = run.release, run.traffic
        t_fault, t_rolled_back = run.t_fault, run.t_rolled_back
        trip = release["trip"]
        assert trip["test"] == "drift", trip
        assert trip["tripped_at"] > t_fault
        assert release["canary"]["quarantined"] is True
        assert trip["detail"]["run_mean"] > trip["detail"]["null_mean"]
        assert kv_cache_type(canary) == "q4_0"  # the fault still holds: the gate, not a TTL
        assert not [t for t in traffic.canary_starts if t > t_rolled_back]
        assert not traffic.errors, traffic.errors[:3]
        print(
            f"q4_0 canary: tripped {trip['tripped_at'] - t_fault:.2f}s after the fault "
            f"({trip['test']}, bucket {trip['bucket']}, {trip['samples']} samples), "
            f"rolled back {t_rolled_back - t_fault:.2f}s after it"
        )
