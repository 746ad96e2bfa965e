"""A kernel fault's mode is a capability of the canary's engine (issue #28).

A real engine cannot make NaN logprobs or garbage on request: its kernel fault is a build
(vLLM's bfloat16, its FP8 KV cache where the CPU has AVX-512; llama.cpp's quantized KV
cache). Its pod states the builds it can make (``/health`` ``kernel_modes``), and
``gameday run`` says *not applicable* to an experiment that needs another, before any
fault, instead of failing it halfway (``gameday.run.capabilities``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gameday.api import StackApi
from gameday.run.capabilities import missing, needs
from gameday.targets import load_target, parse_target
from gameday.targets.health import StatedFaults, stated_faults
from tests.run_support import write_target

ROOT = Path(__file__).resolve().parents[1]
# A vLLM canary on an AVX2-only CPU: the kernel fault only, and no FP8 KV cache.
VLLM_HERE = StatedFaults(
    {"model-canary": frozenset({"drop_colour", "kernel"})}, frozenset({"bf16"})
)


def _experiment(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "experiments" / name).read_text()))


def test_the_mode_an_experiment_needs_is_read_through_its_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exp = _experiment("router/faulty-kernel.yaml")
    monkeypatch.delenv("GAMEDAY_KERNEL_MODE", raising=False)
    assert "kernel-mode:fp8-kv-scale" in needs(exp)  # the configuration's default
    monkeypatch.setenv("GAMEDAY_KERNEL_MODE", "bf16")
    assert "kernel-mode:bf16" in needs(exp)  # what `chaos run` will pass it
    assert "kernel-mode:nan-logits" in needs(_experiment("router/broken-kernel.yaml"))


def test_a_mode_the_canary_cannot_build_is_not_applicable_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = parse_target({"kind": "local"})
    reasons = missing(local, _experiment("router/broken-kernel.yaml"), VLLM_HERE)
    assert len(reasons) == 1
    assert reasons[0].startswith("not applicable: target 'local' has a canary whose engine")
    assert "builds the kernel modes bf16 (its /health kernel_modes), not 'nan-logits'" in reasons[0]
    assert reasons[0].endswith("which action 'canary-kernel-breaks' needs")
    errors = missing(local, _experiment("router/canary-errors.yaml"), VLLM_HERE)
    assert errors == [
        "not applicable: target 'local' has a model-canary that takes the faults drop_colour, "
        "kernel (its /health fault_kinds), not errors, which action 'canary-fails' needs"
    ]
    monkeypatch.setenv("GAMEDAY_KERNEL_MODE", "bf16")
    assert missing(local, _experiment("router/faulty-kernel.yaml"), VLLM_HERE) == []
    monkeypatch.setenv("GAMEDAY_KERNEL_MODE", "fp8-kv")
    assert "not 'fp8-kv'" in missing(local, _experiment("router/faulty-kernel.yaml"), VLLM_HERE)[0]
    # A canary that states nothing (the simulator) can be given every fault and mode.
    assert missing(local, _experiment("router/broken-kernel.yaml"), StatedFaults()) == []
    assert missing(local, _experiment("router/canary-errors.yaml"), StatedFaults()) == []


def test_a_kubernetes_rollout_of_a_bad_build_needs_the_mode_it_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """experiments/k8s/faulty-canary-rollout.yaml rolls out ``--kernel-fault
    ${kernel_mode}:${kernel_min_prompt_tokens}``: the mode is read out of that string,
    so a vLLM canary without AVX-512 is not applicable to the FP8 build, said before the
    rollout, and applicable to bf16."""
    exp = _experiment("k8s/faulty-canary-rollout.yaml")
    monkeypatch.delenv("GAMEDAY_KERNEL_MODE", raising=False)
    monkeypatch.setenv("GAMEDAY_KERNEL_MIN_PROMPT_TOKENS", "0")
    assert "kernel-mode:fp8-kv-scale" in needs(exp)
    k8s = load_target(ROOT / "deploy" / "loopback" / "target.yaml")
    (reason,) = missing(k8s, exp, VLLM_HERE)
    assert "not 'fp8-kv-scale'" in reason
    assert reason.endswith("which action 'roll-out-a-bad-canary-build' needs")
    monkeypatch.setenv("GAMEDAY_KERNEL_MODE", "bf16")
    assert "kernel-mode:bf16" in needs(exp)
    assert missing(k8s, exp, VLLM_HERE) == []


class _Health(BaseHTTPRequestHandler):
    body: dict[str, Any] = {}

    def do_GET(self) -> None:
        data = json.dumps(self.body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[tuple[Path, type[_Health]]]:
    """A local target whose canary replica is a real HTTP server on loopback."""
    handler = type("Health", (_Health,), {"body": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state = tmp_path / "stack"
    state.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    components = [{"name": "model-canary-0", "role": "model-canary", "url": url}]
    (state / "stack.json").write_text(json.dumps({"release": "r", "components": components}))
    try:
        yield write_target(tmp_path / "target.yaml", state), handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_runner_reads_what_the_canary_states(canary: tuple[Path, type[_Health]]) -> None:
    path, handler = canary
    target = load_target(path)
    with requests.Session() as session:
        api = StackApi(session, target)
        handler.body = {"engine": "vllm", "fault_kinds": ["kernel"], "kernel_modes": ["bf16"]}
        assert stated_faults(api) == StatedFaults(
            {"model-canary": frozenset({"kernel"})}, frozenset({"bf16"})
        )
        handler.body = {"status": "ok"}  # the simulator states none: every fault
        assert stated_faults(api) == StatedFaults()
        handler.body = {"fault_kinds": "kernel", "kernel_modes": None}  # not lists: unknown
        assert stated_faults(api) == StatedFaults()
