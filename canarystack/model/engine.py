"""The simulated engine's next-token model: deterministic, cheap, and honest about drift.

A next-token distribution depends only on (family seed, version, context), where the
context is a 64-bit key chained from the prompt's tokens and every token generated so
far (so the position is part of it). Two processes of one version therefore return
bit-identical logprobs for the same request, and greedy continuations diverge after a
flipped token exactly as a real model's would.

The representation keeps a token to a few microseconds of pure Python: each distribution
is ``CANDIDATES`` candidate tokens with explicit logits plus one *tail* item whose mass
is spread evenly over the other ``vocab_size - CANDIDATES`` tokens. The random numbers
come from tables drawn once per process by a seeded numpy generator (family seed), and
a splitmix64 hash of the context picks the rows — no Generator per token.

- The family (``seed``) fixes the base distributions every version shares.
- A version adds its own Gaussian logit noise, scaled so that two versions with drift
  ``d`` differ by a mean KL of about ``d`` (``drift=0`` is the family base itself).
- The ``kernel`` fault (``fp8-kv-scale``) adds a further perturbation, only for prompts
  of at least ``min_prompt_tokens`` tokens, whose size grows with the prompt length:
  mean KL about ``KERNEL_KL_AT_REF * magnitude**2 * prompt_tokens / KERNEL_REF_TOKENS``.
- The *broken* kernel modes (``BROKEN_MODES``) model an engine whose numbers are gone
  rather than drifted, again only for prompts at or above the threshold (``magnitude``
  plays no part): ``nan-logits`` (every logit NaN: greedy argmax and the exponential-race
  sampler both pick token id 0 at every position), ``inf-logits`` (the softmax
  normaliser overflowed: the token order is the healthy one, so the text is unchanged,
  but every logprob is ``-inf``) and ``garbage`` (tokens drawn uniformly from the whole
  vocabulary, unrelated to the context). How they look on the wire is
  ``canarystack.model.render``'s business.

Logprobs are the raw model's (before temperature and top_p), as vLLM reports them.

This module must never do I/O, sleep, or keep per-request state between calls.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from canarystack.tokenizer import VOCAB_SIZE

CANDIDATES = 8
TABLE_ROWS = 4096
_ROW_MASK = TABLE_ROWS - 1
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

# The kernel fault's size at the reference length and magnitude 1 (mean KL, nats).
KERNEL_REF_TOKENS = 4096
KERNEL_KL_AT_REF = 0.15
DRIFT_MODE = "fp8-kv-scale"
BROKEN_MODES = ("nan-logits", "inf-logits", "garbage")
KERNEL_MODES = (DRIFT_MODE, *BROKEN_MODES)
# The token every position gets when all logits are NaN (argmax of all-NaN is index 0).
NAN_TOKEN_ID = 0

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5

# Distinct hash salts, so a version's noise and the kernel's noise are independent.
_FAMILY_SALT = 0x5EED_F00D_0000_0001
_KERNEL_SALT = 0x6B65_726E_656C_0F8A


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-mixed 64-bit hash of a 64-bit integer."""
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _key_of_text(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def prompt_context(prompt_words: Sequence[str]) -> int:
    """The context key of a prompt, from its tokens (whitespace does not matter)."""
    return _key_of_text("\x1f".join(prompt_words))


def next_context(ctx: int, token_id: int) -> int:
    """The context key after ``token_id`` was generated in context ``ctx``."""
    return mix64(ctx ^ (((token_id + 1) * _GOLDEN) & _M64))


@dataclass(frozen=True)
class KernelFault:
    """The faulty kernel as the engine sees it (``canarystack.model.faults`` parses it)."""

    mode: str = "fp8-kv-scale"
    min_prompt_tokens: int = 2048
    magnitude: float = 1.0


@dataclass(frozen=True)
class Distribution:
    """One next-token distribution: candidate ids and logprobs plus the tail.

    ``tail_logprob`` is the log of the *total* tail mass; each of the
    ``vocab_size - len(ids)`` other tokens has ``tail_logprob - log(tail_size)``.
    """

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    tail_logprob: float
    vocab_size: int

    @property
    def tail_token_logprob(self) -> float:
        return self.tail_logprob - math.log(self.vocab_size - len(self.ids))

    def logprob_of(self, token_id: int) -> float:
        for i, cid in enumerate(self.ids):
            if cid == token_id:
                return self.logprobs[i]
        return self.tail_token_logprob

    def argmax(self) -> int:
        best = max(range(len(self.ids)), key=self.logprobs.__getitem__)
        return self.ids[best]

    def top(self, n: int) -> list[tuple[int, float]]:
        """The ``n`` most likely tokens, most likely first (ties: lower id first)."""
        ranked = sorted(zip(self.ids, self.logprobs, strict=True), key=lambda t: (-t[1], t[0]))
        out = ranked[:n]
        if n > len(out):
            taken = set(self.ids)
            tail_lp = self.tail_token_logprob
            for tid in range(self.vocab_size):
                if len(out) >= n:
                    break
                if tid not in taken:
                    out.append((tid, tail_lp))
        return out

    def full(self) -> np.ndarray:
        """All ``vocab_size`` log-probabilities (for tests and the KL helpers)."""
        lp = np.full(self.vocab_size, self.tail_token_logprob)
        lp[list(self.ids)] = self.logprobs
        return lp


def kl_divergence(p: Distribution, q: Distribution) -> float:
    """Exact KL(p || q) in nats over the whole vocabulary."""
    lp, lq = p.full(), q.full()
    return float(np.sum(np.exp(lp) * (lp - lq)))


@dataclass(frozen=True)
class _Tables:
    ids: tuple[tuple[int, ...], ...]
    logits: tuple[tuple[float, ...], ...]  # CANDIDATES + 1 (tail last)
    noise: tuple[tuple[float, ...], ...]  # standard normals, CANDIDATES + 1
    spread: float  # E[1 - sum p^2] over the base rows: KL per unit noise variance


@functools.lru_cache(maxsize=8)
def _tables(family_seed: int, vocab_size: int) -> _Tables:
    rng = np.random.default_rng([family_seed, vocab_size, 0x51A7])
    k = CANDIDATES
    ids = tuple(
        tuple(int(x) for x in rng.choice(vocab_size, size=k, replace=False))
        for _ in range(TABLE_ROWS)
    )
    # Peaked like a real LM: a per-context sharpness, a few strong candidates, and a tail
    # of 2-10 % of the mass.
    sharp = rng.uniform(1.5, 3.2, size=(TABLE_ROWS, 1))
    cand = rng.standard_normal((TABLE_ROWS, k)) * sharp
    cand_lse = np.log(np.exp(cand).sum(axis=1, keepdims=True))
    tail_frac = rng.uniform(0.02, 0.10, size=(TABLE_ROWS, 1))
    tail = cand_lse + np.log(tail_frac / (1.0 - tail_frac))
    logits = np.concatenate([cand, tail], axis=1)
    noise = rng.standard_normal((TABLE_ROWS, k + 1))
    probs = np.exp(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))
    spread = float(np.mean(1.0 - (probs**2).sum(axis=1)))
    return _Tables(
        ids=ids,
        logits=tuple(tuple(float(x) for x in row) for row in logits),
        noise=tuple(tuple(float(x) for x in row) for row in noise),
        spread=spread,
    )


