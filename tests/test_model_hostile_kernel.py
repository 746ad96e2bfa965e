"""The broken-kernel fault modes, read as raw bytes from a real model-server process: a
broken engine writes ``NaN``/``-Infinity`` logprobs (or no logprobs and garbage text) on
the prompts the fault acts on, and on no other; every other answer stays strict JSON."""

from __future__ import annotations

import json
import math
from typing import Any, get_args

import pytest
import requests

from canary_contract import strictjson
from canarystack.model.engine import BROKEN_MODES, KERNEL_MODES, NAN_TOKEN_ID
from canarystack.model.faults import KernelParams
from canarystack.model.generation import token_texts
from canarystack.tokenizer import make_prompt, vocab
from tests.model_helpers import (
    clear_faults,
    fault_free_server_fixtures,
    inject,
)
from tests.procs import Proc

SHORT = make_prompt(20, seed=11)
LONG = make_prompt(150, seed=12)
THRESHOLD = 100
MAX_TOKENS = 6
TOP = 3


module_server, server = fault_free_server_fixtures("model-broken-kernel")


def body_for(path: str, prompt: str, stream: bool) -> dict[str, Any]:
    common: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    if path == "/v1/completions":
        return {**common, "prompt": prompt, "logprobs": TOP}
    return {
        **common,
        "messages": [{"role": "user", "content": prompt}],
        "logprobs": True,
        "top_logprobs": TOP,
    }


def raw_answer(proc: Proc, path: str, prompt: str, stream: bool) -> bytes:
    resp = requests.post(proc.url + path, json=body_for(path, prompt, stream), timeout=20)
    assert resp.status_code == 200, resp.text
    return resp.content


def documents(raw: bytes, stream: bool) -> list[bytes]:
    """The JSON documents of an answer: the body, or each SSE event's data ([DONE] left out)."""
    if not stream:
        return [raw]
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-80:]
    events = raw[: -len(b"data: [DONE]\n\n")].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events if e)
    return [e[len(b"data: ") :] for e in events if e]


