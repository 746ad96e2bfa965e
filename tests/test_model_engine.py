"""The next-token model, generation and capacity model in-process: determinism, the
calibrated drift between versions, the kernel fault's shape (threshold, growth with
length, magnitude), sampling, stop sequences, and the slot scheduler's FIFO queue."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest

from canarystack.model.capacity import CapacityModel, SlotScheduler
from canarystack.model.engine import (
    KernelFault,
    NextTokenModel,
    generate,
    kl_divergence,
    mix64,
    prompt_context,
)
from canarystack.model.generation import Generation, token_texts
from canarystack.tokenizer import make_prompt

CONTEXTS = [mix64(i * 7919 + 3) for i in range(2000)]


def mean_kl(p: NextTokenModel, q: NextTokenModel, scale_q: float = 0.0) -> float:
    return float(
        np.mean([kl_divergence(p.distribution(c), q.distribution(c, scale_q)) for c in CONTEXTS])
    )


def test_distributions_are_proper_and_peaked() -> None:
    model = NextTokenModel("v1")
    top1 = []
    for c in CONTEXTS[:500]:
        d = model.distribution(c)
        assert math.isclose(float(np.exp(d.full()).sum()), 1.0, rel_tol=1e-9)
        assert len(set(d.ids)) == len(d.ids)
        top1.append(math.exp(max(d.logprobs)))
    # Realistic: usually a clear favourite, sometimes a close race.
    assert 0.4 < float(np.mean(top1)) < 0.8
    assert min(top1) < 0.35 and max(top1) > 0.9


def test_same_version_is_bit_identical_and_versions_differ() -> None:
    a, b = NextTokenModel("v1"), NextTokenModel("v1")
    words = make_prompt(300, seed=4).split()
    sa, sb = generate(a, words, 32), generate(b, words, 32)
    assert [s.dist for s in sa] == [s.dist for s in sb]
    other = NextTokenModel("v2")
    assert generate(other, words, 1)[0].dist != sa[0].dist


@pytest.mark.parametrize("drift", [0.01, 0.05])
def test_drift_between_versions_is_calibrated(drift: float) -> None:
    v1 = NextTokenModel("v1", drift=drift)
    v2 = NextTokenModel("v2", drift=drift)
    assert mean_kl(v1, v2) == pytest.approx(drift, rel=0.25)


def test_zero_drift_is_the_family_base() -> None:
    base_a = NextTokenModel("v1", drift=0)
    base_b = NextTokenModel("v7", drift=0)
    assert mean_kl(base_a, base_b) == 0.0
    other_family = NextTokenModel("v1", drift=0, family_seed=1)
    assert mean_kl(base_a, other_family) > 1.0


def test_kernel_fault_threshold_growth_and_magnitude() -> None:
    model = NextTokenModel("v2")
    fault = KernelFault()  # fp8-kv-scale, 2048 tokens, magnitude 1
    assert model.kernel_scale(2047, fault) == 0.0
    assert model.kernel_scale(100, None) == 0.0

    def effect(tokens: int, f: KernelFault) -> tuple[float, float]:
        scale = model.kernel_scale(tokens, f)
        kls, flips = [], 0
        for c in CONTEXTS:
            healthy, faulty = model.distribution(c), model.distribution(c, scale)
            kls.append(kl_divergence(healthy, faulty))
            flips += healthy.argmax() != faulty.argmax()
        return float(np.mean(kls)), flips / len(CONTEXTS)

    kl_2k, flips_2k = effect(2048, fault)
    kl_4k, flips_4k = effect(4096, fault)
    kl_8k, _ = effect(8192, fault)
    assert 0.1 <= kl_4k <= 0.2
    assert flips_4k > 0.1  # the top token flips on a visible share of positions
    assert kl_2k < kl_4k < kl_8k and flips_2k < flips_4k
    kl_small, _ = effect(4096, KernelFault(magnitude=0.25))
    assert kl_small < 0.02  # magnitude is a real knob: small values, small drift


def test_sampling_is_seeded_and_greedy_is_argmax() -> None:
    model = NextTokenModel("v1")
    words = make_prompt(50, seed=1).split()
    greedy = generate(model, words, 20)
    assert all(s.token_id == s.dist.argmax() for s in greedy)
    a = generate(model, words, 20, temperature=1.0, seed=42)
    b = generate(model, words, 20, temperature=1.0, seed=42)
    c = generate(model, words, 20, temperature=1.0, seed=43)
    assert [s.token_id for s in a] == [s.token_id for s in b]
    assert [s.token_id for s in a] != [s.token_id for s in c]
    # A tiny nucleus keeps only the favourite: sampling becomes greedy.
    nucleus = generate(model, words, 20, temperature=1.0, top_p=0.01, seed=7)
    assert [s.token_id for s in nucleus] == [s.token_id for s in greedy]


def test_stop_sequence_cuts_output_and_counts_the_stopping_token() -> None:
    model = NextTokenModel("v1")
    words = make_prompt(20, seed=2).split()
    full = Generation(model, words, 12).run()
    third = token_texts()[full.pieces[2].token_id]
    stop = third.strip()[:2]
    out = Generation(model, words, 12, stop=[stop]).run()
    text = "".join(p.text for p in out.pieces)
    assert stop not in text
    assert out.finish_reason == "stop" and out.stop_reason == stop
    full_text = "".join(p.text for p in full.pieces)
    assert full_text.startswith(text) and full_text[len(text) :].startswith(stop)
    assert out.completion_tokens <= 3
    assert full.finish_reason == "length" and full.completion_tokens == 12


def test_prompt_context_depends_on_every_token_and_their_order() -> None:
    words = make_prompt(500, seed=3).split()
    key = prompt_context(words)
    assert prompt_context(list(words)) == key
    assert prompt_context([*words[:-1], "zz"]) != key
    assert prompt_context([words[1], words[0], *words[2:]]) != key


def test_capacity_model_formulas() -> None:
    cap = CapacityModel(
        slots=4,
        ttft_base_s=0.02,
        prefill_s_per_1k=0.05,
        itl_base_s=0.01,
        itl_batch_k=2.0,
        itl_jitter=0.0,
    )
    assert cap.prefill_s(4000) == pytest.approx(0.22)
    rng = random.Random(0)
    assert cap.itl_s(0, rng) == pytest.approx(0.01)
    assert cap.itl_s(4, rng) == pytest.approx(0.03)
    jittery = CapacityModel(itl_base_s=0.01, itl_batch_k=0, itl_jitter=0.1)
    gaps = [jittery.itl_s(0, rng) for _ in range(200)]
    assert 0.009 <= min(gaps) < max(gaps) <= 0.011
    with pytest.raises(ValueError, match="slots"):
        CapacityModel(slots=0)


def test_slot_scheduler_is_fifo_and_survives_cancellation() -> None:
    async def scenario() -> list[int]:
        sched = SlotScheduler(1)
        order: list[int] = []
        await sched.acquire()  # the only slot

        async def worker(i: int) -> None:
            await sched.acquire()
            order.append(i)
            await asyncio.sleep(0)
            sched.release()

        tasks = [asyncio.create_task(worker(i)) for i in range(4)]
        await asyncio.sleep(0.01)
        assert sched.waiting == 4 and sched.running == 1
        tasks[1].cancel()  # a client that gave up while queued
        await asyncio.sleep(0.01)
        assert sched.waiting == 3
        sched.release()
        await asyncio.gather(*(t for i, t in enumerate(tasks) if i != 1))
        assert sched.running == 0 and sched.waiting == 0
        return order

    assert asyncio.run(scenario()) == [0, 2, 3]
