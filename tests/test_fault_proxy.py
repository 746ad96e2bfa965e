"""The fault proxy (``python -m gameday.faultproxy``) as a real process in front of a real
simulator (``canarystack.model``), both on free loopback ports and stopped by PID: bytes
pass untouched with no fault, each fault kind does what it says, the admin API keeps the
stack's ``/admin/faults`` contract, and a kernel fault's drift has the stated size.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from gameday.faultproxy.cli import fault_proxy_cmd
from gameday.faultproxy.drift import drifted, flip_share, target_kl
from gameday.load.prompts import make_prompt
from tests.model_helpers import FAST, parse_sse
from tests.procs import Proc, Spawner, StopWaiting, stopping, wait_for

pytestmark = pytest.mark.timeout(180)

TOKEN = "proxy-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "x-actor": "test"}
LONG = 2100  # prompt words: above the kernel fault's default 2048
SHORT = 12
# Headers each server writes for its own hop.
OWN_HEADERS = {"date", "server", "content-length", "transfer-encoding", "connection", "keep-alive"}


def start_proxy(spawn: Spawner, upstream: str, *args: str) -> Proc:
    """``python -m gameday.faultproxy`` on a free loopback port in front of ``upstream``."""
    tmp = spawn.tmp_path
    n = len(spawn.procs)
    token_file = tmp / f"proxy-{n}.token"
    token_file.write_text(TOKEN + "\n")
    ready = tmp / f"proxy-{n}.ready.json"
    log_path = tmp / f"proxy-{n}.log"
    cmd = [
        sys.executable, "-m", "gameday.faultproxy",
        "--upstream", upstream,
        "--listen", "127.0.0.1:0",
        "--token-file", str(token_file),
        "--ready-file", str(ready),
        *args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc = Proc(popen=popen, port=0, log_path=log_path)
    spawn.procs.append(proc)

    def ready_port() -> int | None:
        if popen.poll() is not None:
            raise StopWaiting(f"the fault proxy exited with {popen.returncode}: {proc.log()}")
        return int(json.loads(ready.read_text())["port"]) if ready.exists() else None

    proc.port = int(wait_for(ready_port, timeout=20, what="the fault proxy to listen"))  # type: ignore[call-overload]
    return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """(the simulator, the proxy in front of it) for the module."""
    with stopping(Spawner(tmp_path_factory.mktemp("fault-proxy"))) as spawn:
        model = spawn("canarystack.model", "--version", "v2", *FAST)
        yield model, start_proxy(spawn, model.url)


@pytest.fixture
def model(stack: tuple[Proc, Proc]) -> Proc:
    return stack[0]


@pytest.fixture
def proxy(stack: tuple[Proc, Proc]) -> Iterator[Proc]:
    """The module's proxy, its faults cleared before and after the test."""
    url = stack[1].url + "/admin/faults"
    assert requests.delete(url, headers=AUTH, timeout=10).status_code == 200
    yield stack[1]
    requests.delete(url, headers=AUTH, timeout=10)


def inject(proxy: Proc, fault: Mapping[str, Any]) -> dict[str, Any]:
    resp = requests.post(proxy.url + "/admin/faults", json=dict(fault), headers=AUTH, timeout=10)
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def completion(words: int, **extra: Any) -> dict[str, Any]:
    body = {"model": "default", "prompt": make_prompt(words, seed=3), "max_tokens": 8}
    return {**body, "temperature": 0, **extra}


