"""The simulated engine's next-token model: deterministic, cheap, and honest about drift.

This module must never do I/O, sleep, or keep per-request state between calls.
"""

# Over 400 lines because it is one idea, the next-token model, and much of it is the
# explanation of the sizes its noises were given (on NextTokenModel and KernelFault).

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from canarystack.tokenizer import VOCAB_SIZE, vocab

CANDIDATES = 8
TABLE_ROWS = 4096
_ROW_MASK = TABLE_ROWS - 1
_ROW_SHIFT = 64 - (TABLE_ROWS.bit_length() - 1)  # top bits of a 64-bit hash: a row
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

# The kernel fault's size at the reference length and magnitude 1 (mean KL, nats).
KERNEL_REF_TOKENS = 4096
KERNEL_KL_AT_REF = 0.15
DRIFT_MODE = "fp8-kv-scale"
BROKEN_MODES = ("nan-logits", "inf-logits", "garbage")
# The token every position gets when all logits are NaN (argmax of all-NaN is index 0).
NAN_TOKEN_ID = 0

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5

# Benign kernel modes: the numbers change a little, as a healthy new build's do.
NUMERICS_MODE = "numerics"  # another batch-noise profile (tensor-parallel/batch layout)
QUANTIZED_MODE = "quantized"  # a small acceptable drift (q8_0-like weights)
BENIGN_MODES = (NUMERICS_MODE, QUANTIZED_MODE)
KERNEL_MODES = (DRIFT_MODE, *BROKEN_MODES, *BENIGN_MODES)
# The quantized mode's mean KL (nats) at magnitude 1 (grows with magnitude squared).
QUANTIZED_KL_AT_1 = 1.5e-4

# Non-batch-invariant numerics: the default mean KL (nats, whole vocabulary) between two
# batches of one version (see ``NextTokenModel``); the router's top-5 KL reads about as
# much (tests/test_model_noise.py measures it).
BATCH_NOISE_KL = 1e-3
MAX_BATCH_NOISE = 0.1

