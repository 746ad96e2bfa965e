"""No user waits on a broken part (#27 findings 1 and 2): deadlines and caps on streams.

Finding 1: a client that never reads its stream must not hold an engine slot for good (the
router cuts its stream past the write deadline and releases its upstream; the model server
does the same to a client that stops reading it), and per-client and per-pool caps answer
429 above them, naming the cap. Finding 2: a hung canary (the model server's ``hang``
fault: headers and one event, then nothing; or no answer at all) is cancelled at the
router's upstream deadline, and its silence reaches the gate as an error outcome, also
when the client gives up first. Every part is a real process on 127.0.0.1; the gate is
``GateReceiver``, which records what the router pushes. Short deadlines are set by flag.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests import router_support as rs
from tests.procs import Proc, Spawner, inject_fault, wait_for

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture
def gate() -> Iterator[rs.GateReceiver]:
    yield from rs.gate_receiver()


def _post_raw(port: int, body: dict[str, Any], user: str | None = None) -> socket.socket:
    """Send a completion request on a socket with a small receive buffer; read nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    raw = json.dumps({"model": "default", "prompt": PROMPT, **body}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        + (f"x-user-id: {user}\r\n" if user else "")
        + "\r\n"
    )
    sock.sendall(head.encode() + raw)
    return sock


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _closed_by_peer(sock: socket.socket) -> bool:
    """Read what is buffered; True when the peer closed the connection (EOF or reset)."""
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def _running(model: Proc) -> int:
    return int(requests.get(model.url + "/health", timeout=5).json()["running"])


def _outcomes(gate: rs.GateReceiver, error: str) -> list[dict[str, Any]]:
    """The outcomes the router pushed with ``error`` (waiting for the first one)."""

    def pushed() -> list[dict[str, Any]]:
        return [o for o in gate.records("outcomes") if o.get("error") == error]

    wait_for(pushed, what=f"an outcome with error {error}")
    return pushed()


STALLING = {"stream": True, "max_tokens": 16000, "logprobs": 5}


def _stall_until_cut(port: int, model: Proc, who: str) -> None:
    """A never-read stream to ``port``: it holds a slot of ``model`` until ``who`` cuts
    it (the slot is free again and the connection closed)."""
    sock = _post_raw(port, STALLING)
    try:
        wait_for(lambda: _running(model) == 1, what="the stalled stream to hold a slot")
        wait_for(
            lambda: _running(model) == 0,
            timeout=30,
            what=f"{who} to cut the stream of a client that stopped reading",
        )
        assert _closed_by_peer(sock), f"{who} left the stalled client's stream open"
    finally:
        sock.close()


# ------------------------------------------------------------------ finding 1


def test_the_router_cuts_a_stream_its_client_stopped_reading_and_frees_the_slot(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    # 16000 tokens 5 ms apart: ~80 s of generation, unless someone cuts it.
    baseline = rs.start_model(spawn, "v1", "--itl-ms", "5")
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], None, "--client-write-s", "1", gate=gate.url
    )
    _stall_until_cut(_port(router.url), baseline, "the router")
    assert rs.metric(router, "router_client_stalls_total") == 1
    # A client that stopped reading is its own doing: no outcome for the gate.
    assert not [o for o in gate.records("outcomes") if o.get("error") == "client_stalled"]


def test_the_model_server_frees_the_slot_of_a_client_that_stopped_reading(
    spawn: Spawner,
) -> None:
    model = rs.start_model(spawn, "v1", "--itl-ms", "5", "--write-timeout-s", "1")
    _stall_until_cut(_port(model.url), model, "the model server")
    done = [e for e in model.log_events() if e.get("event") == "request_done"]
    assert [e.get("error") for e in done] == ["client_stalled"]