def chat(words: int, **extra: Any) -> dict[str, Any]:
    # The role marker is one token: content one word shorter makes ``words`` in all.
    messages = [{"role": "user", "content": make_prompt(words - 1, seed=4)}]
    return {"model": "default", "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def raw_post(
    proc: Proc, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> requests.Response:
    resp = requests.post(
        proc.url + path, json=dict(body), headers=dict(headers or {}), stream=True, timeout=30
    )
    resp.raw.decode_content = False
    return resp


def read_all(resp: requests.Response) -> tuple[bytes, bool]:
    """Every byte of an answer, and whether it ended cleanly (not cut)."""
    data = b""
    try:
        for chunk in resp.iter_content(chunk_size=None):
            data += chunk
    except requests.exceptions.ChunkedEncodingError:
        return data, False
    return data, True


def loads(raw: bytes) -> Any:
    return json.loads(raw)  # Python's json reads NaN / -Infinity, as a lenient client does


def events(raw: bytes) -> list[dict[str, Any]]:
    return [loads(b[6:]) for b in raw.split(b"\n\n") if b.startswith(b"data: {")]


def kl_topk(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """KL(p || q) over the same top-k tokens, each renormalised over them."""
    assert set(p) == set(q), (sorted(p), sorted(q))
    zp = math.log(sum(math.exp(v) for v in p.values()))
    zq = math.log(sum(math.exp(v) for v in q.values()))
    return sum(math.exp(v - zp) * ((v - zp) - (q[t] - zq)) for t, v in p.items())


def same_answer(
    model: Proc, proxy: Proc, path: str, body: Mapping[str, Any], request_id: str
) -> tuple[requests.Response, bytes, requests.Response, bytes]:
    """The same request direct and through the proxy, retried (a few times at most) until
    both answers carry the same ``created`` second."""
    for attempt in range(5):
        headers = {"x-request-id": f"{request_id}-{attempt}"}
        direct = raw_post(model, path, body, headers)
        d_raw, _ = read_all(direct)
        proxied = raw_post(proxy, path, body, headers)
        p_raw, _ = read_all(proxied)
        created = [
            loads(r.split(b"\n\n")[0].removeprefix(b"data: "))["created"] for r in (d_raw, p_raw)
        ]
        if created[0] == created[1]:
            return direct, d_raw, proxied, p_raw
    raise AssertionError("the two answers never fell in the same second")


def headers_of(resp: requests.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in resp.headers.items() if k.lower() not in OWN_HEADERS}


# -- pass-through -----------------------------------------------------------------------------
def test_with_no_fault_answers_pass_through_byte_for_byte(model: Proc, proxy: Proc) -> None:
    cases = [
        ("/v1/completions", completion(SHORT, logprobs=3)),
        ("/v1/chat/completions", chat(SHORT, stream=True, logprobs=True, top_logprobs=3)),
        (
            "/v1/completions",
            completion(LONG, stream=True, stream_options={"include_usage": True}),
        ),
    ]
    for i, (path, body) in enumerate(cases):
        direct, d_raw, proxied, p_raw = same_answer(model, proxy, path, body, f"pass-{i}")
        assert proxied.status_code == direct.status_code == 200
        assert p_raw == d_raw, path
        assert headers_of(proxied) == headers_of(direct)
    # The simulator at temperature 0 is deterministic: the comparison above means something.
    assert b'"text":"' in d_raw


def test_every_other_path_goes_to_the_upstream(model: Proc, proxy: Proc) -> None:
    models = requests.get(proxy.url + "/v1/models", timeout=10)
    assert models.content == requests.get(model.url + "/v1/models", timeout=10).content
    assert requests.get(proxy.url + "/health", timeout=10).json()["component"] == "model"
    metrics = requests.get(proxy.url + "/metrics", timeout=10).text
    assert "vllm:e2e_request_latency_seconds_count" in metrics
    assert "vllm:num_requests_running" in metrics
    refused = requests.post(proxy.url + "/v1/completions", json={"prompt": 3}, timeout=10)
    assert refused.status_code == 400  # the upstream's own answer, passed back
    own = requests.get(proxy.url + "/admin/health", timeout=10).json()
    assert own["status"] == "ok" and own["upstream"] == model.url


# -- latency ----------------------------------------------------------------------------------
def test_a_latency_fault_adds_at_least_its_delays(proxy: Proc) -> None:
    inject(proxy, {"kind": "latency", "ttl_s": 60, "ttft_ms": 300})
    t0 = time.monotonic()
    resp = requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=30)
    assert resp.status_code == 200 and time.monotonic() - t0 >= 0.3
    inject(proxy, {"kind": "latency", "ttl_s": 60, "itl_ms": 50})
    t0 = time.monotonic()
    raw, clean = read_all(raw_post(proxy, "/v1/completions", completion(SHORT, stream=True)))
    assert clean and raw.endswith(b"data: [DONE]\n\n")
    assert time.monotonic() - t0 >= 7 * 0.05  # 8 token events, 7 gaps
    assert len(parse_sse(raw)) == 8


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,status", [("http_500", 500), ("http_503", 503)])
def test_an_errors_fault_answers_its_status(proxy: Proc, kind: str, status: int) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60, "error_kind": kind})
    resp = requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=30)
    assert resp.status_code == status
    assert resp.json()["error"]["code"] == "simulated_fault"