# Distinct hash salts, so a version's noise and the kernel's noise are independent.
_FAMILY_SALT = 0x5EED_F00D_0000_0001
_KERNEL_SALT = 0x6B65_726E_656C_0F8A
_BATCH_SALT = 0x6261_7463_685F_6E7A


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-mixed 64-bit hash of a 64-bit integer."""
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _key_of_text(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


# The context key of the empty prefix; each token then folds its word into the key.
_EMPTY_CONTEXT = 0x636F_6E74_6578_7430


@functools.lru_cache(maxsize=1 << 16)
def _word_key(word: str) -> int:
    return _key_of_text(word)


@functools.cache
def _vocab_keys() -> tuple[int, ...]:
    return tuple(_word_key(w) for w in vocab())


def extend_context(ctx: int, word: str) -> int:
    """The context key after the token ``word`` (any text, in the vocabulary or not)."""
    return mix64(ctx ^ _word_key(word))


def prompt_context(prompt_words: Sequence[str]) -> int:
    """The context key of a prompt, from its tokens (whitespace does not matter): a fold
    of ``extend_context`` over the words, so a prompt that ends with an answer's tokens
    has the very context the answer's generation reached (what teacher-forced scoring,
    ``echo`` with logprobs, relies on)."""
    ctx = _EMPTY_CONTEXT
    for word in prompt_words:
        ctx = mix64(ctx ^ _word_key(word))
    return ctx


def next_context(ctx: int, token_id: int) -> int:
    """The context key after ``token_id`` was generated in context ``ctx`` (the same as
    after that token's word in a prompt)."""
    return mix64(ctx ^ _vocab_keys()[token_id])


@dataclass(frozen=True)
class KernelFault:
    """The faulty kernel as the engine sees it (``canarystack.model.faults`` parses it).

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
    - The *benign* kernel modes (``BENIGN_MODES``) are healthy builds the gate must not trip
      on, a fixed per-context perturbation like ``fp8-kv-scale`` but of a size independent of
      the prompt length: ``numerics`` (another layout's reduction order, as a tensor-parallel
      or batch-size change gives: mean KL ``magnitude**2 * batch_noise`` on top of the batch
      noise) and ``quantized`` (q8_0-like weights: ``QUANTIZED_KL_AT_1 * magnitude**2``).
    """

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

    A next-token distribution depends only on (family seed, version, context) and, when the
    batch noise is on, the batch the request ran in; the context is a 64-bit key chained from
    the prompt's tokens and every token generated so far (so the position is part of it).
    With ``batch_noise=0`` two processes of one version return bit-identical logprobs for
    the same request; greedy continuations diverge after a flipped token exactly as a real
    model's would.

    The representation keeps a token to a few microseconds of pure Python: each distribution
    is ``CANDIDATES`` candidate tokens with explicit logits plus one *tail* item whose mass
    is spread evenly over the other ``vocab_size - CANDIDATES`` tokens. The random numbers
    come from tables drawn once per process by a seeded numpy generator (family seed), and
    a splitmix64 hash of the context picks the rows — no Generator per token.

    - The family (``seed``) fixes the base distributions every version shares.
    - A version adds its own Gaussian logit noise, scaled so that two versions with drift
      ``d`` differ by a mean KL of about ``d`` (``drift=0`` is the family base itself).
    - Batch noise (non-batch-invariant numerics). Real GPU engines give the same prompt
      slightly different logits in batches of different sizes: matmul, attention and norm
      kernels change their reduction order with the batch (He et al., "Defeating
      Nondeterminism in LLM Inference", Thinking Machines, 2025: 1000 greedy runs of one
      prompt on Qwen3-235B under a varying load gave 80 distinct completions, the first
      divergence at token 103, and batch-invariant kernels made all 1000 identical; vLLM
      ships that mode as ``VLLM_BATCH_INVARIANT=1``, in beta). Neither states a KL, so the
      size is *chosen*, not reproduced: ``BATCH_NOISE_KL`` = 1e-3 nats of mean KL between two
      batches, small enough that healthy replicas agree on ~98 % of top-1 tokens and large
      enough that near-ties flip now and then. Each request adds Gaussian logit noise keyed
      by ``batch_key`` (a per-process ``noise_seed`` and the running-request count at
      admission) and the context, so it is deterministic given (seed, running count,
      prompt, position). Measured at the default, two replicas over 20,000 random contexts
      (engine level): the router's top-5 KL (``kl_topk``) has mean 0.88e-3, median 0.57e-3,
      p95 2.75e-3, and 2.2 % of top-1 tokens differ; through HTTP over 400 prompts
      (tests/test_model_noise.py): mean 0.83e-3, p95 2.5e-3.

    Logprobs are the raw model's (before temperature and top_p), as vLLM reports them.
    """

    def __init__(
        self,
        version: str,
        *,
        family_seed: int = 0,
        drift: float = 0.01,
        vocab_size: int = VOCAB_SIZE,
        batch_noise: float = 0.0,
        noise_seed: int = 0,
        running: Callable[[], int] | None = None,
    ) -> None:
        if not drift >= 0:
            raise ValueError(f"drift must be >= 0 (mean KL in nats), got {drift}")
        if not 0 <= batch_noise <= MAX_BATCH_NOISE:
            raise ValueError(
                f"batch_noise must be in [0, {MAX_BATCH_NOISE:g}] (mean KL in nats between "
                f"two batches; 0 = batch-invariant), got {batch_noise}"
            )
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
        # Batch noise: iid N(0, b^2) per batch, so two batches differ by KL ~ b^2 spread,
        # the same relation as the version noise above.
        self.batch_noise = batch_noise
        self.noise_seed = noise_seed
        self.batch_scale = math.sqrt(batch_noise / self._t.spread) if batch_noise > 0 else 0.0
        self._seed_key = mix64((noise_seed & _M64) ^ _BATCH_SALT)
        self._running = running
        # The noise rows pre-scaled (36k floats, once per process): a token pays one hash
        # and one addition per logit for its batch noise.
        bs = self.batch_scale
        self._batch_rows = tuple(tuple(bs * x for x in row) for row in self._t.noise) if bs else ()

    def batch_key(self, running: int | None = None) -> int:
        """The key of the batch a request runs in: this process's seed and the number of
        running requests at its admission (``running``; default: the server's count now,
        from the ``running`` callable the model was given, else 1). 0 when the batch
        noise is off."""
        if not self.batch_scale:
            return 0
        if running is None:
            running = self._running() if self._running is not None else 1
        return mix64(self._seed_key ^ ((max(0, running) * _GOLDEN) & _M64)) | 1

    def kernel_scale(self, prompt_tokens: int, fault: KernelFault | None) -> float:
        """The kernel fault's logit-noise scale for a prompt length (0 when untouched, and
        for the broken modes, which do not drift the distribution: see ``broken_mode``).

        The target mean KL against the healthy kernel: ``fp8-kv-scale`` grows with the
        prompt length (``KERNEL_KL_AT_REF`` at ``KERNEL_REF_TOKENS``); ``quantized`` is
        ``QUANTIZED_KL_AT_1`` at any length; ``numerics`` is this process's own
        ``batch_noise`` (a fixed reduction order of another layout adds about as much
        again as one batch differs from another). All grow with ``magnitude`` squared."""
        if (
            fault is None
            or fault.mode not in (DRIFT_MODE, *BENIGN_MODES)
            or fault.magnitude <= 0
            or prompt_tokens < fault.min_prompt_tokens
        ):
            return 0.0
        if fault.mode == DRIFT_MODE:
            target_kl = KERNEL_KL_AT_REF * prompt_tokens / KERNEL_REF_TOKENS
        elif fault.mode == QUANTIZED_MODE:
            target_kl = QUANTIZED_KL_AT_1
        else:
            target_kl = self.batch_noise
        # One-sided noise of variance v gives KL ~ v/2 (1 - sum p^2): scale so KL grows
        # with magnitude squared.
        return math.sqrt(2.0 * target_kl * fault.magnitude**2 / self._t.spread)

    def distribution(self, ctx: int, kernel_scale: float = 0.0, batch: int = 0) -> Distribution:
        """The next-token distribution in context ``ctx``, with the kernel fault's noise
        (``kernel_scale``) and the batch noise of batch key ``batch`` (0: none)."""
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
        if batch:
            # The context is already well mixed: one multiplicative hash picks the row.
            nb = self._batch_rows[(((ctx ^ batch) * _GOLDEN) & _M64) >> _ROW_SHIFT]
            logits = [a + b for a, b in zip(logits, nb, strict=True)]
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
    running: int = 1,
) -> list[Step]:
    """The tokens a request gets (without stop handling): the pure reference the server
    and the tests share. Sampling uses ``random.Random(seed)`` when a seed is given;
    ``running`` is the running-request count at admission (the batch noise's key)."""
    rng = random.Random(seed) if seed is not None else random.Random()
    scale = model.kernel_scale(len(prompt_words), kernel)
    broken = model.broken_mode(len(prompt_words), kernel)
    batch = model.batch_key(running)
    ctx = prompt_context(prompt_words)
    steps: list[Step] = []
    for _ in range(max_tokens):
        dist = model.distribution(ctx, scale, batch)
        tok = model.choose(dist, temperature, top_p, rng, broken)
        steps.append(Step(tok, dist))
        ctx = next_context(ctx, tok)
    return steps
