"""The router against hostile clients and broken engines (#12), with real processes.

- Whatever a client sends (5000-digit integers, nesting 100k deep, a million empty
  lists, ``1e400``, ``NaN``, a lone surrogate, invalid UTF-8, an oversized body,
  undecodable headers) it gets a 4xx naming the problem, the model servers never see it,
  and the router serves the next request.
- A pin to a canary that is off (tripped, rolled back, quarantined, no config) is 409
  ``canary_off`` and never reaches the canary; a pin to a canary at weight 0 passes.
- A pinned request is never gate evidence; nor is a failure both variants share.
- A broken canary kernel (``nan-logits``, ``inf-logits``, ``garbage``) is a comparison of
  maximal divergence and an error outcome; a broken baseline is dropped, not canary drift.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from canary_contract import strictjson
from canarystack.router.shadow import KL_MAX_NATS
from canarystack.tokenizer import make_prompt
from tests import router_support as rs
from tests.procs import Proc, Spawner, wait_for
from tests.shadow_support import noise_router

MAX_BODY = 65_536


models = rs.models_fixture(b0="v1", c0="v2")


def seen_by(model: Proc, request_id: str) -> bool:
    return any(e.get("request_id") == request_id for e in model.log_events())


def raw_post(
    url: str, body: bytes, headers: dict[str, bytes] | None = None, path: str = "/v1/completions"
) -> tuple[int, dict[str, Any]]:
    """POST exact bytes (body and header values), as a hostile client would."""
    status, answer, _ = raw_post_answer(url, body, headers, path)
    return status, answer


def raw_post_answer(
    url: str, body: bytes, headers: dict[str, bytes] | None = None, path: str = "/v1/completions"
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``raw_post`` with the answer's headers (lower-case names)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path)
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        answer_headers = {k.lower(): v for k, v in resp.getheaders()}
        return resp.status, strictjson.loads(data) if data else {}, answer_headers
    finally:
        conn.close()


def ok_body(**over: Any) -> bytes:
    return strictjson.dumps_bytes({"model": "default", "prompt": "a b c", "max_tokens": 2, **over})


HOSTILE_BODIES: list[tuple[str, bytes, int, str]] = [
    (
        "digits",
        b'{"model":"default","prompt":"a","max_tokens":' + b"9" * 5000 + b"}",
        400,
        "digits",
    ),
    ("nesting", b'{"prompt":' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "nested"),
    ("containers", b'{"prompt":' + b"[" * 30_000 + b"]" * 30_000 + b"}", 400, "arrays and objects"),
    (
        "empty-lists",
        b'{"prompt":[' + b",".join([b"[]"] * 20_000) + b"]}",
        400,
        "arrays and objects",
    ),
    ("huge-float", b'{"model":"default","prompt":"a","max_tokens":1e400}', 400, "overflows"),
    ("nan", b'{"model":"default","prompt":"a","temperature":NaN}', 400, "NaN"),
    ("surrogate", b'{"model":"default","prompt":"hello \\ud800","max_tokens":2}', 400, "surrogate"),
    ("utf8", b'{"model":"default","prompt":"\xff\xfe"}', 400, "UTF-8"),
    ("too-big", ok_body(prompt="word " * (MAX_BODY // 4)), 413, str(MAX_BODY)),
]


@pytest.mark.parametrize(("name", "body", "status", "says"), HOSTILE_BODIES)
def test_hostile_bodies_get_a_4xx_and_never_reach_a_model(
    spawn: Spawner,
    tmp_path: Path,
    models: dict[str, Proc],
    name: str,
    body: bytes,
    status: int,
    says: str,
) -> None:
    rs.write_release_cache(tmp_path)
    router = rs.start_router(spawn, tmp_path, *rs.pools(models), "--max-body-bytes", str(MAX_BODY))
    rid = f"hostile-{name}"
    for pin in (b"baseline", b"canary"):
        got, answer = raw_post(
            router.url, body, {"x-request-id": rid.encode(), "x-canary-variant": pin}
        )
        assert got == status, answer
        assert says in answer["error"]["message"], answer
    r = rs.completion(router.url, headers={"x-request-id": f"{rid}-next"})
    assert r.status_code == 200, r.text  # the router still serves
    wait_for(lambda: seen_by(models["b0"], f"{rid}-next"), what="the next request upstream")
    assert not seen_by(models["b0"], rid) and not seen_by(models["c0"], rid)


@pytest.mark.parametrize("header", ["authorization", "x-canary-variant", "tracestate", "x-user-id"])
def test_undecodable_headers_get_a_400_naming_the_header(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], header: str
) -> None:
    router = rs.start_router(spawn, tmp_path, [models["b0"].url])
    status, answer = raw_post(
        router.url, ok_body(), {header: b"\xff\xfe bad", "x-traffic-tag": b"undecodable"}
    )
    assert status == 400, answer
    assert answer["error"]["param"] == header and "ASCII" in answer["error"]["message"]
    assert not any(e.get("traffic_tag") == "undecodable" for e in models["b0"].log_events())
    assert rs.completion(router.url).status_code == 200


HEX32 = re.compile(r"^[0-9a-f]{32}$")
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


@pytest.mark.parametrize("value", [b"\xff\xfe bad", b"x" * 200])
@pytest.mark.parametrize("header", ["x-request-id", "traceparent", "x-traffic-tag"])
def test_malformed_colour_headers_are_replaced_never_forwarded(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc], header: str, value: bytes
) -> None:
    """The request's colour is made up (request id, trace) or dropped (tag) where the
    client's value is malformed: the request is served and the bad value goes nowhere."""
    router = rs.start_router(spawn, tmp_path, [models["b0"].url])
    ok_rid = f"colour-{header}-{len(value)}"
    sent = {"x-request-id": ok_rid.encode(), "x-traffic-tag": b"tag-ok", header: value}
    status, answer, headers = raw_post_answer(router.url, ok_body(), sent)
    assert status == 200, answer
    rid = headers["x-request-id"]
    if header == "x-request-id":
        assert HEX32.match(rid), rid  # made up by the router
    else:
        assert rid == ok_rid

    def model_line() -> dict[str, Any] | None:
        for ev in models["b0"].log_events():
            if ev.get("event") == "request_done" and ev.get("request_id") == rid:
                return ev
        return None

    line = wait_for(model_line, what=f"the model's log line for {rid}")
    assert isinstance(line, dict)
    assert TRACEPARENT.match(str(line["traceparent"])), line
    assert line["traffic_tag"] == (None if header == "x-traffic-tag" else "tag-ok")