def test_error_body_is_a_200_carrying_an_openai_error(proxy: Proc) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60, "error_kind": "error_body"})
    resp = requests.post(proxy.url + "/v1/chat/completions", json=chat(SHORT), timeout=30)
    assert resp.status_code == 200 and resp.json()["error"]["type"] == "server_error"
    raw, _ = read_all(raw_post(proxy, "/v1/completions", completion(SHORT, stream=True)))
    (event,) = parse_sse(raw)
    assert set(event) == {"error"}


def test_empty_is_a_completion_without_tokens(proxy: Proc) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60, "error_kind": "empty"})
    body = requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=30).json()
    assert body["choices"][0]["text"] == "" and body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == SHORT  # the simulator's rule: one word, one token
    stream = chat(SHORT, stream=True, stream_options={"include_usage": True})
    found = parse_sse(read_all(raw_post(proxy, "/v1/chat/completions", stream))[0])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in found if e["choices"]) == ""
    assert found[-1]["usage"] == {
        "prompt_tokens": SHORT,
        "total_tokens": SHORT,
        "completion_tokens": 0,
    }


def test_truncate_cuts_a_stream_half_way_without_done(model: Proc, proxy: Proc) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60, "error_kind": "truncate"})
    raw, clean = read_all(raw_post(proxy, "/v1/completions", completion(SHORT, stream=True)))
    assert not clean and b"[DONE]" not in raw
    assert len(events(raw)) == 4  # half of max_tokens 8
    resp = raw_post(proxy, "/v1/completions", completion(SHORT))
    with pytest.raises(requests.exceptions.RequestException):
        resp.content  # noqa: B018 - reading the cut body raises


def test_the_error_rate_is_drawn_from_the_faults_own_seed(proxy: Proc) -> None:
    def outcomes() -> list[int]:
        inject(proxy, {"kind": "errors", "ttl_s": 60, "rate": 0.5, "seed": 7})
        return [
            requests.post(
                proxy.url + "/v1/completions", json=completion(SHORT), timeout=30
            ).status_code
            for _ in range(12)
        ]

    first = outcomes()
    assert first == outcomes()  # the newer fault replaced the older: the sequence restarts
    assert set(first) == {200, 500}


def test_min_prompt_tokens_spares_shorter_prompts(proxy: Proc) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60, "min_prompt_tokens": 100})
    short = requests.post(proxy.url + "/v1/chat/completions", json=chat(99), timeout=30)
    long = requests.post(proxy.url + "/v1/chat/completions", json=chat(100), timeout=30)
    assert (short.status_code, long.status_code) == (200, 500)


# -- hang -------------------------------------------------------------------------------------
def test_a_hang_sends_headers_and_one_event_then_silence_until_its_ttl(proxy: Proc) -> None:
    inject(proxy, {"kind": "hang", "ttl_s": 1, "mode": "headers_then_silence"})
    resp = raw_post(proxy, "/v1/chat/completions", chat(SHORT, stream=True))
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    raw, clean = read_all(resp)  # ends when the fault does
    assert not clean and b"[DONE]" not in raw
    (event,) = events(raw)
    assert event["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_a_trickling_hang_sends_comments_and_never_done(proxy: Proc) -> None:
    inject(proxy, {"kind": "hang", "ttl_s": 1, "mode": "trickle", "interval_s": 0.1})
    raw, clean = read_all(raw_post(proxy, "/v1/completions", completion(SHORT, stream=True)))
    assert not clean and b"[DONE]" not in raw
    assert len(events(raw)) == 1 and raw.count(b": fault-proxy hang\n\n") >= 3


def test_a_hang_never_answers_a_plain_request_while_it_lasts(proxy: Proc) -> None:
    fault = inject(proxy, {"kind": "hang", "ttl_s": 60})
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=(5, 0.5))
    url = f"{proxy.url}/admin/faults/{fault['id']}"
    assert requests.delete(url, headers=AUTH, timeout=10).status_code == 200
    resp = requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=30)
    assert resp.status_code == 200


