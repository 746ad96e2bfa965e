"""Bad input to the model server: every malformed body gets a 400 in the OpenAI error
shape that names the field, unknown fields are ignored, and nothing a client sends —
a batch of wrong types, junk bodies, huge numbers — produces a 5xx."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.model_helpers import FAST, module_spawner, post
from tests.procs import Proc

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    with module_spawner(tmp_path_factory.mktemp("model-validation")) as spawn:
        yield spawn("canarystack.model", "--version", "v1", "--max-model-len", "4096", *FAST)


@pytest.mark.parametrize(
    ("path", "body", "param", "text"),
    [
        ("/v1/completions", {"prompt": "a", "max_tokens": -1}, "max_tokens", "greater than"),
        ("/v1/completions", {"prompt": "a", "max_tokens": "5"}, "max_tokens", "integer"),
        ("/v1/completions", {"max_tokens": 5}, "prompt", "required"),
        ("/v1/completions", {"prompt": 5}, "prompt", "must be a string"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "exactly one string"),
        ("/v1/completions", {"prompt": ""}, "prompt", "empty"),
        ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs", "less than"),
        ("/v1/completions", {"prompt": "a", "logprobs": -1}, "logprobs", "greater than"),
        ("/v1/completions", {"prompt": "a", "temperature": -0.5}, "temperature", "greater"),
        ("/v1/completions", {"prompt": "a", "top_p": 0}, "top_p", "greater than"),
        ("/v1/completions", {"prompt": "a", "n": 2}, "n", "n=2 is not supported"),
        (
            "/v1/completions",
            {"prompt": "a", "echo": True, "stream": True},
            "echo",
            "without streaming",
        ),
        ("/v1/completions", {"prompt": "a", "stop": [1]}, "stop", "list of strings"),
        ("/v1/completions", {"prompt": "a", "stream": "yes"}, "stream", "boolean"),
        ("/v1/completions", {"prompt": "a", "seed": 1.5}, "seed", "integer"),
        (
            "/v1/completions",
            {"prompt": "a", "stream_options": {"include_usage": True}},
            "stream_options",
            "stream: true",
        ),
        (
            "/v1/completions",
            {"prompt": "a", "max_tokens": 5000},
            "max_tokens",
            "maximum context length is 4096",
        ),
        ("/v1/chat/completions", {"messages": "hi"}, "messages", "valid list"),
        ("/v1/chat/completions", {"messages": []}, "messages", "at least 1"),
        ("/v1/chat/completions", {}, "messages", "required"),
        (
            "/v1/chat/completions",
            {"messages": [{"content": "x"}]},
            "messages[0].role",
            "required",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
            "content must be",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "text parts",
        ),
        (
            "/v1/chat/completions",
            {"messages": MSG, "top_logprobs": 3},
            "top_logprobs",
            "needs logprobs: true",
        ),
        (
            "/v1/chat/completions",
            {"messages": MSG, "logprobs": True, "top_logprobs": 50},
            "top_logprobs",
            "less than",
        ),
        ("/v1/chat/completions", {"messages": MSG, "logprobs": 1}, "logprobs", "boolean"),
        (
            "/v1/chat/completions",
            {"messages": MSG, "max_completion_tokens": 0},
            "max_completion_tokens",
            "greater",
        ),
    ],
)
def test_bad_field_is_a_400_naming_it(
    server: Proc, path: str, body: dict[str, Any], param: str, text: str
) -> None:
    resp = post(server, path, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert param.split("[")[0] in err["message"]
    assert text in err["message"]
    assert resp.headers["x-model-version"] == "v1"


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 50_000, "50000 JSON arrays and objects; at most 20000"),
        (b"[" * 70 + b"]" * 70, "nested deeper than 64 levels"),
        (b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_body_that_is_not_a_json_object_is_a_400(server: Proc, raw: bytes, text: str) -> None:
    resp = requests.post(server.url + "/v1/completions", data=raw, timeout=10)
    assert resp.status_code == 400, resp.text
    assert text in resp.json()["error"]["message"]


def test_unknown_fields_are_ignored_and_null_means_default(server: Proc) -> None:
    body = {
        "prompt": "a b",
        "max_tokens": 2,
        "frequency_penalty": 0.5,
        "x_custom": {"a": [1]},
        "logit_bias": {"5": 1},
        "temperature": None,
    }
    resp = post(server, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    chat = {
        "messages": [{"role": "user", "content": "hi", "name": "bob"}],
        "max_tokens": 2,
        "tools": [],
        "response_format": {"type": "text"},
    }
    assert post(server, "/v1/chat/completions", chat).status_code == 200
    # Some clients send null for "use the default".
    nulls = {
        "prompt": "a",
        "max_tokens": None,
        "temperature": None,
        "top_p": None,
        "stream": None,
        "n": None,
        "echo": None,
        "logprobs": None,
        "stop": None,
    }
    resp = post(server, "/v1/completions", nulls)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 16  # --default-max-tokens
    chat_nulls = {"messages": MSG, "max_tokens": 1, "logprobs": None, "top_logprobs": None}
    assert post(server, "/v1/chat/completions", chat_nulls).status_code == 200


JUNK: list[Any] = [
    None,
    -1,
    0,
    1.5,
    1e308,
    "x",
    "",
    [],
    {},
    True,
    [1, "a"],
    {"a": None},
    "a" * 5000,
    -(10**30),
]
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "user",
    "stream",
    "stream_options",
    "n",
    "echo",
    "max_completion_tokens",
    "best_of",
]


def test_no_client_input_gives_a_5xx(server: Proc) -> None:
    statuses: dict[int, int] = {}
    session = requests.Session()
    cases: list[tuple[str, dict[str, Any]]] = []
    for field, value in itertools.product(FIELDS, JUNK):
        cases.append(("/v1/completions", {"prompt": "a b", "max_tokens": 1, field: value}))
        cases.append(("/v1/chat/completions", {"messages": MSG, "max_tokens": 1, field: value}))
    cases.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}))
    cases.append(("/v1/chat/completions", {"messages": [None]}))
    cases.append(("/v1/chat/completions", {"messages": [{"role": ["x"], "content": "a"}]}))
    for path, body in cases:
        resp = session.post(server.url + path, json=body, timeout=10)
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        assert resp.status_code < 500, (body, resp.text)
        if resp.status_code >= 400:
            assert resp.json()["error"]["message"]
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 100
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    wrong_method = requests.get(server.url + "/v1/completions", timeout=5)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
