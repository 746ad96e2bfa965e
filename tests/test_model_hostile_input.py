"""Hostile client input posted to a real model-server process: each gets the 4xx that
names it (never a 5xx, never a non-strict answer), and the next normal request is served.
Also: the body limit comes from the context length (``--max-body-bytes`` overrides), is
checked from Content-Length before reading and while reading a chunked body, and a big
body is parsed off the event loop while another request keeps streaming."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from canary_contract import strictjson
from canarystack.model.body import BYTES_PER_TOKEN, ENVELOPE_BYTES
from tests.model_helpers import ADMIN, FAST, module_spawner, parse_sse
from tests.procs import Proc

MAX_MODEL_LEN = 4096
BODY_LIMIT = MAX_MODEL_LEN * BYTES_PER_TOKEN + ENVELOPE_BYTES
PROMPT_LIMIT = MAX_MODEL_LEN * BYTES_PER_TOKEN
COMP = "/v1/completions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with module_spawner(tmp_path_factory.mktemp("model-hostile")) as spawn:
        yield spawn("canarystack.model", "--max-model-len", str(MAX_MODEL_LEN), *FAST)


def completion(extra: str, prompt: str = '"hi there"') -> bytes:
    return ('{"prompt":' + prompt + ',"max_tokens":2' + extra + "}").encode()


def chat(messages: str, extra: str = "") -> bytes:
    return ('{"max_tokens":2,"messages":' + messages + extra + "}").encode()


def assert_served(proc: Proc) -> None:
    """The next normal request is served, stream and all."""
    resp = requests.post(proc.url + COMP, json={"prompt": "a b c", "max_tokens": 3}, timeout=10)
    assert resp.status_code == 200, resp.text
    strictjson.loads(resp.content)
    resp = requests.post(
        proc.url + CHAT,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
        timeout=10,
    )
    assert resp.status_code == 200 and len(parse_sse(resp.content)) == 4


def assert_error(resp: requests.Response, status: int, text: str, param: str | None) -> None:
    assert resp.status_code == status, resp.text
    err = strictjson.loads(resp.content)["error"]
    assert text in err["message"], err
    assert err["param"] == param
    assert resp.headers["x-model-version"] == "v1"


HOSTILE: list[tuple[str, str, bytes, str, str | None]] = [
    # (name, path, raw body, text in the message, param)
    ("lone-surrogate-prompt", COMP, completion("", '"hello \\ud800"'), "lone surrogate", None),
    (
        "lone-surrogate-chat",
        CHAT,
        chat('[{"role":"user","content":"hi \\udfff"}]'),
        "lone surrogate",
        None,
    ),
    ("lone-surrogate-key", COMP, completion(',"\\udc00":1'), "lone surrogate", None),
    ("nan-temperature", COMP, completion(',"temperature":NaN'), "NaN is not a JSON number", None),
    ("infinity-top-p", COMP, completion(',"top_p":Infinity'), "Infinity is not a JSON", None),
    ("minus-infinity", COMP, completion(',"seed":-Infinity'), "-Infinity is not a JSON", None),
    ("huge-integer", COMP, completion(',"seed":' + "9" * 5000), "5000 digits", None),
    ("overflowing-float", COMP, completion(',"max_tokens":1e400'), "overflows a double", None),
    (
        "deep-nesting",
        COMP,
        completion(',"user":' + "[" * 50_000 + "]" * 50_000),
        "holds 50001 JSON arrays and objects; at most 20000",
        None,
    ),
    (
        "many-shallow-containers",
        COMP,
        completion(',"x":[' + ",".join(["[[]]"] * 10_000) + "]"),
        "holds 20002 JSON arrays and objects",
        None,
    ),
    (
        "shallow-but-too-deep",
        COMP,
        completion(',"x":' + "[" * 70 + "]" * 70),
        "deeper than 64",
        None,
    ),
    ("invalid-utf8", COMP, b'{"prompt":"\xff\xfe"}', "not valid UTF-8", None),
    ("encoded-surrogate", COMP, b'{"prompt":"a \xed\xa0\x80"}', "not valid UTF-8", None),
    (
        "many-messages",
        CHAT,
        chat("[" + ",".join(['{"role":"user","content":"x"}'] * 3000) + "]"),
        "at most 2048",
        "messages",
    ),
    (
        "many-stop-strings",
        COMP,
        completion(',"stop":[' + ",".join(['"s"'] * 10_000) + "]"),
        "at most 4",
        "stop",
    ),
    ("five-stop-strings", COMP, completion(',"stop":["a","b","c","d","e"]'), "at most 4", "stop"),
    ("long-stop-string", COMP, completion(',"stop":"' + "s" * 5000 + '"'), "at most 1024", "stop"),
    (
        "long-stop-in-list",
        COMP,
        completion(',"stop":["x","' + "s" * 5000 + '"]'),
        "at most 1024",
        "stop",
    ),
    (
        "huge-logprobs",
        COMP,
        completion(',"logprobs":1000000'),
        "less than or equal to 20",
        "logprobs",
    ),
    (
        "one-huge-word-prompt",
        COMP,
        completion("", '"' + "a" * (PROMPT_LIMIT + 10) + '"'),
        f"at most {PROMPT_LIMIT}",
        "prompt",
    ),
    (
        "one-huge-chat-message",
        CHAT,
        chat('[{"role":"user","content":"' + "b" * (PROMPT_LIMIT + 10) + '"}]'),
        f"at most {PROMPT_LIMIT}",
        "messages",
    ),
]


@pytest.mark.parametrize(
    ("path", "raw", "text", "param"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_body_is_a_400_naming_it_and_the_next_request_is_served(
    server: Proc, path: str, raw: bytes, text: str, param: str | None
) -> None:
    resp = requests.post(
        server.url + path, data=raw, headers={"content-type": "application/json"}, timeout=20
    )
    assert_error(resp, 400, text, param)
    assert_served(server)


def test_brackets_inside_strings_are_not_containers(server: Proc) -> None:
    raw = completion("", '"' + "[{" * 15_000 + ' \\" [[ "')
    resp = requests.post(server.url + COMP, data=raw, timeout=20)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-300, 1e-6])
def test_tiny_temperature_samples_greedily_not_a_500(server: Proc, temperature: float) -> None:
    body = {"prompt": "a b c d", "max_tokens": 8, "logprobs": 1}
    greedy = requests.post(server.url + COMP, json={**body, "temperature": 0}, timeout=10)
    resp = requests.post(server.url + COMP, json={**body, "temperature": temperature}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_body_over_the_limit_is_a_413_from_content_length(server: Proc) -> None:
    raw = completion("", '"' + "a " * (BODY_LIMIT // 2) + '"')
    assert len(raw) > BODY_LIMIT
    resp = requests.post(server.url + COMP, data=raw, timeout=20)
    assert_error(resp, 413, f"at most {BODY_LIMIT} bytes", None)
    assert f"{len(raw)} bytes (Content-Length)" in resp.json()["error"]["message"]
    assert "--max-body-bytes" in resp.json()["error"]["message"]
    assert_served(server)


def test_chunked_body_over_the_limit_is_a_413_while_reading(server: Proc) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt":"'
        for _ in range(BODY_LIMIT // 10_000 + 2):
            yield b"a " * 5_000
        yield b'"}'

    resp = requests.post(server.url + COMP, data=chunks(), timeout=20)
    assert "Content-Length" not in resp.request.headers
    assert_error(resp, 413, f"more than {BODY_LIMIT} bytes", None)
    assert_served(server)


def test_body_under_the_limit_is_read_and_checked_against_the_context(server: Proc) -> None:
    # Under the body limit, over the context: read, and refused for its length.
    raw = completion("", '"' + "a " * (MAX_MODEL_LEN + 10) + '"')
    assert len(raw) < BODY_LIMIT
    resp = requests.post(server.url + COMP, data=raw, timeout=20)
    assert_error(resp, 400, f"maximum context length is {MAX_MODEL_LEN}", "prompt")


def test_health_reports_the_body_limit(server: Proc) -> None:
    assert requests.get(server.url + "/health", timeout=5).json()["max_body_bytes"] == BODY_LIMIT


def raw_http(proc: Proc, head: bytes, body: bytes) -> bytes:
    """One HTTP/1.1 exchange with headers as raw bytes (requests would refuse them)."""
    with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
        sock.sendall(
            b"POST "
            + COMP.encode()
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            + head
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize(
    "request_id",
    [b"\xff\xfe", b"a" * 5000, "caf\u00e9".encode()],
    ids=["undecodable", "too-long", "not-ascii"],
)
def test_unusable_request_id_is_replaced_not_echoed(server: Proc, request_id: bytes) -> None:
    body = b'{"prompt":"a b","max_tokens":2}'
    answer = raw_http(server, b"x-request-id: " + request_id + b"\r\n", body)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    ids = [
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-request-id:")
    ]
    assert len(ids) == 1 and len(ids[0]) == 32 and ids[0].isalnum()
    doc = strictjson.loads(payload)  # no lone surrogate echoed into the body
    assert doc["id"] == "cmpl-" + ids[0].decode()


def test_undecodable_authorization_header_is_ignored_by_the_model_routes(server: Proc) -> None:
    answer = raw_http(server, b"Authorization: Bearer \xff\xfebad\r\n", completion(""))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_long_model_name_is_a_404_that_does_not_echo_it(server: Proc) -> None:
    resp = requests.post(server.url + COMP, json={"prompt": "a", "model": "m" * 50_000}, timeout=10)
    assert_error(resp, 404, "does not exist", "model")
    assert len(resp.content) < 1000


def test_admin_bodies_are_small(server: Proc) -> None:
    resp = requests.post(
        server.url + "/admin/faults",
        data=b'{"kind":"crash","ttl_s":5,"pad":"' + b"x" * 200_000 + b'"}',
        headers=ADMIN,
        timeout=10,
    )
    assert resp.status_code == 413, resp.text
    assert requests.get(server.url + "/admin/faults", headers=ADMIN, timeout=5).json() == {
        "faults": []
    }


def test_max_body_bytes_flag_overrides_and_is_checked(spawn: Any, tmp_path: Any) -> None:
    small: Proc = spawn("canarystack.model", "--max-body-bytes", "8192", *FAST)
    resp = requests.post(small.url + COMP, data=completion("", '"' + "a " * 5000 + '"'), timeout=10)
    assert_error(resp, 413, "at most 8192 bytes", None)
    assert requests.post(small.url + COMP, json={"prompt": "a", "max_tokens": 1}, timeout=10).ok
    with pytest.raises(AssertionError, match="--max-body-bytes 10: give at least 4096"):
        spawn("canarystack.model", "--max-body-bytes", "10", *FAST, timeout=10)


def test_a_big_body_is_parsed_while_another_request_keeps_streaming(spawn: Any) -> None:
    proc: Proc = spawn(
        "canarystack.model",
        "--max-body-bytes",
        str(40 * 1024**2),
        "--ttft-base-ms",
        "1",
        "--prefill-ms-per-1k",
        "0",
        "--itl-ms",
        "2",
        "--itl-jitter",
        "0",
    )
    big = completion("", '"' + "word " * (6 * 1024**2) + '"')  # 30 MiB of prompt
    assert len(big) > 30 * 1024**2
    first_token = threading.Event()
    stream_result: dict[str, Any] = {}

    def small_stream() -> None:
        resp = requests.post(
            proc.url + COMP,
            json={"prompt": "a b c", "max_tokens": 500, "stream": True, "temperature": 0},
            stream=True,
            timeout=60,
        )
        raw = b""
        for chunk in resp.iter_content(chunk_size=None):
            raw += chunk
            first_token.set()
        stream_result["status"] = resp.status_code
        stream_result["events"] = parse_sse(raw)

    thread = threading.Thread(target=small_stream)
    thread.start()
    try:
        assert first_token.wait(20)
        answers = [requests.post(proc.url + COMP, data=big, timeout=60) for _ in range(2)]
        # And a big legitimate answer: 1000 positions with 20 alternatives each.
        wide = requests.post(
            proc.url + CHAT,
            json={
                "messages": [{"role": "user", "content": "a b"}],
                "max_tokens": 1000,
                "logprobs": True,
                "top_logprobs": 20,
            },
            timeout=60,
        )
    finally:
        thread.join(60)
    assert not thread.is_alive()
    for resp in answers:
        assert_error(resp, 400, "bytes of text; this model server accepts at most", "prompt")
    assert wide.status_code == 200, wide.text[:300]
    content = strictjson.loads(wide.content)["choices"][0]["logprobs"]["content"]
    assert len(content) == 1000 and all(len(c["top_logprobs"]) == 20 for c in content)
    assert stream_result["status"] == 200
    events = stream_result["events"]
    assert len(events) == 500 and events[-1]["choices"][0]["finish_reason"] == "length"
    assert_served(proc)
