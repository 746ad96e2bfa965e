"""Helpers for the model-server tests: a strict SSE parser, request shortcuts, KL from
returned logprobs, and a module-scoped spawner.

The SSE parser is strict on purpose: every event must be exactly ``data: <json>\\n\\n``
and the stream must end with ``data: [DONE]\\n\\n`` — a client in the wild (the router,
Locust) breaks on less.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.procs import ADMIN_TOKEN, Proc, Spawner, inject_fault, stopping, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Fast capacity settings for tests that are not about latency.
FAST = ("--ttft-base-ms", "1", "--prefill-ms-per-1k", "0", "--itl-ms", "0.2")


class SSEError(AssertionError):
    pass


def parse_sse(raw: bytes, *, require_done: bool = True) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; raises SSEError on any deviation from the format."""
    if not raw.endswith(b"\n\n"):
        raise SSEError(f"stream does not end with a blank line: {raw[-80:]!r}")
    blocks = raw[:-2].split(b"\n\n")
    events: list[dict[str, Any]] = []
    done = False
    for block in blocks:
        if done:
            raise SSEError(f"event after [DONE]: {block[:80]!r}")
        if not block.startswith(b"data: ") or b"\n" in block:
            raise SSEError(f"not a single 'data: ' line: {block[:120]!r}")
        payload = block[len(b"data: ") :]
        if payload == b"[DONE]":
            done = True
            continue
        obj = json.loads(payload)
        if not isinstance(obj, dict):
            raise SSEError(f"event is not a JSON object: {payload[:80]!r}")
        events.append(obj)
    if require_done and not done:
        raise SSEError("stream ended without data: [DONE]")
    return events


def post(
    proc: Proc,
    path: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> requests.Response:
    return requests.post(proc.url + path, json=body, headers=dict(headers or {}), timeout=timeout)


def complete(proc: Proc, body: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    resp = post(proc, "/v1/completions", body, **kw)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def stream(
    proc: Proc, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> tuple[requests.Response, list[dict[str, Any]], float]:
    """POST with stream true; returns the response, its events, and the client's TTFT
    (seconds to the first event with text)."""
    t0 = time.monotonic()
    resp = requests.post(
        proc.url + path,
        json={**body, "stream": True},
        headers=dict(headers or {}),
        stream=True,
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    raw = b""
    ttft = math.nan
    for chunk in resp.iter_content(chunk_size=None):
        raw += chunk
        if math.isnan(ttft) and (b'"text":" ' in raw or b'"content":" ' in raw):
            ttft = time.monotonic() - t0
    return resp, parse_sse(raw), ttft


def inject(proc: Proc, body: Mapping[str, Any]) -> dict[str, Any]:
    return inject_fault(proc.url, body)


def clear_faults(proc: Proc) -> None:
    resp = requests.delete(proc.url + "/admin/faults", headers=ADMIN, timeout=10)
    assert resp.status_code == 200, resp.text


def kl_from_top(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """KL(p || q) from two {token: logprob} maps over the same tokens plus the rest mass.

    Exact for the simulator when both maps hold all candidates (logprobs >= 8): the rest
    is spread evenly over the same tokens in both."""
    assert set(p) == set(q), (sorted(p), sorted(q))
    kl = 0.0
    for tok, lp in p.items():
        kl += math.exp(lp) * (lp - q[tok])
    rest_p = max(1e-300, 1.0 - sum(math.exp(v) for v in p.values()))
    rest_q = max(1e-300, 1.0 - sum(math.exp(v) for v in q.values()))
    return kl + rest_p * math.log(rest_p / rest_q)


def chat_answer(token: str, top: Mapping[str, float]) -> dict[str, Any]:
    """A non-streamed chat completion of the one ``token``, with logprobs as OpenAI writes
    them: the token's own, and ``top`` ({token: logprob}) as ``[{token, logprob}]``."""
    entry = {
        "token": token,
        "logprob": top[token],
        "top_logprobs": [{"token": t, "logprob": v} for t, v in top.items()],
    }
    message = {"role": "assistant", "content": token}
    return {"choices": [{"index": 0, "message": message, "logprobs": {"content": [entry]}}]}


def module_spawner(tmp: Path) -> AbstractContextManager[Spawner]:
    """A Spawner for a module-scoped fixture (``with module_spawner(tmp) as spawn``)."""
    return stopping(Spawner(tmp))


def fault_free_server_fixtures(folder: str) -> tuple[Any, Any]:
    """A test module's ``module_server`` (one fast v2 model server for the module) and
    ``server`` fixtures (that server, its faults cleared before and after each test)."""

    @pytest.fixture(scope="module", name="module_server")
    def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
        with module_spawner(tmp_path_factory.mktemp(folder)) as spawn:
            yield spawn("canarystack.model", "--version", "v2", *FAST)

    @pytest.fixture(name="server")
    def server(module_server: Proc) -> Iterator[Proc]:
        clear_faults(module_server)
        yield module_server
        clear_faults(module_server)

    return module_server, server


def request_done_lines(proc: Proc) -> list[dict[str, Any]]:
    return [e for e in proc.log_events() if e.get("event") == "request_done"]


def done_line(proc: Proc, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """The request_done line of one request (a stream's line follows its last byte, so
    wait for it rather than read the log once)."""

    def find() -> dict[str, Any] | None:
        for e in request_done_lines(proc):
            if e.get("request_id") == request_id:
                return e
        return None

    found = wait_for(find, timeout=timeout, what=f"request_done of {request_id}")
    assert isinstance(found, dict)
    return found
