"""The model server's OpenAI-compatible API against a real process: response shapes of
both endpoints, streaming (strict SSE) and not, usage, logprobs that are exactly the
engine's distributions, headers, the request_done log line, /v1/models, and the 404 for
an unknown model."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.model.engine import NextTokenModel, generate
from canarystack.tokenizer import make_prompt, render_chat
from tests.model_helpers import (
    FAST,
    complete,
    module_spawner,
    parse_sse,
    post,
    request_done_lines,
    stream,
)
from tests.procs import Proc, wait_for

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
]
PROMPT = make_prompt(40, seed=11)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with module_spawner(tmp_path_factory.mktemp("model-api")) as spawn:
        yield spawn("canarystack.model", "--version", "v1", "--served-model-name", "m", *FAST)


def test_completion_shape_usage_and_logprobs(server: Proc) -> None:
    resp = post(
        server,
        "/v1/completions",
        {"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3},
    )
    assert resp.status_code == 200
    assert resp.headers["x-model-version"] == "v1"
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "text_completion" and body["model"] == "m"
    assert body["id"] == "cmpl-" + resp.headers["x-request-id"]
    assert body["usage"] == {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(8)]
    assert all(len(top) == 3 for top in lp["top_logprobs"])
    # Exactly the engine's greedy path and distributions (the pure function tests use).
    steps = generate(NextTokenModel("v1"), PROMPT.split(), 8)
    for step, tok, tlp, top in zip(
        steps, lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert tok == " " + _word(step.token_id)
        assert tlp == step.dist.logprob_of(step.token_id)
        expected = {" " + _word(t): v for t, v in step.dist.top(3)}
        assert top == expected
        assert max(top.values()) == tlp  # greedy: the sampled token is the favourite


def _word(token_id: int) -> str:
    from canarystack.tokenizer import vocab

    return vocab()[token_id]


def test_completion_stream_shape_and_include_usage(server: Proc) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
        "stream_options": {"include_usage": True},
    }
    resp, events, _ = stream(server, "/v1/completions", body)
    assert resp.headers["content-type"].startswith("text/event-stream")
    *chunks, usage = events
    assert len(chunks) == 6
    for i, ev in enumerate(chunks):
        assert ev["object"] == "text_completion" and ev["model"] == "m"
        assert ev["usage"] is None
        (choice,) = ev["choices"]
        assert choice["text"].startswith(" ")
        assert choice["finish_reason"] == ("length" if i == 5 else None)
        assert len(choice["logprobs"]["tokens"]) == 1
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}
    # Streamed and non-streamed answers agree token for token, logprobs included.
    full = complete(server, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2})
    merged = [c["choices"][0]["logprobs"] for c in chunks]
    assert [m["tokens"][0] for m in merged] == full["choices"][0]["logprobs"]["tokens"]
    assert [m["text_offset"][0] for m in merged] == full["choices"][0]["logprobs"]["text_offset"]
    assert [m["top_logprobs"][0] for m in merged] == full["choices"][0]["logprobs"]["top_logprobs"]


def test_stream_without_include_usage_has_no_usage_field(server: Proc) -> None:
    _, events, _ = stream(server, "/v1/completions", {"prompt": "a b", "max_tokens": 3})
    assert len(events) == 3
    assert all("usage" not in ev and ev["choices"][0]["logprobs"] is None for ev in events)


def test_chat_shape_and_logprobs(server: Proc) -> None:
    resp = post(
        server,
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 4},
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-" + resp.headers["x-request-id"]
    prompt_tokens = len(render_chat(CHAT).split())
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5,
        "total_tokens": prompt_tokens + 5,
    }
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    steps = generate(NextTokenModel("v1"), render_chat(CHAT).split(), 5)
    for step, entry in zip(steps, content, strict=True):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] == step.dist.logprob_of(step.token_id)
        assert [t["logprob"] for t in entry["top_logprobs"]] == [v for _, v in step.dist.top(4)]
        assert all(set(t) == {"token", "logprob", "bytes"} for t in entry["top_logprobs"])


def test_chat_stream_shape(server: Proc) -> None:
    body = {
        "messages": CHAT,
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "stream_options": {"include_usage": True},
    }
    _, events, _ = stream(server, "/v1/chat/completions", body)
    role, *chunks, usage = events
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(chunks) == 4
    for i, ev in enumerate(chunks):
        (choice,) = ev["choices"]
        assert choice["delta"]["content"].startswith(" ")
        (lp,) = choice["logprobs"]["content"]
        assert lp["token"] == choice["delta"]["content"] and len(lp["top_logprobs"]) == 2
        assert choice["finish_reason"] == ("length" if i == 3 else None)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


def test_stop_sequences_and_seeded_sampling(server: Proc) -> None:
    base = complete(server, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0})
    text = base["choices"][0]["text"]
    stop = text.split()[3]
    cut = complete(server, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stop": stop})
    (choice,) = cut["choices"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert text.startswith(choice["text"]) and stop not in choice["text"]
    seeded = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 5}
    a, b = complete(server, seeded), complete(server, seeded)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_headers_and_request_done_log_line(server: Proc) -> None:
    headers = {
        "x-request-id": "req-abc-1",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x-traffic-tag": "shadow",
    }
    resp, events, _ = stream(
        server, "/v1/completions", {"prompt": "a b c", "max_tokens": 4}, headers=headers
    )
    assert resp.headers["x-request-id"] == "req-abc-1"
    assert resp.headers["x-model-version"] == "v1"
    assert events[0]["id"] == "cmpl-req-abc-1"

    def line() -> dict[str, Any] | None:
        found = [e for e in request_done_lines(server) if e["request_id"] == "req-abc-1"]
        return found[0] if found else None

    rec = wait_for(line, timeout=5, what="request_done line")
    assert isinstance(rec, dict)
    assert rec["traceparent"] == headers["traceparent"] and rec["traffic_tag"] == "shadow"
    assert rec["version"] == "v1" and rec["stream"] is True and rec["error"] is None
    assert rec["prompt_tokens"] == 3 and rec["completion_tokens"] == 4
    assert rec["finish_reason"] == "length"
    assert 0 < rec["ttft_s"] <= rec["e2e_s"]


def test_models_health_metrics(server: Proc) -> None:
    models = requests.get(server.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["m"]
    health = requests.get(server.url + "/health", timeout=5).json()
    assert health["status"] == "ok" and health["version"] == "v1" and health["model"] == "m"
    complete(server, {"prompt": "x y", "max_tokens": 2})
    text = requests.get(server.url + "/metrics", timeout=5).text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        'vllm:request_success_total{finished_reason="length",model_name="m"}',
        'vllm:num_requests_running{model_name="m"}',
        'vllm:num_requests_waiting{model_name="m"}',
        'vllm:prompt_tokens_total{model_name="m"}',
        'vllm:generation_tokens_total{model_name="m"}',
        'canarystack_active_faults{kind="kernel"}',
    ):
        assert name in text, name


def test_unknown_model_is_404_naming_the_served_one(server: Proc) -> None:
    resp = post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": CHAT})
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["param"] == "model" and "gpt-4" in err["message"] and "`m`" in err["message"]
    assert resp.headers["x-model-version"] == "v1"


def test_two_processes_of_one_version_agree_bit_for_bit(
    server: Proc, tmp_path: Path, spawn: Any
) -> None:
    twin = spawn("canarystack.model", "--version", "v1", "--served-model-name", "m", *FAST)
    for body in (
        {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 5},
        {"prompt": PROMPT, "max_tokens": 16, "temperature": 0.8, "seed": 9, "logprobs": 5},
    ):
        a, b = complete(server, body), complete(twin, body)
        assert a["choices"] == b["choices"]
        assert all(not math.isnan(x) for x in a["choices"][0]["logprobs"]["token_logprobs"])
    chat = {
        "messages": CHAT,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    ra = post(server, "/v1/chat/completions", chat).json()
    rb = post(twin, "/v1/chat/completions", chat).json()
    assert ra["choices"] == rb["choices"]


def test_sse_parser_is_strict() -> None:
    ok = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    assert parse_sse(ok) == [{"a": 1}]
    for bad in (
        b'data: {"a":1}\n\n',  # no [DONE]
        b'data: {"a":1}\ndata: [DONE]\n\n',  # one newline
        b'event: x\ndata: {"a":1}\n\ndata: [DONE]\n\n',  # extra field
        b'data:{"a":1}\n\ndata: [DONE]\n\n',  # no space
        b'data: [DONE]\n\ndata: {"a":1}\n\n',  # after DONE
    ):
        with pytest.raises(AssertionError):
            parse_sse(bad)