# ------------------------------------------------------------------------------ pins


def test_pins_after_a_trip_are_409_and_never_reach_the_canary(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    router, api, _ = rs.router_on_release(spawn, tmp_path, *rs.pools(models), weight=100)
    before = rs.completion(
        router.url, headers={"x-canary-variant": "canary", "x-request-id": "pre"}
    )
    assert before.status_code == 200 and before.headers["x-served-by"] == "canary"
    wait_for(lambda: seen_by(models["c0"], "pre"), what="the canary to log a pinned request")
    rs.wait_revision(router, api.trip()["revision"])
    for i in range(20):
        r = rs.completion(
            router.url, headers={"x-canary-variant": "canary", "x-request-id": f"p{i}"}
        )
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "canary_off" and "phase tripped" in err["message"]
        assert err["param"] == "x-canary-variant"
    assert rs.metric(router, "router_canary_off_pins_total") == 20
    # A pin to the baseline still works; the canary logged none of the 20.
    r = rs.completion(router.url, headers={"x-canary-variant": "baseline", "x-request-id": "base"})
    assert r.status_code == 200
    wait_for(lambda: seen_by(models["b0"], "base"), what="the baseline request")
    assert not any(seen_by(models["c0"], f"p{i}") for i in range(20))


@pytest.mark.parametrize(
    ("cache", "says"),
    [
        (None, "no release config"),
        ({"phase": "rolled_back"}, "phase rolled_back"),
        ({"phase": "rolling_back"}, "phase rolling_back"),
        ({"quarantined": True}, "quarantined"),
    ],
)
def test_a_pin_to_a_canary_that_is_off_is_409(
    spawn: Spawner,
    tmp_path: Path,
    models: dict[str, Proc],
    cache: dict[str, Any] | None,
    says: str,
) -> None:
    if cache is not None:
        rs.write_release_cache(tmp_path, weight=50, **cache)
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    r = rs.completion(router.url, headers={"x-canary-variant": "canary", "x-request-id": "off"})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "canary_off" and says in r.json()["error"]["message"]
    assert rs.health(router)["config"]["canary_off"] is not None
    assert not seen_by(models["c0"], "off")


def test_a_pin_to_a_canary_held_at_weight_0_passes(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    rs.write_release_cache(tmp_path, weight=0)
    router = rs.start_router(spawn, tmp_path, *rs.pools(models))
    r = rs.completion(router.url, headers={"x-canary-variant": "canary"})
    assert r.status_code == 200 and r.headers["x-served-by"] == "canary"
    assert rs.health(router)["config"]["canary_off"] is None


# --------------------------------------------------------------------------- evidence


def _errors_fault(model: Proc, on: bool) -> None:
    faults = model.url + "/admin/faults"
    requests.delete(faults, headers=rs.ADMIN, timeout=5)
    if on:
        body = {"kind": "errors", "ttl_s": 60, "error_kind": "http_500"}
        assert requests.post(faults, json=body, headers=rs.ADMIN, timeout=5).status_code == 201


def _outcome_ids(gate: rs.GateReceiver) -> list[str]:
    return [o["request_id"] for o in gate.records("outcomes")]


def shadowing_router(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver, baseline: Proc, canary: Proc
) -> Proc:
    """A router with every user on ``canary`` (a release cache at weight 100) and a shadow
    copy of every short request (bucket 0-512) on ``baseline``: its samples go to ``gate``."""
    rs.write_release_cache(tmp_path, weight=100)
    return rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--shadow-rates", "0-512=1", gate=gate.url
    )


def test_pinned_requests_are_never_gate_evidence(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    _errors_fault(canary, on=True)  # every canary answer is a 500
    # canary live: pinned requests could shadow
    router = shadowing_router(spawn, tmp_path, gate, baseline, canary)
    # The attack: unauthenticated pins with a lone surrogate, then plain 500s.
    surrogate = b'{"model":"default","prompt":"hello \\ud800","max_tokens":2}'
    for _ in range(20):
        status, _ = raw_post(router.url, surrogate, {"x-canary-variant": b"canary"})
        assert status == 400
    for i in range(20):
        r = rs.completion(
            router.url, headers={"x-canary-variant": "canary", "x-request-id": f"c{i}"}
        )
        assert r.status_code == 500
    for i in range(5):
        r = rs.completion(
            router.url, headers={"x-canary-variant": "baseline", "x-request-id": f"b{i}"}
        )
        assert r.status_code == 200
    # An unpinned request is evidence: once its outcome arrived, all earlier ones would have.
    assert rs.completion(router.url, headers={"x-request-id": "barrier"}).status_code == 500
    wait_for(lambda: "barrier" in _outcome_ids(gate), what="the unpinned outcome")
    assert _outcome_ids(gate) == ["barrier"]
    assert gate.records("comparisons") == []
    # Only the unpinned request planned a shadow copy.
    assert rs.metric(router, "router_shadow_requests_total") == 1


def test_a_failure_both_variants_share_is_not_canary_evidence(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    _errors_fault(baseline, on=True)
    _errors_fault(canary, on=True)
    router = shadowing_router(spawn, tmp_path, gate, baseline, canary)
    for i in range(5):
        r = rs.completion(router.url, headers={"x-request-id": f"both{i}"})
        assert r.status_code == 500 and r.headers["x-served-by"] == "canary"
    wait_for(
        lambda: rs.metric(router, "router_both_failed_total") == 5, what="5 shared failures held"
    )
    # Only the canary fails now: that error is evidence.
    _errors_fault(baseline, on=False)
    assert rs.completion(router.url, headers={"x-request-id": "canary-only"}).status_code == 500
    wait_for(lambda: "canary-only" in _outcome_ids(gate), what="the canary's own failure")
    outcome = next(o for o in gate.records("outcomes") if o["request_id"] == "canary-only")
    assert outcome["variant"] == "canary" and outcome["error"] == "http_5xx"
    assert _outcome_ids(gate) == ["canary-only"]


# --------------------------------------------------------------------- broken kernels


def _kernel_fault(model: Proc, mode: str) -> None:
    faults = model.url + "/admin/faults"
    requests.delete(faults, headers=rs.ADMIN, timeout=5)
    body = {"kind": "kernel", "ttl_s": 60, "mode": mode, "min_prompt_tokens": 50}
    r = requests.post(faults, json=body, headers=rs.ADMIN, timeout=5)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("nan-logits", "non_finite_logprobs"),
        ("inf-logits", "non_finite_logprobs"),
        ("garbage", "missing_logprobs"),
    ],
)
def test_a_broken_canary_kernel_is_maximal_divergence_and_an_error(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver, mode: str, reason: str
) -> None:
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    _kernel_fault(canary, mode)  # long prompts only (>= 50 tokens)
    router = shadowing_router(spawn, tmp_path, gate, baseline, canary)
    ids = []
    for i, stream in enumerate((True, False, True, False)):
        rid = f"{mode}-{i}"
        ids.append(rid)
        r = rs.completion(
            router.url,
            make_prompt(80, seed=i),
            headers={"x-request-id": rid},
            max_tokens=4,
            temperature=0,
            stream=stream,
        )
        assert r.status_code == 200 and r.headers["x-served-by"] == "canary"
        # Logprobs the user did not ask for are stripped: what the user reads is strict.
        if stream:
            for block in r.content.split(b"\n\n"):
                if block.startswith(b"data: {"):
                    strictjson.loads(block[len(b"data: ") :])
        else:
            strictjson.loads(r.content)
    # A short prompt is healthy: a comparison like any other.
    assert rs.completion(router.url, "a b c", headers={"x-request-id": "short"}).status_code == 200

    def comparisons() -> dict[str, dict[str, Any]]:
        return {c["request_id"]: c for c in gate.records("comparisons")}

    wait_for(lambda: set(ids) | {"short"} <= set(comparisons()), timeout=20, what="comparisons")
    for rid in ids:
        c = comparisons()[rid]
        assert c["pair"] == "baseline-canary" and c["invalid"] == reason
        assert c["kl_mean"] == c["kl_first"] == KL_MAX_NATS and c["top1_agree"] == 0.0
    assert "invalid" not in comparisons()["short"]
    assert comparisons()["short"]["kl_mean"] < KL_MAX_NATS
    outcomes = {o["request_id"]: o for o in gate.records("outcomes")}
    assert all(outcomes[rid]["error"] == "bad_output" for rid in ids if mode != "garbage")
    assert outcomes["short"]["error"] is None
    assert rs.metric(router, "router_shadow_requests_total", result="canary_invalid") == 4


def test_a_broken_baseline_is_dropped_not_counted_as_canary_drift(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    broken = rs.start_model(spawn, "v1")
    healthy = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    _kernel_fault(broken, "nan-logits")
    # Users on the canary; their shadow copies go to the broken baseline.
    router = shadowing_router(spawn, tmp_path, gate, broken, canary)
    for i in range(3):
        r = rs.completion(router.url, make_prompt(80, seed=i), max_tokens=4, temperature=0)
        assert r.status_code == 200 and r.headers["x-served-by"] == "canary"
    wait_for(
        lambda: rs.metric(router, "router_shadow_requests_total", result="baseline_invalid") == 3,
        what="3 dropped comparisons",
    )
    # The noise floor: one of two baseline replicas broken, every request compared.
    noise = noise_router(
        spawn, tmp_path, [broken.url, healthy.url], router_id="router-noise", gate=gate.url
    )
    for i in range(3):
        r = rs.completion(noise.url, make_prompt(80, seed=i), max_tokens=4, temperature=0)
        assert r.status_code == 200
    wait_for(
        lambda: rs.metric(noise, "router_shadow_requests_total", result="invalid_dropped") == 3,
        what="3 dropped noise comparisons",
    )
    assert rs.completion(noise.url, headers={"x-request-id": "barrier"}).status_code == 200
    wait_for(lambda: "barrier" in _outcome_ids(gate), what="a later batch")
    # None of the long prompts (the broken ones) reached the gate as a comparison.
    assert [c for c in gate.records("comparisons") if c["prompt_tokens"] == 80] == []


def test_nesting_100k_deep_at_the_default_body_limit_is_a_400(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    router = rs.start_router(spawn, tmp_path, [models["b0"].url])
    body = b'{"model":"default","prompt":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, answer = raw_post(router.url, body)
    assert status == 400 and "arrays and objects" in answer["error"]["message"], answer
    assert rs.completion(router.url).status_code == 200