def test_caps_answer_429_per_client_and_per_pool_naming_the_cap(
    spawn: Spawner, tmp_path: Path
) -> None:
    baseline = rs.start_model(spawn, "v1")
    router = rs.start_router(
        spawn,
        tmp_path,
        [baseline.url],
        None,
        "--max-client-streams",
        "2",
        "--max-pool-streams",
        "3",
        "--upstream-idle-s",
        "60",
    )
    # Every request hangs after its first event, so the ones sent stay in flight.
    inject_fault(baseline.url, {"kind": "hang", "ttl_s": 120, "after_events": 1})
    held = [_post_raw(_port(router.url), {"stream": True}, user="u1") for _ in range(2)]
    try:
        wait_for(
            lambda: rs.health(router)["streams"]["in_flight"].get("baseline") == 2,
            what="two streams of x-user-id u1 in flight",
        )
        third = rs.completion(router.url, headers={"x-user-id": "u1"}, stream=True)
        assert third.status_code == 429, third.text
        err = third.json()["error"]
        assert err["code"] == "too_many_client_streams"
        assert "x-user-id 'u1' has 2 in flight" in err["message"]
        assert "--max-client-streams" in err["message"]
        # Another client is not refused for u1's streams: it takes the pool's last place.
        held.append(_post_raw(_port(router.url), {"stream": True}, user="u2"))
        wait_for(lambda: rs.health(router)["streams"]["in_flight"].get("baseline") == 3)
        full = rs.completion(router.url, headers={"x-user-id": "u3"})
        assert full.status_code == 429, full.text
        assert full.json()["error"]["code"] == "too_many_pool_streams"
        assert "--max-pool-streams" in full.json()["error"]["message"]
    finally:
        for sock in held:
            sock.close()
    # Places are given back when the requests end (their clients left).
    wait_for(lambda: rs.health(router)["streams"]["in_flight"].get("baseline") == 0)
    requests.delete(baseline.url + "/admin/faults", headers=rs.ADMIN, timeout=5).raise_for_status()
    assert rs.completion(router.url, headers={"x-user-id": "u1"}).status_code == 200
    assert rs.metric(router, "router_streams_refused_total") == 2


# ------------------------------------------------------------------ finding 2


def _hung_canary(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver, *router_flags: str
) -> tuple[Proc, Proc]:
    """A baseline, a canary whose every answer hangs after one event, and a router that
    sends every unpinned request to the canary (weight 100)."""
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    rs.write_release_cache(tmp_path, weight=100)
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--no-shadow", *router_flags, gate=gate.url
    )
    inject_fault(canary.url, {"kind": "hang", "ttl_s": 120, "after_events": 1})
    return router, canary


def test_a_hung_canary_stream_is_cancelled_at_the_idle_deadline_as_an_error(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    router, canary = _hung_canary(spawn, tmp_path, gate, "--upstream-idle-s", "1")
    with requests.post(
        router.url + "/v1/completions",
        json={"model": "default", "prompt": PROMPT, "max_tokens": 8, "stream": True},
        stream=True,
        timeout=30,
    ) as resp:
        assert resp.headers["x-served-by"] == "canary"
        got = b""
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            for chunk in resp.iter_content(None):
                got += chunk
    assert got.startswith(b"data: ") and b"[DONE]" not in got  # one event, then cut
    stall = _outcomes(gate, "upstream_stall")
    assert [o["variant"] for o in stall] == ["canary"]
    wait_for(lambda: _running(canary) == 0, what="the hung canary's request to be released")


def test_a_canary_that_never_answers_gets_504_at_the_request_deadline(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    router, canary = _hung_canary(spawn, tmp_path, gate, "--request-deadline-s", "2")
    r = rs.completion(router.url, PROMPT)
    assert r.status_code == 504, r.text
    err = r.json()["error"]
    assert err["code"] == "upstream_deadline"
    assert "request deadline (2 s)" in err["message"]
    assert r.headers["x-served-by"] == "canary"
    assert [o["variant"] for o in _outcomes(gate, "upstream_deadline")] == ["canary"]
    wait_for(lambda: _running(canary) == 0, what="the hung canary's request to be released")


def test_a_client_that_leaves_a_stalled_canary_is_stall_evidence(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    router, canary = _hung_canary(
        spawn, tmp_path, gate, "--upstream-idle-s", "60", "--stall-evidence-s", "0.5"
    )
    sock = _post_raw(_port(router.url), {"stream": True, "max_tokens": 8})
    sock.settimeout(10)
    got = b""
    while b"data: " not in got:  # the canary's one event
        got += sock.recv(65536)
    time.sleep(1.0)  # the user waits on the silent canary past --stall-evidence-s, then leaves
    sock.close()
    stall = _outcomes(gate, "upstream_stall")
    assert [o["variant"] for o in stall] == ["canary"]
    # The router let go of the upstream when its client left, not at a deadline.
    wait_for(lambda: _running(canary) == 0, what="the hung canary's request to be released")


def test_a_hang_fault_ends_with_its_ttl_and_the_answer_completes(spawn: Spawner) -> None:
    model = rs.start_model(spawn, "v1")
    inject_fault(model.url, {"kind": "hang", "ttl_s": 1, "after_events": 1})
    r = rs.completion(model.url, PROMPT, stream=True, max_tokens=4)
    assert r.status_code == 200
    events = rs.sse_events(r.content)  # ends with [DONE]: the hang ended with its TTL
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["text"]) == 4
    refused = requests.post(
        model.url + "/admin/faults",
        json={"kind": "hang", "ttl_s": 1, "interval_s": -1},
        headers=rs.ADMIN,
        timeout=5,
    )
    assert refused.status_code == 400 and "interval_s" in refused.text
