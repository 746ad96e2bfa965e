"""The shared HTTP core against a hostile client (#12, items 3 and 7), over real HTTP.

The tests start this module as a real process (``python -m tests.test_common_hostile``):
a component built only from ``canarystack.common`` (``base_parser``, ``create_app``,
``serve``) with a few routes that use the shared body reader and answer writer, so the
common layer is tested apart from the components that build on it. Raw sockets send what
an HTTP library would refuse to send (undecodable header bytes, lying Content-Length).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
import requests
from aiohttp import web

from canary_contract import strictjson
from canarystack.common.app import Component, create_app
from canarystack.common.cli import base_parser, parse, serve
from canarystack.common.errors import DEFAULT_BODY_LIMIT, json_response, read_json_object
from canarystack.common.faults import FAULT_BODY_LIMIT, FaultRegistry, LatencyMs
from tests.procs import ADMIN_TOKEN, Proc, Spawner

MODULE = "tests.test_common_hostile"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SMALL_LIMIT = 1024


# ----------------------------------------------------------------- the test component


def build(health: str) -> web.Application:
    def health_extra() -> dict[str, Any]:
        if health == "nan":
            return {"noise_floor": math.nan}
        if health == "raise":
            raise RuntimeError("statistics not ready")
        return {}

    comp = Component(
        name="hostile",
        version="t",
        admin_token=ADMIN_TOKEN,
        faults=FaultRegistry("hostile", {"latency": LatencyMs}),
        health_extra=None if health == "ok" else health_extra,
    )
    app = create_app(comp)

    async def echo(request: web.Request) -> web.Response:
        body = await read_json_object(request)
        return json_response({"keys": sorted(body), "bytes": len(json.dumps(body))})

    async def echo_small(request: web.Request) -> web.Response:
        body = await read_json_object(request, max_bytes=SMALL_LIMIT)
        return json_response({"keys": sorted(body)})

    async def read_then_parse(request: web.Request) -> web.Response:
        raw = await request.read()  # a handler that looks at the bytes first
        body = await read_json_object(request) if raw.strip() else {}
        return json_response({"keys": sorted(body)})

    async def nan(request: web.Request) -> web.Response:
        return json_response({"stats": {"kl_mean": math.nan}})

    app.router.add_post("/echo", echo)
    app.router.add_post("/echo-small", echo_small)
    app.router.add_post("/read-then-parse", read_then_parse)
    app.router.add_get("/nan", nan)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    p: argparse.ArgumentParser = base_parser("hostile", "common-layer test component")
    p.add_argument("--health", choices=["ok", "nan", "raise"], default="ok")
    args = parse(p, argv)
    serve(build(args.health), args, "hostile")


# ------------------------------------------------------------------------ helpers


@pytest.fixture
def comp(spawn: Spawner) -> Proc:
    return spawn(MODULE)


def raw_request(proc: Proc, data: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send ``data`` as is; the status and body of the answer (the server closes)."""
    with socket.create_connection(("127.0.0.1", proc.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def error_of(body: bytes) -> dict[str, Any]:
    data = strictjson.loads(body)  # every answer is strict JSON
    assert isinstance(data, dict)
    err = data["error"]
    assert isinstance(err, dict)
    return err


# ------------------------------------------------------------- undecodable headers


def faults_with_authorization(comp: Proc, *values: bytes) -> tuple[int, bytes]:
    """A raw ``GET /admin/faults`` with one Authorization header for each of ``values``."""
    auth = b"".join(b"Authorization: " + value + b"\r\n" for value in values)
    head = b"GET /admin/faults HTTP/1.1\r\nHost: x\r\n" + auth + b"Connection: close\r\n\r\n"
    return raw_request(comp, head)


@pytest.mark.parametrize(
    "value",
    [b"Bearer \xff\xfe", "Bearer tök".encode(), b"Bearer " + ADMIN_TOKEN.encode() + b"\x80"],
)
def test_undecodable_authorization_is_401_not_500(comp: Proc, value: bytes) -> None:
    status, body = faults_with_authorization(comp, value)
    assert status == 401
    assert "not printable ASCII" in error_of(body)["message"]
    assert requests.get(comp.url + "/admin/faults", headers=ADMIN, timeout=5).status_code == 200


def test_two_authorization_headers_are_refused(comp: Proc) -> None:
    good = f"Bearer {ADMIN_TOKEN}".encode()
    status, body = faults_with_authorization(comp, good, b"Bearer other")
    assert status == 401
    assert "send exactly one" in error_of(body)["message"]


# ------------------------------------------------------------------- body limits


def test_declared_length_over_the_limit_is_413_before_any_byte_is_read(comp: Proc) -> None:
    # No body follows: a server that waited for it would never answer.
    status, body = raw_request(
        comp,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 99999999999\r\nConnection: close\r\n\r\n",
    )
    assert status == 413
    err = error_of(body)
    assert err["code"] == "body_too_large"
    assert f"the limit here is {DEFAULT_BODY_LIMIT} bytes" in err["message"]
    assert "99999999999 bytes" in err["message"]


def test_chunked_body_over_the_limit_is_413_naming_the_limit(comp: Proc) -> None:
    def chunks() -> Any:
        piece = b'{"a": "' + b"x" * 65536
        yield piece
        for _ in range(DEFAULT_BODY_LIMIT // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    r = requests.post(comp.url + "/echo", data=chunks(), timeout=10)
    assert r.status_code == 413
    assert f"the limit here is {DEFAULT_BODY_LIMIT} bytes" in r.json()["error"]["message"]


def test_a_compressed_body_is_limited_by_its_decompressed_size(comp: Proc) -> None:
    bomb = gzip.compress(b'{"a": "' + b"0" * (64 * DEFAULT_BODY_LIMIT) + b'"}')
    assert len(bomb) < DEFAULT_BODY_LIMIT // 4
    r = requests.post(
        comp.url + "/echo", data=bomb, headers={"Content-Encoding": "gzip"}, timeout=10
    )
    assert r.status_code == 413
    assert f"the limit here is {DEFAULT_BODY_LIMIT} bytes" in r.json()["error"]["message"]


def test_a_route_sets_its_own_smaller_limit(comp: Proc) -> None:
    body = json.dumps({"a": "x" * SMALL_LIMIT}).encode()
    r = requests.post(comp.url + "/echo-small", data=body, timeout=5)
    assert r.status_code == 413
    assert f"the limit here is {SMALL_LIMIT} bytes" in r.json()["error"]["message"]
    r = requests.post(comp.url + "/echo-small", json={"a": 1}, timeout=5)
    assert r.status_code == 200 and r.json() == {"keys": ["a"]}


def test_a_body_the_handler_read_first_is_parsed_once_more(comp: Proc) -> None:
    r = requests.post(comp.url + "/read-then-parse", json={"b": 1, "a": 2}, timeout=5)
    assert r.status_code == 200 and r.json() == {"keys": ["a", "b"]}


def test_a_handler_reading_past_the_app_limit_gets_a_413_naming_the_limit(comp: Proc) -> None:
    # request.read() (aiohttp's own limit, client_max_size) rather than the shared reader.
    body = json.dumps({"pad": "x" * (DEFAULT_BODY_LIMIT + 10)}).encode()
    r = requests.post(comp.url + "/read-then-parse", data=body, timeout=10)
    assert r.status_code == 413
    message = r.json()["error"]["message"]
    assert str(DEFAULT_BODY_LIMIT) in message and "send a smaller body" in message


@pytest.mark.parametrize(
    "body",
    [
        # Many items (parsed in a worker thread) and one long string (parsed on the loop).
        {"prompt": list(range(20_000)), "n": 1},
        {"prompt": "y" * (DEFAULT_BODY_LIMIT - 100), "n": 1},
    ],
    ids=["many-items", "one-long-string"],
)
def test_bodies_up_to_the_limit_are_read_whichever_way_they_are_parsed(
    comp: Proc, body: dict[str, Any]
) -> None:
    data = json.dumps(body).encode()
    assert len(data) <= DEFAULT_BODY_LIMIT
    r = requests.post(comp.url + "/echo", data=data, timeout=10)
    assert r.status_code == 200
    assert r.json() == {"keys": ["n", "prompt"], "bytes": len(json.dumps(body))}


# --------------------------------------------------------------- strict JSON in


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"kl_mean": NaN}', "NaN is not a JSON number"),
        (b'{"kl_mean": Infinity}', "Infinity is not a JSON number"),
        (b'{"kl_mean": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"kl_mean": 1e400}', "overflows a double"),
        (b'{"n": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
        (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper than 64"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"prompt": "hello \\ud800"}', "lone surrogate"),
        (b'{"prompt": "\xff"}', "not valid UTF-8"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b"   ", "is empty"),
    ],
)
def test_bodies_strict_json_refuses_are_400_naming_the_problem(
    comp: Proc, body: bytes, text: str
) -> None:
    r = requests.post(comp.url + "/echo", data=body, timeout=5)
    assert r.status_code == 400, r.text
    assert text in r.json()["error"]["message"]


# -------------------------------------------------------------- strict JSON out


def test_a_nan_in_an_answer_is_one_500_and_the_process_keeps_serving(comp: Proc) -> None:
    r = requests.get(comp.url + "/nan", timeout=5)
    assert r.status_code == 500
    assert "NaN" not in r.text
    assert error_of(r.content)["type"] == "server_error"
    assert requests.get(comp.url + "/health", timeout=5).status_code == 200
    logged = [e for e in comp.log_events() if e.get("event") == "unwritable_response"]
    assert len(logged) == 1
    assert logged[0]["where"] == "$.stats.kl_mean = nan"


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("nan", "ValueError: Out of range float values"), ("raise", "statistics not ready")],
)
def test_a_health_check_that_cannot_be_told_says_degraded(
    spawn: Spawner, mode: str, reason: str
) -> None:
    proc = spawn(MODULE, "--health", mode, wait_health=False)
    r = requests.get(proc.url + "/health", timeout=5)
    assert r.status_code == 503
    body = strictjson.loads(r.content)
    assert body["status"] == "degraded"
    assert any(reason in item for item in body["degraded_reasons"]), body


