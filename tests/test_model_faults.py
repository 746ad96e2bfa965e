"""The model server's faults through its admin API: the token, validation, listing with
remaining time, each kind's effect (bounded to its prompt-length threshold where it has
one), the error rate as a statistic, the crash exit code, and expiry by TTL."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from canarystack.tokenizer import make_prompt
from tests.model_helpers import (
    ADMIN,
    FAST,
    complete,
    done_line,
    fault_free_server_fixtures,
    inject,
    parse_sse,
    post,
    request_done_lines,
    stream,
)
from tests.procs import Proc, wait_for

SHORT = make_prompt(10, seed=1)
LONG = make_prompt(150, seed=2)


module_server, server = fault_free_server_fixtures("model-faults")


def raw_stream(proc: Proc, body: dict[str, Any]) -> tuple[bytes, Exception | None]:
    """The raw SSE bytes of a streamed completion and the error that ended it, if any."""
    resp = requests.post(
        proc.url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=10
    )
    assert resp.status_code == 200, resp.text
    raw = b""
    try:
        for chunk in resp.iter_content(chunk_size=None):
            raw += chunk
    except requests.RequestException as exc:
        return raw, exc
    return raw, None


def top_logprobs(proc: Proc, prompt: str) -> Any:
    body = {"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 5}
    return complete(proc, body)["choices"][0]["logprobs"]["top_logprobs"]


def test_admin_needs_the_token(server: Proc, spawn: Any) -> None:
    url = server.url + "/admin/faults"
    body = {"kind": "errors", "ttl_s": 5}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        assert requests.get(url, headers=headers, timeout=5).status_code == 401
        assert requests.post(url, json=body, headers=headers, timeout=5).status_code == 401
        assert requests.delete(url, headers=headers, timeout=5).status_code == 401
    assert requests.get(url, headers=ADMIN, timeout=5).json() == {"faults": []}
    tokenless: Proc = spawn("canarystack.model", *FAST, admin_token=None)
    resp = requests.post(tokenless.url + "/admin/faults", json=body, headers=ADMIN, timeout=5)
    assert resp.status_code == 401
    assert "CANARYSTACK_ADMIN_TOKEN" in resp.json()["error"]["message"]


def test_listing_remaining_time_gauge_and_logged_changes(server: Proc) -> None:
    headers = {**ADMIN, "x-actor": "gameday-test"}
    resp = requests.post(
        server.url + "/admin/faults",
        headers=headers,
        timeout=5,
        json={"kind": "kernel", "ttl_s": 30, "magnitude": 0.5},
    )
    assert resp.status_code == 201
    fault = resp.json()
    assert fault["kind"] == "kernel" and fault["ttl_s"] == 30
    assert fault["params"] == {"mode": "fp8-kv-scale", "min_prompt_tokens": 2048, "magnitude": 0.5}
    (listed,) = requests.get(server.url + "/admin/faults", headers=ADMIN, timeout=5).json()[
        "faults"
    ]
    assert listed["id"] == fault["id"] and 0 < listed["remaining_s"] <= 30
    metrics = requests.get(server.url + "/metrics", timeout=5).text
    assert 'canarystack_active_faults{kind="kernel"} 1.0' in metrics
    resp = requests.delete(server.url + f"/admin/faults/{fault['id']}", headers=headers, timeout=5)
    assert resp.status_code == 200 and resp.json()["cleared"][0]["id"] == fault["id"]
    assert requests.get(server.url + "/admin/faults", headers=ADMIN, timeout=5).json() == {
        "faults": []
    }
    events = {(e["event"], e.get("actor")) for e in server.log_events() if "fault_id" in e}
    assert ("fault_injected", "gameday-test") in events
    assert ("fault_cleared", "gameday-test") in events


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"kind": "kernel", "ttl_s": 5, "mode": "int4"}, "mode", "fp8-kv-scale"),
        ({"kind": "kernel", "ttl_s": 5, "magnitude": -1}, "magnitude", "greater than"),
        ({"kind": "errors", "ttl_s": 5, "error_kind": "boom"}, "error_kind", "http_500"),
        ({"kind": "errors", "ttl_s": 5, "rate": 1.5}, "rate", "less than"),
        ({"kind": "latency", "ttl_s": 5}, None, "ttft_ms > 0 or itl_multiplier"),
        ({"kind": "crash", "ttl_s": 5, "min_prompt_token": 5}, "min_prompt_token", "Extra"),
        ({"kind": "crash"}, "ttl_s", "needs 'ttl_s'"),
        ({"kind": "crash", "ttl_s": 10_000}, "ttl_s", "<= 600"),
        ({"kind": "oom", "ttl_s": 5}, "kind", "crash, drop_colour, errors, hang, kernel, latency"),
    ],
)
def test_bad_fault_bodies_are_400s_naming_the_field(
    server: Proc, body: dict[str, Any], param: str | None, text: str
) -> None:
    resp = requests.post(server.url + "/admin/faults", json=body, headers=ADMIN, timeout=5)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and text in err["message"]


def test_latency_fault_slows_only_prompts_at_the_threshold(server: Proc) -> None:
    inject(
        server,
        {
            "kind": "latency",
            "ttl_s": 60,
            "ttft_ms": 800,
            "itl_multiplier": 50,
            "min_prompt_tokens": 150,
        },
    )
    body = {"max_tokens": 20, "temperature": 0}
    _, _, short_ttft = stream(
        server, "/v1/completions", {**body, "prompt": SHORT}, {"x-request-id": "lat-short"}
    )
    _, events, long_ttft = stream(
        server, "/v1/completions", {**body, "prompt": LONG}, {"x-request-id": "lat-long"}
    )
    assert len(events) == 20
    assert long_ttft >= 0.8 and short_ttft < 0.5
    long_line, short_line = done_line(server, "lat-long"), done_line(server, "lat-short")
    # 19 gaps of 0.2 ms x 50 (+-5 % jitter) after the first token: >= 0.18 s.
    assert long_line["e2e_s"] - long_line["ttft_s"] >= 0.18
    assert short_line["e2e_s"] - short_line["ttft_s"] < 0.15


def test_errors_fault_rate_is_a_statistic(server: Proc) -> None:
    inject(server, {"kind": "errors", "ttl_s": 60, "rate": 0.3, "error_kind": "http_500"})
    session = requests.Session()

    def one(i: int) -> requests.Response:
        return session.post(
            server.url + "/v1/completions", timeout=10, json={"prompt": f"p {i}", "max_tokens": 1}
        )

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(one, range(200)))
    failed = [r for r in responses if r.status_code == 500]
    assert {r.status_code for r in responses} == {200, 500}
    assert 0.18 <= len(failed) / len(responses) <= 0.42  # 0.3 +- ~4 standard deviations
    err = failed[0].json()["error"]
    assert err["type"] == "server_error" and "errors" in err["message"]
    assert failed[0].headers["x-model-version"] == "v2"
    logged = [e for e in request_done_lines(server) if e["error"] == "fault_http_500"]
    assert len(logged) == len(failed)


def test_errors_fault_respects_its_threshold_and_503(server: Proc) -> None:
    inject(
        server, {"kind": "errors", "ttl_s": 60, "error_kind": "http_503", "min_prompt_tokens": 150}
    )
    assert post(server, "/v1/completions", {"prompt": SHORT, "max_tokens": 2}).status_code == 200
    resp = post(server, "/v1/completions", {"prompt": LONG, "max_tokens": 2})
    assert resp.status_code == 503
    assert resp.json()["error"]["type"] == "service_unavailable"


def test_truncate_cuts_the_stream_and_the_body(server: Proc) -> None:
    inject(server, {"kind": "errors", "ttl_s": 60, "error_kind": "truncate"})
    raw, exc = raw_stream(server, {"prompt": SHORT, "max_tokens": 10})
    assert b"[DONE]" not in raw
    assert exc is not None  # the connection broke: no terminating chunk
    events = parse_sse(raw, require_done=False) if raw else []
    assert 1 <= len(events) < 10
    assert all(ev["choices"][0]["finish_reason"] is None for ev in events)
    with pytest.raises(requests.RequestException):
        requests.post(
            server.url + "/v1/completions", timeout=10, json={"prompt": SHORT, "max_tokens": 10}
        ).json()


def test_empty_completions(server: Proc) -> None:
    inject(server, {"kind": "errors", "ttl_s": 60, "error_kind": "empty"})
    body = {"prompt": SHORT, "max_tokens": 10, "stream_options": {"include_usage": True}}
    _, events, _ = stream(server, "/v1/completions", body)
    (last, usage) = events
    assert last["choices"][0]["text"] == "" and last["choices"][0]["finish_reason"] == "stop"
    assert usage["usage"]["completion_tokens"] == 0
    chat = post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    ).json()
    assert chat["choices"][0]["message"]["content"] == ""
    assert chat["usage"]["completion_tokens"] == 0


def test_crash_exits_137_only_at_the_threshold_and_restarts_clean(spawn: Any) -> None:
    proc: Proc = spawn("canarystack.model", "--version", "v2", *FAST)
    inject(proc, {"kind": "crash", "ttl_s": 60, "min_prompt_tokens": 150})
    assert post(proc, "/v1/completions", {"prompt": SHORT, "max_tokens": 2}).status_code == 200
    with pytest.raises(requests.ConnectionError):
        post(proc, "/v1/completions", {"prompt": LONG, "max_tokens": 2})
    wait_for(lambda: proc.popen.poll() is not None, timeout=10, what="the crash")
    assert proc.popen.returncode == 137
    assert any(e.get("event") == "crash_fault" for e in proc.log_events())
    again: Proc = spawn("canarystack.model", "--version", "v2", *FAST, port=proc.port)
    assert requests.get(again.url + "/admin/faults", headers=ADMIN, timeout=5).json() == {
        "faults": []
    }
    assert post(again, "/v1/completions", {"prompt": LONG, "max_tokens": 2}).status_code == 200


def _effect(kind: str, proc: Proc, healthy: Any) -> bool:
    """Whether fault ``kind`` (as injected below) acts on a long prompt right now."""
    if kind == "kernel":
        return bool(top_logprobs(proc, LONG) != healthy)
    if kind == "latency":
        return stream(proc, "/v1/completions", {"prompt": LONG, "max_tokens": 1})[2] >= 0.6
    if kind == "errors":
        return post(proc, "/v1/completions", {"prompt": LONG, "max_tokens": 1}).status_code == 503
    raise AssertionError(kind)


FAULTS: dict[str, dict[str, Any]] = {
    "kernel": {"min_prompt_tokens": 100, "magnitude": 3},
    "latency": {"ttft_ms": 600},
    "errors": {"error_kind": "http_503"},
    "crash": {"min_prompt_tokens": 100},
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_every_fault_expires_by_its_ttl(server: Proc, kind: str) -> None:
    healthy = top_logprobs(server, LONG)
    fault = inject(server, {"kind": kind, "ttl_s": 1.0, **FAULTS[kind]})
    t0 = time.monotonic()
    if kind != "crash":  # the crash's effect is the test above; here it must not fire late
        assert _effect(kind, server, healthy)
    wait_for(
        lambda: (
            requests.get(server.url + "/admin/faults", headers=ADMIN, timeout=5).json()
            == {"faults": []}
        ),
        timeout=10,
        what=f"{kind} fault to expire",
    )
    assert time.monotonic() - t0 >= 0.9
    if kind == "crash":
        assert post(server, "/v1/completions", {"prompt": LONG, "max_tokens": 1}).ok
        assert server.alive()
    else:
        assert not _effect(kind, server, healthy)
    wait_for(
        lambda: any(
            e.get("event") == "fault_expired" and e.get("fault_id") == fault["id"]
            for e in server.log_events()
        ),
        timeout=5,
        what="fault_expired log line",
    )
