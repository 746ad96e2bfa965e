"""The load users' HTTP client against a real model server: measurements and error kinds.

The client (gameday.load.client) runs here in the test process on gevent sockets without
monkey-patching anything; the model server is a real process. One raw-socket server (a
true edge: a server that sends headers and a role chunk at once and content later) shows
that TTFT is the first *content*, not the response headers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gameday.load.client import OpenAIClient
from tests.procs import ADMIN_TOKEN, Proc, Spawner, free_port, inject_fault, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FAST = ("--ttft-base-ms", "5", "--prefill-ms-per-1k", "10", "--itl-ms", "1")


def body(n_words: int = 20, max_tokens: int = 8, stream: bool = True) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "default",
        "prompt": " ".join(["ka"] * n_words),
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


@pytest.fixture
def model(spawn: Spawner) -> Iterator[Proc]:
    yield spawn("canarystack.model", "--version", "v1", *FAST)


def request_done(proc: Proc, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for e in proc.log_events():
            if e.get("event") == "request_done" and e.get("request_id") == request_id:
                return e
        return None

    return wait_for(find, timeout=5, what=f"request_done {request_id}")  # type: ignore[return-value]


def test_stream_measures_ttft_gaps_usage_and_headers(model: Proc) -> None:
    client = OpenAIClient(model.url, timeout_s=10)
    a = client.new_attempt("/v1/completions", stream=True)
    client.send(a, body(n_words=300, max_tokens=12))
    client.close()
    assert a.ok and a.status == 200 and a.error_kind is None
    m = a.measurement
    assert m is not None and m.done and len(m.content_times) == 12
    assert (m.prompt_tokens, m.completion_tokens) == (300, 12)
    assert a.ttft_s is not None and a.e2e_s is not None and 0 < a.ttft_s < a.e2e_s
    mean, p99, mx = m.itl()
    assert mean is not None and p99 is not None and mx is not None and 0 < mean <= p99 <= mx
    assert a.headers.get("x-model-version") == "v1" and "x-served-by" not in a.headers
    server = request_done(model, a.request_id)  # the client's x-request-id reached it
    # not before the server's first write (the server stamps after the write returns, so
    # a busy CPU can put its stamp a little after the client's read)
    assert a.ttft_s >= server["ttft_s"] - 0.005


def test_non_streamed_request(model: Proc) -> None:
    client = OpenAIClient(model.url, timeout_s=10)
    a = client.new_attempt("/v1/chat/completions", stream=False)
    client.send(
        a,
        {
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": False,
        },
    )
    assert a.ok and a.measurement is not None and a.measurement.completion_tokens == 3
    assert a.ttft_s == pytest.approx(a.e2e_s)


@pytest.mark.parametrize(
    ("fault_kind", "error_kind", "status"),
    [
        ("http_503", "http_status", 503),
        ("truncate", "broken_stream", 200),
        ("empty", "empty_completion", 200),
    ],
)
def test_error_kinds_from_the_servers_own_faults(
    model: Proc, fault_kind: str, error_kind: str, status: int
) -> None:
    inject_fault(model.url, {"kind": "errors", "ttl_s": 30, "rate": 1.0, "error_kind": fault_kind})
    client = OpenAIClient(model.url, timeout_s=10)
    a = client.new_attempt("/v1/completions", stream=True)
    client.send(a, body(max_tokens=16))
    assert (a.error_kind, a.status, a.ok) == (error_kind, status, False), a.error_detail
    assert a.e2e_s is not None
    # the connection is usable again (or replaced) for the next request
    requests.delete(model.url + "/admin/faults", headers=ADMIN, timeout=5)
    b = client.new_attempt("/v1/completions", stream=True)
    client.send(b, body(max_tokens=4))
    assert b.ok, b.error_detail


def test_connect_error_and_timeout(model: Proc) -> None:
    client = OpenAIClient(f"http://127.0.0.1:{free_port()}", timeout_s=5, connect_timeout_s=2)
    a = client.new_attempt("/v1/completions", stream=True)
    client.send(a, body())
    assert (
        a.error_kind == "connect" and a.status == 0 and "refused" in (a.error_detail or "").lower()
    )
    inject_fault(model.url, {"kind": "latency", "ttl_s": 30, "ttft_ms": 3000})
    slow = OpenAIClient(model.url, timeout_s=0.3)
    t0 = time.monotonic()
    b = slow.new_attempt("/v1/completions", stream=True)
    slow.send(b, body())
    assert b.error_kind == "timeout" and time.monotonic() - t0 < 2.0


def serve_role_then_content(sock: socket.socket, delay_s: float, cut: bool) -> None:
    conn, _ = sock.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

        def send_chunk(data: bytes) -> None:
            conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))

        send_chunk(b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n')
        time.sleep(delay_s)
        send_chunk(b'data: {"choices":[{"index":0,"delta":{"content":" ka"}}]}\n\n')
        if cut:
            return  # the connection closes without [DONE] and without the last chunk
        send_chunk(b"data: [DONE]\n\n")
        conn.sendall(b"0\r\n\r\n")


@pytest.mark.parametrize("cut", [False, True])
def test_ttft_is_first_content_not_headers_and_a_cut_stream_is_broken(cut: bool) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    t = threading.Thread(target=serve_role_then_content, args=(sock, 0.3, cut), daemon=True)
    t.start()
    client = OpenAIClient(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout_s=5)
    a = client.new_attempt("/v1/chat/completions", stream=True)
    client.send(a, {"model": "m", "messages": [], "stream": True})
    t.join(5)
    sock.close()
    assert a.ttft_s is not None and a.ttft_s >= 0.29  # not the ~1 ms header time
    if cut:
        assert a.error_kind == "broken_stream" and not a.ok
    else:
        assert a.ok and a.measurement is not None and a.measurement.done


def test_every_request_is_coloured_with_its_own_trace_and_the_tag(model: Proc) -> None:
    client = OpenAIClient(model.url, timeout_s=10)
    attempts = [client.new_attempt("/v1/completions", stream=True) for _ in range(2)]
    for a in attempts:
        client.send(a, body(max_tokens=2))
    client.close()
    assert all(a.ok for a in attempts)
    hops = requests.get(model.url + "/v1/colour/hops", headers=ADMIN, timeout=5).json()["hops"]
    seen = {h["request_id"]: h for h in hops if h["hop"] == "model"}
    got = [seen[a.request_id] for a in attempts]
    assert [h["tag"] for h in got] == ["gameday", "gameday"]
    assert got[0]["trace_id"] != got[1]["trace_id"]  # a trace per request


def test_the_served_variant_is_read_from_the_header_a_target_names(model: Proc) -> None:
    # A foreign router that says the version, not the variant (kind: external, variant:
    # {header: x-model-version, values: {v1: baseline}}): the record says baseline.
    client = OpenAIClient(
        model.url, timeout_s=10, variant_header="x-model-version", variant_values={"v1": "baseline"}
    )
    a = client.new_attempt("/v1/completions", stream=True)
    client.send(a, body(max_tokens=2))
    unmapped = OpenAIClient(model.url, timeout_s=10, variant_header="x-model-version")
    b = unmapped.new_attempt("/v1/completions", stream=True)
    unmapped.send(b, body(max_tokens=2))
    absent = OpenAIClient(model.url, timeout_s=10, variant_header="x-no-such-header")
    c = absent.new_attempt("/v1/completions", stream=True)
    absent.send(c, body(max_tokens=2))
    for cl in (client, unmapped, absent):
        cl.close()
    assert a.headers["x-served-by"] == "baseline"
    assert b.headers["x-served-by"] == "v1"  # no map: the header's value as it is
    assert "x-served-by" not in c.headers  # a router that did not say: unknown
