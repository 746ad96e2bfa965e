"""The foreign stack on real vLLM servers (``foreign.py up --engine vllm --judge``; marker
``vllm``, ``make test-vllm``): the alert-driven gate most teams run, in front of the engine
most teams run, with no canarystack part around the engines.

- Envoy splits and pins between two vLLM OpenAI servers (float32, one core each, the
  generated model), the canary behind the harness's fault proxy;
- the drift judge scores vLLM's own answers teacher-forced (vLLM answers ``echo`` with
  prompt logprobs), so a healthy canary keeps it passing;
- a faulty kernel behind the fault proxy (its answers stay fast 200s) fires the alert on
  the judge's verdict, on **drift**, and the hook sets the canary's weight to 0.

One stack for the module (two vLLMs start in 1-2 minutes here); stopped by PID through
``foreign.py down``. Traffic to 127.0.0.1 only, bounded in count and time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from canarystack.engine import vllm
from canarystack.tokenizer import make_prompt
from tests.procs import wait_for
from tests.test_foreign_judge import _base_with_judge_port, fault_zeroes_the_weight, users
from tests.test_foreign_stack import _foreign, needs_stack

pytestmark = [
    pytest.mark.vllm,
    needs_stack,
    pytest.mark.skipif(
        not Path(vllm.default_python()).exists(),
        reason=f"no vLLM environment at {vllm.default_python()}: run `make test-vllm`",
    ),
    pytest.mark.timeout(1800),
]
ROOT = Path(__file__).resolve().parents[1]
WORDS = 300  # prompt words: well inside the generated model's 2,048 tokens


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    state_dir = tmp_path_factory.mktemp("foreign-vllm") / "state"
    base = str(_base_with_judge_port())
    up = _foreign("up", state_dir, "--base-port", base, "--judge", "--engine", "vllm")
    try:
        assert up.returncode == 0, f"foreign.py up --engine vllm failed:\n{up.stderr}"
        info = json.loads((state_dir / "foreign.json").read_text())
        assert info["engine"] == "vllm" and info["judge"]
        yield info
    finally:
        down = _foreign("down", state_dir)
        assert down.returncode == 0, f"foreign.py down failed:\n{down.stderr}"
        assert json.loads(down.stdout)["still_alive"] == []


def _complete(info: dict[str, Any], seed: int, pin: str | None = None) -> requests.Response:
    headers = {"x-canary-variant": pin} if pin else {}
    body = {"model": "default", "prompt": make_prompt(WORDS, seed=seed), "max_tokens": 4}
    url = f"{info['urls']['listener']}/v1/completions"
    return requests.post(url, json=body, headers=headers, timeout=60)


def _verdict(info: dict[str, Any]) -> dict[str, Any]:
    return dict(requests.get(f"{info['urls']['judge']}/v1/analysis/default", timeout=5).json())


def test_envoy_serves_vllm_on_both_pins_and_the_engines_are_vllm(stack: dict[str, Any]) -> None:
    for pin in ("baseline", "canary"):
        resp = _complete(stack, 1, pin=pin)
        assert resp.status_code == 200, resp.text[:300]
        assert resp.headers["x-served-by"] == pin
        assert resp.json()["usage"]["prompt_tokens"] > 0
    models = requests.get(f"{stack['urls']['baseline']}/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "default" and models["data"][0]["owned_by"] == "vllm"
    match = stack["programs"]["engine-canary"]["match"]
    port = stack["ports"]["canary"]
    assert match == f"--served-model-name default --host 127.0.0.1 --port {port}"
    # targets/foreign-vllm.yaml names the canary engine for a pod kill the same way.
    target = yaml.safe_load((ROOT / "targets" / "foreign-vllm.yaml").read_text())
    kill = target["components"]["model-canary"]["kill"]["match"]
    assert kill[:-1] == match.split()[:-1] and kill[-1] == "18703"


def test_the_judge_passes_a_healthy_vllm_canary_then_a_faulty_kernel_trips_it_on_drift(
    stack: dict[str, Any],
) -> None:
    with users(stack, _complete):
        # Healthy first: the judge compares (teacher-forced on vLLM) as many times as a
        # verdict needs, and passes: two float32 vLLMs on one core each agree.
        wait_for(
            lambda: _verdict(stack)["comparisons"] >= _verdict(stack)["min_comparisons"],
            timeout=300,
            interval=1.0,
            what="as many judged comparisons of the healthy canary as a verdict needs",
        )
        healthy = _verdict(stack)
        assert healthy["verdict"] == "pass", healthy
        assert all(d["kl_mean"] < 1e-6 for d in healthy["drift"].values()), healthy["drift"]
        # vLLM scores the baseline's answer as an echoed prompt: teacher forcing holds.
        assert healthy["scoring"] == {"mode": "teacher-forced", "why": None}, healthy
        fault = {"kind": "kernel", "mode": "fp8-kv-scale", "min_prompt_tokens": 0, "ttl_s": 300}
        assert "CanaryOutputDrift" in fault_zeroes_the_weight(stack, fault, timeout_s=300)
        verdict = _verdict(stack)
        assert verdict["verdict"] == "fail" and verdict["test"] == "drift", verdict
