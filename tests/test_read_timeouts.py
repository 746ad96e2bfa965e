"""Header and body read deadlines on every component (#27, finding 8a).

Raw sockets play the slow clients against real component processes started with short
deadlines (``--header-timeout-s 1 --body-timeout-s 1``): a connection that sends its
request line and headers a byte at a time (slowloris), one that sends nothing, and one that
sends its headers and then its body a byte at a time. Each must be closed within three
times its deadline (a behaviour bound, not a benchmark), while a normal request on another
connection is answered, and a kept-alive connection that waits between two requests is not
taken for a slow one.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from canarystack.common.deadlines import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, IDLE_TIMEOUT_S
from tests import router_support as rs
from tests.procs import ADMIN_TOKEN, Proc, Spawner

DEADLINE_S = 1.0
SHORT = ("--header-timeout-s", str(DEADLINE_S), "--body-timeout-s", str(DEADLINE_S))
BOUND_S = 3 * DEADLINE_S


@pytest.fixture(params=["broker", "router"])
def component(request: pytest.FixtureRequest, spawn: Spawner, tmp_path: Path) -> Proc:
    if request.param == "broker":
        return spawn("canarystack.broker", "--state-dir", str(tmp_path / "broker"), *SHORT)
    # The router serves with its own runner (two ports): it must get the deadlines too.
    return rs.start_router(spawn, tmp_path, ["http://127.0.0.1:9"], None, *SHORT)


def _connect(proc: Proc) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    sock.settimeout(0.05)
    return sock


def _closed(sock: socket.socket, got: bytearray) -> bool:
    """Whether the server has closed ``sock``; what it sent is added to ``got``."""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
            got += chunk
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _trickle_until_closed(sock: socket.socket, data: bytes, limit_s: float) -> tuple[float, bytes]:
    """Send ``data`` a byte every 0.1 s until the server closes: the seconds it took and
    what the server sent; fails past ``limit_s``."""
    t0 = time.monotonic()
    got = bytearray()
    i = 0
    while time.monotonic() - t0 < limit_s:
        if _closed(sock, got):
            return time.monotonic() - t0, bytes(got)
        if i < len(data):
            try:
                sock.sendall(data[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                _closed(sock, got)
                return time.monotonic() - t0, bytes(got)
            i += 1
        time.sleep(0.1)
    raise AssertionError(f"the server kept a slow connection open for {limit_s} s: {got[:200]!r}")


FAULT_BODY = b'{"kind": "latency", "ttl_s": 5}' + b" " * 100


def _fault_head(body: bytes) -> bytes:
    """The request line and headers of a POST /admin/faults carrying ``body``."""
    return (
        b"POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )


def test_the_defaults_are_stated() -> None:
    assert (HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, BODY_TIMEOUT_S) == (10.0, 75.0, 30.0)


def test_slow_headers_are_closed_while_a_normal_request_is_answered(component: Proc) -> None:
    slow_headers = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 200
    results: list[tuple[float, bytes]] = []
    socks = [_connect(component) for _ in range(5)]
    threads = [
        threading.Thread(
            target=lambda s=s: results.append(_trickle_until_closed(s, slow_headers, 10))
        )
        for s in socks
    ]
    silent = _connect(component)  # sends nothing at all
    t0 = time.monotonic()
    for t in threads:
        t.start()
    # While they trickle, a normal client is served on another connection.
    assert requests.get(component.url + "/health", timeout=5).status_code == 200
    for t in threads:
        t.join(15)
    got = bytearray()
    while not _closed(silent, got) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    silent_s = time.monotonic() - t0
    for s in [*socks, silent]:
        s.close()
    assert len(results) == 5
    assert all(took < BOUND_S for took, _ in results), results
    assert all(answer == b"" for _, answer in results)  # closed, no answer to half a request
    assert got == b"" and silent_s < BOUND_S
    assert requests.get(component.url + "/health", timeout=5).status_code == 200


def test_a_slow_body_gets_408_and_is_closed(component: Proc) -> None:
    body = FAULT_BODY
    head = _fault_head(body)
    sock = _connect(component)
    sock.sendall(head)
    took, answer = _trickle_until_closed(sock, body, 10)
    sock.close()
    assert took < BOUND_S + 0.5, took  # the headers' time is the server's, then the body's
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"did not arrive within 1 s" in answer
    assert requests.get(component.url + "/health", timeout=5).status_code == 200


def test_a_kept_alive_connection_may_wait_between_requests(component: Proc) -> None:
    with requests.Session() as session:
        assert session.get(component.url + "/health", timeout=5).status_code == 200
        time.sleep(2 * DEADLINE_S)  # longer than the header deadline, shorter than idle
        first = session.get(component.url + "/health", timeout=5)
        assert first.status_code == 200
    # The same pooled connection served both (it was not closed as a slow one).
    events = [e for e in component.log_events() if e.get("event") == "header_timeout"]
    assert events == []


def test_a_client_that_hangs_up_mid_body_is_its_own_doing_not_a_server_error(
    component: Proc,
) -> None:
    """A mirror that drops its copy (Envoy's request mirroring, seen against the drift
    judge), a user's Ctrl-C: the body stops and the connection closes. That is logged as
    ``body_cut`` (a 400 nobody reads), never ``unhandled_error``, and the next request is
    served."""
    body = FAULT_BODY
    head = _fault_head(body)
    sock = _connect(component)
    sock.sendall(head + body[:10])
    time.sleep(0.3)  # the handler is reading the body
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(e.get("event") == "body_cut" for e in component.log_events()):
            break
        time.sleep(0.05)
    events = [e.get("event") for e in component.log_events()]
    assert "body_cut" in events
    assert "unhandled_error" not in events
    assert requests.get(component.url + "/health", timeout=5).status_code == 200