def choices_of(docs: list[bytes]) -> list[dict[str, Any]]:
    """Every choice of every document, parsed leniently (Python's json reads NaN)."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        out.extend(json.loads(doc)["choices"])
    return out


def text_of(choices: list[dict[str, Any]]) -> str:
    parts = []
    for ch in choices:
        if "text" in ch:
            parts.append(ch["text"])
        elif "message" in ch:
            parts.append(ch["message"]["content"])
        else:
            parts.append(ch["delta"].get("content") or "")
    return "".join(parts)


def logprob_values(choices: list[dict[str, Any]]) -> list[float]:
    """Every logprob of the answer: the chosen tokens' and every alternative's."""
    values: list[float] = []
    for ch in choices:
        lp = ch["logprobs"]
        if lp is None:
            continue
        if "content" in lp:
            for entry in lp["content"]:
                values.append(entry["logprob"])
                values.extend(t["logprob"] for t in entry["top_logprobs"])
        else:
            values.extend(lp["token_logprobs"])
            for top in lp["top_logprobs"]:
                values.extend(top.values())
    return values


def broken_answers(server: Proc, path: str, stream: bool, mode: str) -> tuple[bytes, bytes]:
    """Inject kernel ``mode`` from THRESHOLD prompt tokens on; the raw answers to LONG
    and to SHORT."""
    fault = {"kind": "kernel", "ttl_s": 60, "mode": mode, "min_prompt_tokens": THRESHOLD}
    inject(server, fault)
    return raw_answer(server, path, LONG, stream), raw_answer(server, path, SHORT, stream)


def healthy_then_broken(
    server: Proc, path: str, stream: bool, mode: str
) -> tuple[str, bytes, bytes]:
    """The text a healthy kernel answers LONG with, then ``broken_answers`` under ``mode``."""
    healthy = text_of(choices_of(documents(raw_answer(server, path, LONG, stream), stream)))
    return (healthy, *broken_answers(server, path, stream, mode))


CASES = [
    (path, stream)
    for path in ("/v1/completions", "/v1/chat/completions")
    for stream in (False, True)
]
IDS = [f"{p.rsplit('/', 1)[-1]}-{'stream' if s else 'whole'}" for p, s in CASES]


def test_the_fault_api_knows_every_kernel_mode() -> None:
    assert set(get_args(KernelParams.model_fields["mode"].annotation)) == set(KERNEL_MODES)
    assert set(BROKEN_MODES) == {"nan-logits", "inf-logits", "garbage"}


@pytest.mark.parametrize(("path", "stream"), CASES, ids=IDS)
def test_nan_logits_write_nan_only_above_the_threshold(
    server: Proc, path: str, stream: bool
) -> None:
    long_raw, short_raw = broken_answers(server, path, stream, "nan-logits")
    # The bare JSON token, as an engine using Python's json writes it.
    assert b":NaN" in long_raw and b"Infinity" not in long_raw
    assert b"NaN" not in short_raw
    for doc in documents(short_raw, stream):
        strictjson.loads(doc)  # the untouched answer stays strict
    with pytest.raises(strictjson.StrictJsonError):
        for doc in documents(long_raw, stream):
            strictjson.loads(doc)
    choices = choices_of(documents(long_raw, stream))
    values = logprob_values(choices)
    # Each position: the chosen token's logprob and at least TOP alternatives'.
    assert len(values) >= MAX_TOKENS * (TOP + 1) and all(math.isnan(v) for v in values)
    # All-NaN logits: argmax is index 0 at every position.
    assert text_of(choices) == token_texts()[NAN_TOKEN_ID] * MAX_TOKENS
    short_values = logprob_values(choices_of(documents(short_raw, stream)))
    assert short_values and all(math.isfinite(v) and v <= 0 for v in short_values)


@pytest.mark.parametrize(("path", "stream"), CASES, ids=IDS)
def test_inf_logits_write_minus_infinity_only_above_the_threshold(
    server: Proc, path: str, stream: bool
) -> None:
    healthy, long_raw, short_raw = healthy_then_broken(server, path, stream, "inf-logits")
    assert b":-Infinity" in long_raw and b"NaN" not in long_raw
    assert b"Infinity" not in short_raw
    for doc in documents(short_raw, stream):
        strictjson.loads(doc)
    choices = choices_of(documents(long_raw, stream))
    values = logprob_values(choices)
    assert len(values) >= MAX_TOKENS * (TOP + 1) and all(v == -math.inf for v in values)
    # The normaliser overflowed, the order did not change: the text is the healthy one.
    assert text_of(choices) == healthy


@pytest.mark.parametrize(("path", "stream"), CASES, ids=IDS)
def test_garbage_writes_unrelated_tokens_and_no_logprobs_above_the_threshold(
    server: Proc, path: str, stream: bool
) -> None:
    healthy, long_raw, short_raw = healthy_then_broken(server, path, stream, "garbage")
    long_docs, short_docs = documents(long_raw, stream), documents(short_raw, stream)
    for doc in long_docs + short_docs:
        strictjson.loads(doc)  # garbage, but well-formed JSON
    long_choices = choices_of(long_docs)
    # Asked for logprobs, got none: every choice says "logprobs": null.
    assert long_choices and all(ch["logprobs"] is None for ch in long_choices)
    assert logprob_values(choices_of(short_docs))  # the short prompt still has them
    text = text_of(long_choices)
    assert text != healthy
    words = text.split()
    assert len(words) == MAX_TOKENS and set(words) <= set(vocab())


def test_broken_modes_act_from_the_default_threshold_on_and_stop_with_the_fault(
    server: Proc,
) -> None:
    path = "/v1/completions"
    fault = inject(server, {"kind": "kernel", "ttl_s": 60, "mode": "inf-logits"})
    assert fault["params"] == {"mode": "inf-logits", "min_prompt_tokens": 2048, "magnitude": 1.0}
    assert b"-Infinity" in raw_answer(server, path, make_prompt(2048, seed=3), False)
    strictjson.loads(raw_answer(server, path, make_prompt(2047, seed=3), False))
    clear_faults(server)
    strictjson.loads(raw_answer(server, path, make_prompt(2048, seed=3), False))