# ---------------------------------------------------------------- fault admin API


def inject(proc: Proc, body: bytes) -> requests.Response:
    return requests.post(
        proc.url + "/admin/faults",
        data=body,
        headers={**ADMIN, "Content-Type": "application/json"},
        timeout=5,
    )


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        (b'{"kind": "latency", "ttl_s": 1e400}', None, "overflows a double"),
        (b'{"kind": "latency", "ttl_s": Infinity}', None, "Infinity is not a JSON number"),
        (b'{"kind": "latency", "ttl_s": 5, "kind": "latency"}', "kind", "'kind' twice"),
        (b'{"kind": "latency", "ttl_s": 5, "ttl_s": 5}', "ttl_s", "'ttl_s' twice"),
        (
            b'{"kind": "latency", "ttl_s": 5, "params": {"ttl_s": 1e9, "ms": 1}}',
            "params.ttl_s",
            "cannot set its ttl_s",
        ),
        (
            b'{"kind": "latency", "ttl_s": 5, "params": {"kind": "latency"}}',
            "params.kind",
            "cannot set its kind",
        ),
        (
            b'{"kind": "latency", "ttl_s": 5, "params": {"params": {"ms": 1}}}',
            "params.params",
            "cannot set its params",
        ),
        (b'{"kind": "latency", "ttl_s": 5, "params": {"ms": 1}, "ms": 2}', "params", "not both"),
    ],
)
def test_fault_bodies_cannot_be_made_permanent_or_override_kind_or_ttl(
    comp: Proc, body: bytes, param: str | None, text: str
) -> None:
    r = inject(comp, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert text in err["message"]
    assert requests.get(comp.url + "/admin/faults", headers=ADMIN, timeout=5).json() == {
        "faults": []
    }


def test_fault_bodies_are_small(comp: Proc) -> None:
    body = json.dumps({"kind": "latency", "ttl_s": 5, "pad": "x" * FAULT_BODY_LIMIT}).encode()
    r = inject(comp, body)
    assert r.status_code == 413
    assert f"the limit here is {FAULT_BODY_LIMIT} bytes" in r.json()["error"]["message"]
    r = inject(comp, b'{"kind": "latency", "ttl_s": 5, "params": {"ms": 7}}')
    assert r.status_code == 201 and r.json()["params"] == {"ms": 7.0}


# --------------------------------------------------------- the components' flags


@pytest.mark.parametrize(
    "module",
    [
        "canarystack.model",
        "canarystack.router",
        "canarystack.broker",
        "canarystack.gate",
        "canarystack.rollback",
    ],
)
def test_every_component_refuses_an_unbounded_fault_ttl_cap(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--max-fault-ttl-s", "inf", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "argument --max-fault-ttl-s" in done.stderr
    assert "finite number of seconds > 0" in done.stderr


if __name__ == "__main__":
    main()