# -- kernel -----------------------------------------------------------------------------------
def test_drifted_moves_the_top_k_by_exactly_the_stated_kl() -> None:
    lps = [-0.4, -1.7, -2.2, -3.0, -5.5]
    tokens = ["a", "b", "c", "d", "e"]
    for magnitude in (0.5, 1.0, 3.0):
        for pos in range(20):
            new = drifted(lps, tokens, target_kl(magnitude), seed=1, pos=pos)
            kl = kl_topk(dict(zip(tokens, lps, strict=True)), dict(zip(tokens, new, strict=True)))
            assert kl == pytest.approx(0.05 * magnitude**2, rel=1e-6)
            # the candidates keep their total probability
            assert sum(map(math.exp, new)) == pytest.approx(sum(map(math.exp, lps)))
    assert flip_share(1.0) == pytest.approx(0.1) and flip_share(20) == 0.5


def completion_positions(body: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    lp = body["choices"][0]["logprobs"]
    return list(zip(lp["tokens"], lp["top_logprobs"], strict=True))


def test_a_kernel_fault_drifts_long_prompts_by_the_stated_size(model: Proc, proxy: Proc) -> None:
    body = completion(LONG, logprobs=5, max_tokens=64)
    direct = requests.post(model.url + "/v1/completions", json=body, timeout=30).json()
    inject(proxy, {"kind": "kernel", "ttl_s": 60})
    drifted_body = requests.post(proxy.url + "/v1/completions", json=body, timeout=30).json()
    before, after = completion_positions(direct), completion_positions(drifted_body)
    flipped = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a[0] != b[0]]
    kls = [kl_topk(a[1], b[1]) for a, b in zip(before, after, strict=True)]
    for i, kl in enumerate(kls):
        if i not in flipped:
            assert kl == pytest.approx(0.05, rel=1e-6)
    assert 0 < len(flipped) <= 0.3 * len(before)  # 10 % at magnitude 1
    assert sum(kls) / len(kls) > 0.05
    assert drifted_body["choices"][0]["text"] != direct["choices"][0]["text"]
    assert drifted_body["choices"][0]["text"] == "".join(t for t, _ in after)

    # Below min_prompt_tokens nothing changes: the same bytes as direct.
    short = completion(SHORT, logprobs=5)
    _, d_raw, _, p_raw = same_answer(model, proxy, "/v1/completions", short, "kernel-short")
    assert p_raw == d_raw


