"""Drift seen through the HTTP API, as the router and the oracle will see it: two
versions differ by the configured mean KL (computed from returned logprobs), and the
kernel fault perturbs only prompts at or above its threshold — by exactly the engine's
faulty distribution, growing with length."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from canarystack.model.engine import KernelFault, NextTokenModel, prompt_context
from canarystack.tokenizer import make_prompt, vocab
from tests.model_helpers import FAST, clear_faults, complete, inject, kl_from_top, module_spawner
from tests.procs import Proc

TOP = 20  # all 8 candidates plus the first tail tokens: KL from them is exact


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    with module_spawner(tmp_path_factory.mktemp("model-drift")) as spawn:
        yield {
            "v1": spawn("canarystack.model", "--version", "v1", *FAST),
            "v2": spawn("canarystack.model", "--version", "v2", *FAST),
            "v3": spawn("canarystack.model", "--version", "v3", "--drift", "0.05", *FAST),
        }


def first_position(proc: Proc, prompts: list[str]) -> list[dict[str, float]]:
    """The top-TOP logprobs at position 0 for each prompt (greedy, one token)."""

    def one(prompt: str) -> dict[str, float]:
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": TOP}
        out: dict[str, Any] = complete(proc, body)
        top: dict[str, float] = out["choices"][0]["logprobs"]["top_logprobs"][0]
        return top

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, prompts))


def test_versions_differ_by_the_configured_drift(servers: dict[str, Proc]) -> None:
    prompts = [make_prompt(30, seed=1000 + i) for i in range(150)]
    v1 = first_position(servers["v1"], prompts)
    v2 = first_position(servers["v2"], prompts)
    v3 = first_position(servers["v3"], prompts)
    kl_12 = float(np.mean([kl_from_top(a, b) for a, b in zip(v1, v2, strict=True)]))
    kl_13 = float(np.mean([kl_from_top(a, b) for a, b in zip(v1, v3, strict=True)]))
    # Default drift 0.01 each: about 0.01. Drift 0.05 against 0.01: about 0.03.
    assert 0.006 < kl_12 < 0.016
    assert 0.018 < kl_13 < 0.045
    # The HTTP figure is the engine's exact KL for those contexts.
    m1, m2 = NextTokenModel("v1"), NextTokenModel("v2")
    from canarystack.model.engine import kl_divergence

    exact = np.mean(
        [
            kl_divergence(m1.distribution(c), m2.distribution(c))
            for c in (prompt_context(p.split()) for p in prompts)
        ]
    )
    assert kl_12 == pytest.approx(exact, rel=1e-6)


def test_kernel_fault_only_above_threshold_and_exactly_the_engines(
    servers: dict[str, Proc],
) -> None:
    proc = servers["v2"]
    long_prompts = [make_prompt(4096, seed=2000 + i) for i in range(60)]
    short_prompts = [make_prompt(2000, seed=3000 + i) for i in range(20)]
    healthy_long = first_position(proc, long_prompts)
    healthy_short = first_position(proc, short_prompts)
    inject(proc, {"kind": "kernel", "ttl_s": 60, "mode": "fp8-kv-scale"})
    try:
        faulty_long = first_position(proc, long_prompts)
        faulty_short = first_position(proc, short_prompts)
    finally:
        clear_faults(proc)
    assert faulty_short == healthy_short  # below min_prompt_tokens: untouched, bit for bit
    kls = [kl_from_top(a, b) for a, b in zip(healthy_long, faulty_long, strict=True)]
    flips = sum(
        max(a, key=a.__getitem__) != max(b, key=b.__getitem__)
        for a, b in zip(healthy_long, faulty_long, strict=True)
    )
    assert 0.06 < float(np.mean(kls)) < 0.3  # about 0.15 (the engine test pins it closer)
    assert flips >= 3  # the top token flips on a visible share (~25 %) of 60 prompts
    # The served distribution is the engine's faulty one, exactly.
    model = NextTokenModel("v2")
    scale = model.kernel_scale(4096, KernelFault())
    words = vocab()
    for prompt, got in zip(long_prompts[:10], faulty_long[:10], strict=True):
        dist = model.distribution(prompt_context(prompt.split()), scale)
        assert got == {" " + words[t]: v for t, v in dist.top(TOP)}
    # After clearing, the long prompts are healthy again.
    assert first_position(proc, long_prompts[:10]) == healthy_long[:10]


def test_kernel_magnitude_and_threshold_are_knobs(servers: dict[str, Proc]) -> None:
    proc = servers["v1"]
    prompts = [make_prompt(1200, seed=4000 + i) for i in range(40)]
    healthy = first_position(proc, prompts)
    inject(proc, {"kind": "kernel", "ttl_s": 60, "min_prompt_tokens": 1000, "magnitude": 0.3})
    try:
        small = first_position(proc, prompts)
    finally:
        clear_faults(proc)
    inject(proc, {"kind": "kernel", "ttl_s": 60, "min_prompt_tokens": 1000, "magnitude": 3.0})
    try:
        big = first_position(proc, prompts)
    finally:
        clear_faults(proc)
    kl_small = np.mean([kl_from_top(a, b) for a, b in zip(healthy, small, strict=True)])
    kl_big = np.mean([kl_from_top(a, b) for a, b in zip(healthy, big, strict=True)])
    assert 0 < kl_small < 0.02 < kl_big
