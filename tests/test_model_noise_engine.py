"""The engine's batch noise and benign kernel modes as pure functions (#14): what keys the
noise (seed, running count at admission), that it is off at 0, and the sizes of the
benign modes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from canarystack.model.engine import (
    BATCH_NOISE_KL,
    QUANTIZED_KL_AT_1,
    KernelFault,
    NextTokenModel,
    generate,
    kl_divergence,
    prompt_context,
)
from canarystack.model.generation import Generation
from canarystack.tokenizer import make_prompt

CONTEXTS = [prompt_context(make_prompt(20, seed=i).split()) for i in range(300)]
WORDS = make_prompt(40, seed=5).split()


def mean_kl(p: NextTokenModel, kp: int, q: NextTokenModel, kq: int, scale: float = 0.0) -> float:
    return float(
        np.mean([kl_divergence(p.distribution(c, 0.0, kp), q.distribution(c, scale, kq))
                 for c in CONTEXTS])
    )  # fmt: skip


def test_the_batch_key_is_the_seed_and_the_running_count() -> None:
    a = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=1)
    b = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=2)
    assert a.batch_key(3) == a.batch_key(3) != 0
    assert len({a.batch_key(n) for n in range(1, 33)}) == 32  # every batch size its own
    assert a.batch_key(3) != b.batch_key(3)
    c = CONTEXTS[0]
    assert a.distribution(c, 0.0, a.batch_key(3)) == a.distribution(c, 0.0, a.batch_key(3))
    assert a.distribution(c, 0.0, a.batch_key(3)) != a.distribution(c, 0.0, a.batch_key(4))
    # Two batches of one process differ by the calibrated whole-vocabulary KL.
    kl = mean_kl(a, a.batch_key(1), a, a.batch_key(2))
    assert 0.7 * BATCH_NOISE_KL < kl < 1.3 * BATCH_NOISE_KL


def test_batch_noise_zero_is_the_pure_model() -> None:
    off = NextTokenModel("v1", batch_noise=0.0, noise_seed=9, running=lambda: 7)
    pure = NextTokenModel("v1")
    assert off.batch_key() == off.batch_key(5) == 0
    assert [off.distribution(c, 0.0, off.batch_key()) for c in CONTEXTS[:50]] == [
        pure.distribution(c) for c in CONTEXTS[:50]
    ]


def test_a_generation_takes_the_running_count_at_its_first_token() -> None:
    running = [9]  # the server's count while the request waits for a slot
    model = NextTokenModel(
        "v1", batch_noise=BATCH_NOISE_KL, noise_seed=3, running=lambda: running[0]
    )
    gen = Generation(model, WORDS, 6)
    running[0] = 2  # admitted: this is the batch it runs in
    first = gen.next_piece()
    running[0] = 30  # later arrivals do not change a running request's batch
    rest = gen.run().pieces
    got = [p.token_id for p in [first, *rest] if p is not None]
    want = generate(model, WORDS, 6, running=2)
    assert got == [s.token_id for s in want]
    assert [p.step.dist for p in [first, *rest] if p is not None] == [s.dist for s in want]
    assert want != generate(model, WORDS, 6, running=9)


@pytest.mark.parametrize("value", [-1e-3, math.nan, math.inf, 0.2])
def test_a_bad_batch_noise_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="batch_noise must be in"):
        NextTokenModel("v1", batch_noise=value)


def test_the_benign_modes_sizes() -> None:
    model = NextTokenModel("v1", batch_noise=BATCH_NOISE_KL, noise_seed=1)
    quant = KernelFault(mode="quantized", min_prompt_tokens=0)
    # Independent of the prompt length, unlike fp8-kv-scale.
    assert model.kernel_scale(10, quant) == model.kernel_scale(10_000, quant) > 0
    key = model.batch_key(1)
    kl_q = mean_kl(model, key, model, key, model.kernel_scale(10, quant))
    assert 0.6 * QUANTIZED_KL_AT_1 < kl_q < 1.4 * QUANTIZED_KL_AT_1
    numerics = KernelFault(mode="numerics", min_prompt_tokens=0, magnitude=2.0)
    kl_n = mean_kl(model, key, model, key, model.kernel_scale(10, numerics))
    assert 0.7 * 4 * BATCH_NOISE_KL < kl_n < 1.3 * 4 * BATCH_NOISE_KL
    # numerics is the process's own noise profile: none on a batch-invariant one.
    assert NextTokenModel("v1").kernel_scale(10, numerics) == 0.0
    # Below the threshold, untouched as every kernel mode.
    assert model.kernel_scale(10, KernelFault(mode="quantized", min_prompt_tokens=11)) == 0.0