def test_a_kernel_fault_drifts_a_streamed_chat_and_grows_with_magnitude(
    model: Proc, proxy: Proc
) -> None:
    body = chat(LONG, stream=True, logprobs=True, top_logprobs=5, max_tokens=48)

    def positions(raw: bytes) -> list[tuple[str, dict[str, float]]]:
        out = []
        for event in parse_sse(raw):
            for c in event["choices"]:
                for entry in (c.get("logprobs") or {}).get("content", []):
                    top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
                    out.append((entry["token"], top))
        return out

    direct = positions(read_all(raw_post(model, "/v1/chat/completions", body))[0])
    medians = []
    for magnitude in (1.0, 2.0):
        inject(proxy, {"kind": "kernel", "ttl_s": 60, "magnitude": magnitude})
        after = positions(read_all(raw_post(proxy, "/v1/chat/completions", body))[0])
        assert len(after) == len(direct) == 48
        kls = sorted(kl_topk(a[1], b[1]) for a, b in zip(direct, after, strict=True))
        medians.append(kls[len(kls) // 2])
    assert medians[0] == pytest.approx(0.05, rel=1e-4)
    assert medians[1] == pytest.approx(0.2, rel=1e-4)


def test_broken_kernels_write_what_a_broken_engine_writes(model: Proc, proxy: Proc) -> None:
    body = completion(LONG, logprobs=3)
    direct = requests.post(model.url + "/v1/completions", json=body, timeout=30).json()

    inject(proxy, {"kind": "kernel", "ttl_s": 60, "mode": "nan-logits"})
    raw = requests.post(proxy.url + "/v1/completions", json=body, timeout=30).content
    assert b"NaN" in raw
    lp = loads(raw)["choices"][0]["logprobs"]
    assert all(math.isnan(v) for v in lp["token_logprobs"])
    assert all(math.isnan(v) for top in lp["top_logprobs"] for v in top.values())

    inject(proxy, {"kind": "kernel", "ttl_s": 60, "mode": "inf-logits", "min_prompt_tokens": 0})
    stream = chat(SHORT, stream=True, logprobs=True, top_logprobs=2)
    raw, _ = read_all(raw_post(proxy, "/v1/chat/completions", stream))
    assert b"-Infinity" in raw
    entries = [
        e
        for ev in events(raw)
        for c in ev["choices"]
        for e in (c["logprobs"] or {}).get("content", [])
    ]
    assert entries and all(e["logprob"] == -math.inf for e in entries)

    inject(proxy, {"kind": "kernel", "ttl_s": 60, "mode": "garbage"})
    garbage = requests.post(proxy.url + "/v1/completions", json=body, timeout=30).json()
    assert garbage["choices"][0]["logprobs"] is None
    assert garbage["choices"][0]["text"] != direct["choices"][0]["text"]
    assert len(garbage["choices"][0]["text"].split()) == len(direct["choices"][0]["text"].split())


# -- the admin API ----------------------------------------------------------------------------
def test_a_fault_expires_after_its_ttl(proxy: Proc) -> None:
    fault = inject(proxy, {"kind": "latency", "ttl_s": 0.3, "ttft_ms": 1})
    assert fault["remaining_s"] > 0

    def gone() -> bool:
        listed = requests.get(proxy.url + "/admin/faults", headers=AUTH, timeout=10).json()
        return listed["faults"] == []

    wait_for(gone, timeout=10, what="the fault to expire")
    url = f"{proxy.url}/admin/faults/{fault['id']}"
    assert requests.delete(url, headers=AUTH, timeout=10).status_code == 404
    expired = [e for e in proxy.log_events() if e.get("event") == "fault_expired"]
    assert fault["id"] in {e["fault_id"] for e in expired}


def test_a_newer_fault_replaces_the_older_one_of_its_kind(proxy: Proc) -> None:
    older = inject(proxy, {"kind": "latency", "ttl_s": 60, "ttft_ms": 5})
    newer = inject(proxy, {"kind": "latency", "ttl_s": 60, "params": {"ttft_ms": 7}})
    assert newer["replaced"] == [older["id"]]
    listed = requests.get(proxy.url + "/admin/faults", headers=AUTH, timeout=10).json()["faults"]
    assert [(f["id"], f["params"]["ttft_ms"]) for f in listed] == [(newer["id"], 7.0)]
    url = f"{proxy.url}/admin/faults/{older['id']}"
    assert requests.delete(url, headers=AUTH, timeout=10).status_code == 404
    events_seen = {e.get("event") for e in proxy.log_events()}
    assert {"fault_injected", "fault_replaced", "fault_cleared"} <= events_seen


def test_the_cap_refuses_one_fault_too_many(spawn: Spawner, model: Proc) -> None:
    capped = start_proxy(spawn, model.url, "--max-faults", "2")
    inject(capped, {"kind": "latency", "ttl_s": 60, "ttft_ms": 1})
    inject(capped, {"kind": "errors", "ttl_s": 60, "rate": 0})
    resp = requests.post(
        capped.url + "/admin/faults", json={"kind": "hang", "ttl_s": 60}, headers=AUTH, timeout=10
    )
    assert resp.status_code == 429 and "--max-faults 2" in resp.json()["error"]["message"]
    inject(capped, {"kind": "latency", "ttl_s": 60, "ttft_ms": 2})  # a replacement fits


def test_the_admin_api_needs_the_token(proxy: Proc) -> None:
    url = proxy.url + "/admin/faults"
    body = {"kind": "latency", "ttl_s": 60, "ttft_ms": 1}
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.post(url, json=body, timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.post(url, json=body, headers=wrong, timeout=10).status_code == 401
    assert requests.delete(url, headers=wrong, timeout=10).status_code == 401
    assert requests.delete(url + "/abc", timeout=10).status_code == 401
    assert requests.delete(url + "/abc", headers=AUTH, timeout=10).status_code == 404
    assert requests.get(url, headers=AUTH, timeout=10).json() == {"faults": []}


@pytest.mark.parametrize(
    "body,status,says",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"", 400, "empty"),
        (b'{"kind": "melt", "ttl_s": 5}', 400, "errors, hang, kernel, latency"),
        (b'{"kind": "latency", "ttft_ms": 5}', 400, "ttl_s"),
        (b'{"kind": "latency", "ttl_s": 99999, "ttft_ms": 5}', 400, "<= 3600"),
        (b'{"kind": "latency", "ttl_s": 5, "ttft_msec": 5}', 400, "ttft_msec"),
        (b'{"kind": "errors", "ttl_s": 5, "rate": 2}', 400, "rate"),
        (b'{"kind": "kernel", "ttl_s": 5, "mode": "melt"}', 400, "mode"),
        (b'{"kind": "latency", "ttl_s": 5, "ttl_s": 6, "ttft_ms": 1}', 400, "twice"),
        (b'{"kind": "hang", "ttl_s": 5, "params": 3}', 400, "params"),
        (b'{"kind": "latency", "ttl_s": 5, "ttft_ms": NaN}', 400, "JSON"),
        (b'{"pad": "' + b"x" * 20_000 + b'"}', 413, "too large"),
    ],
)
def test_bad_admin_input_gets_a_4xx_that_says_why(
    proxy: Proc, body: bytes, status: int, says: str
) -> None:
    resp = requests.post(
        proxy.url + "/admin/faults",
        data=body,
        headers={**AUTH, "content-type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == status, resp.text
    assert says in resp.json()["error"]["message"]


def test_the_proxy_counts_what_it_did(proxy: Proc) -> None:
    inject(proxy, {"kind": "errors", "ttl_s": 60})
    requests.post(proxy.url + "/v1/completions", json=completion(SHORT), timeout=30)
    text = requests.get(proxy.url + "/admin/metrics", timeout=10).text
    assert 'fault_proxy_faults_applied_total{kind="errors"}' in text
    assert 'fault_proxy_active_faults{kind="errors"} 1.0' in text
    assert 'fault_proxy_requests_total{route="completion"}' in text


# -- the command line -------------------------------------------------------------------------
def test_the_command_line_refuses_bad_input_saying_what_to_do(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    base = ["--upstream", "http://127.0.0.1:9", "--token-file", str(token)]
    runner = CliRunner()
    out = runner.invoke(fault_proxy_cmd, [*base, "--listen", "0.0.0.0:9000"])
    assert out.exit_code != 0 and "--allow-non-loopback" in out.output
    out = runner.invoke(fault_proxy_cmd, [*base, "--listen", "9000"])
    assert out.exit_code != 0 and "HOST:PORT" in out.output
    out = runner.invoke(
        fault_proxy_cmd,
        ["--upstream", "ftp://x", "--listen", "127.0.0.1:0", "--token-file", str(token)],
    )
    assert out.exit_code != 0 and "http(s) URL" in out.output
    out = runner.invoke(
        fault_proxy_cmd,
        ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"],
        env={"GAMEDAY_FAULT_PROXY_TOKEN": ""},
    )
    assert out.exit_code != 0 and "GAMEDAY_FAULT_PROXY_TOKEN" in out.output
    missing = str(tmp_path / "nope")
    out = runner.invoke(
        fault_proxy_cmd,
        ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--token-file", missing],
    )
    assert out.exit_code != 0 and "cannot read it" in out.output
    out = runner.invoke(fault_proxy_cmd, [*base, "--listen", "127.0.0.1:0", "--max-faults", "0"])
    assert out.exit_code != 0 and "--max-faults" in out.output


def test_gameday_has_the_fault_proxy_subcommand() -> None:
    from gameday.cli import _register, cli

    _register()
    out = CliRunner().invoke(cli, ["fault-proxy", "--help"])
    assert out.exit_code == 0 and "--upstream" in out.output