def version_key(version: str) -> int:
    return _key_of_text("version:" + version)


class NextTokenModel:
    """The next-token distributions of one (family, version), optionally with a faulty kernel.

    ``drift`` is the mean KL (nats) this version shows against another version of the same
    family with the same drift; 0 makes it the family's base model.
    """

    def __init__(
        self,
        version: str,
        *,
        family_seed: int = 0,
        drift: float = 0.01,
        vocab_size: int = VOCAB_SIZE,
    ) -> None:
        if drift < 0:
            raise ValueError(f"drift must be >= 0 (mean KL in nats), got {drift}")
        if vocab_size <= CANDIDATES:
            raise ValueError(f"vocab_size must exceed {CANDIDATES}, got {vocab_size}")
        self.version = version
        self.family_seed = family_seed
        self.drift = drift
        self.vocab_size = vocab_size
        self._t = _tables(family_seed, vocab_size)
        self._family_key = mix64(family_seed ^ _FAMILY_SALT)
        self._version_key = version_key(version)
        # Two versions with iid N(0, s^2) logit noise differ by a logit difference of
        # variance 2 s^2; for small noise KL ~ 1/2 Var_p(delta) = s^2 (1 - sum p^2).
        self.version_scale = math.sqrt(drift / self._t.spread) if drift > 0 else 0.0
        self._log_tail_size = math.log(vocab_size - CANDIDATES)

    def kernel_scale(self, prompt_tokens: int, fault: KernelFault | None) -> float:
        """The kernel fault's logit-noise scale for a prompt length (0 when untouched, and
        for the broken modes, which do not drift the distribution: see ``broken_mode``)."""
        if (
            fault is None
            or fault.mode != DRIFT_MODE
            or fault.magnitude <= 0
            or prompt_tokens < fault.min_prompt_tokens
        ):
            return 0.0
        # One-sided noise of variance v gives KL ~ v/2 (1 - sum p^2): scale so KL grows
        # linearly with prompt length and with magnitude squared.
        target_kl = KERNEL_KL_AT_REF * fault.magnitude**2 * prompt_tokens / KERNEL_REF_TOKENS
        return math.sqrt(2.0 * target_kl / self._t.spread)

    def distribution(self, ctx: int, kernel_scale: float = 0.0) -> Distribution:
        # Plain list comprehensions and local names: this runs once per generated token.
        t = self._t
        vs = self.vocab_size
        h = mix64(ctx ^ self._family_key)
        offset = (h >> 12) % vs
        ids = tuple([(i + offset) % vs for i in t.ids[h & _ROW_MASK]])
        logits: Sequence[float] = t.logits[(h >> 24) & _ROW_MASK]
        s = self.version_scale
        if s:
            nv = t.noise[mix64(ctx ^ self._version_key) & _ROW_MASK]
            logits = [a + s * b for a, b in zip(logits, nv, strict=True)]
        if kernel_scale:
            nk = t.noise[mix64(ctx ^ _KERNEL_SALT) & _ROW_MASK]
            logits = [a + kernel_scale * b for a, b in zip(logits, nk, strict=True)]
        top = max(logits)
        exp = math.exp
        lse = top + math.log(sum([exp(x - top) for x in logits]))
        lps = [x - lse for x in logits]
        tail = lps.pop()
        return Distribution(ids=ids, logprobs=tuple(lps), tail_logprob=tail, vocab_size=vs)

    @staticmethod
    def broken_mode(prompt_tokens: int, fault: KernelFault | None) -> str | None:
        """The broken kernel mode acting on a prompt of this length, or None."""
        if fault is None or fault.mode not in BROKEN_MODES:
            return None
        return fault.mode if prompt_tokens >= fault.min_prompt_tokens else None

    def choose(
        self,
        dist: Distribution,
        temperature: float,
        top_p: float,
        rng: random.Random,
        broken: str | None = None,
    ) -> int:
        """The next token: ``sample`` for a healthy (or inf-logits) kernel, token 0 for
        nan-logits, a uniform draw over the vocabulary for garbage."""
        if broken == "nan-logits":
            return NAN_TOKEN_ID
        if broken == "garbage":
            return rng.randrange(self.vocab_size)
        return self.sample(dist, temperature, top_p, rng)

    def sample(
        self, dist: Distribution, temperature: float, top_p: float, rng: random.Random
    ) -> int:
        """Greedy for a temperature below ``SAMPLING_EPS`` (as vLLM: dividing by a
        subnormal temperature would overflow every weight), else a draw with temperature
        and nucleus (top_p)."""
        if temperature < SAMPLING_EPS:
            return dist.argmax()
        # Items: the candidates and the tail as one group of equally likely tokens.
        per_tail = (dist.tail_logprob - self._log_tail_size) / temperature
        items = [lp / temperature for lp in dist.logprobs]
        items.append(self._log_tail_size + per_tail)
        top = max(items)
        weights = [math.exp(x - top) for x in items]
        order = sorted(range(len(items)), key=lambda i: -weights[i])
        if top_p < 1.0:
            total = sum(weights)
            kept, acc = [], 0.0
            for i in order:
                kept.append(i)
                acc += weights[i]
                if acc >= top_p * total:
                    break
            order = kept
        pick = rng.choices(order, weights=[weights[i] for i in order])[0]
        if pick < len(dist.ids):
            return dist.ids[pick]
        taken = set(dist.ids)
        nth = rng.randrange(self.vocab_size - len(dist.ids))
        for tid in range(self.vocab_size):
            if tid not in taken:
                if nth == 0:
                    return tid
                nth -= 1
        raise AssertionError("unreachable: tail index out of range")  # pragma: no cover


@dataclass(frozen=True)
class Step:
    """One generated token and the distribution it was drawn from."""

    token_id: int
    dist: Distribution


def generate(
    model: NextTokenModel,
    prompt_words: Sequence[str],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    kernel: KernelFault | None = None,
) -> list[Step]:
    """The tokens a request gets (without stop handling): the pure reference the server
    and the tests share. Sampling uses ``random.Random(seed)`` when a seed is given."""
    rng = random.Random(seed) if seed is not None else random.Random()
    scale = model.kernel_scale(len(prompt_words), kernel)
    broken = model.broken_mode(len(prompt_words), kernel)
    ctx = prompt_context(prompt_words)
    steps: list[Step] = []
    for _ in range(max_tokens):
        dist = model.distribution(ctx, scale)
        tok = model.choose(dist, temperature, top_p, rng, broken)
        steps.append(Step(tok, dist))
        ctx = next_context(ctx, tok)
    return steps
