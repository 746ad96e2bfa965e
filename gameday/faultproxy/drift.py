"""What a ``kernel`` fault does to an answer as it passes the proxy: the logprobs and text of
each position, in the completions shape (``choices[].logprobs``: ``tokens``,
``token_logprobs``, ``top_logprobs`` as ``{token: logprob}``, ``text_offset``) and the chat
shape (``choices[].logprobs.content[]``: ``token``, ``logprob``, ``bytes``,
``top_logprobs`` as ``[{token, logprob, bytes}]``), streamed (one event at a time, the
positions counted across events) and not.

``fp8-kv-scale`` (the size of the drift): at every position the top-k candidates' logprobs
move along a direction drawn per (seed, position, token), scaled so that
KL(baseline top-k || drifted top-k, both renormalised over the same k tokens) is exactly
``KL_PER_MAGNITUDE_SQ * magnitude**2`` (0.05 nats at magnitude 1); the candidates keep
their total probability (the rest of the vocabulary is untouched). On a share
``min(MAX_FLIP_SHARE, FLIP_SHARE_PER_MAGNITUDE * magnitude)`` of the positions (10 % at
magnitude 1) the token swaps places with the best other candidate, which becomes the
token, so the text changes too (without logprobs to pick one from, the previous piece
repeats).
Since the drift is drawn per position and token, the same answer drifts the same way every
time, as a real kernel's does.

The broken modes write what an engine with a broken kernel writes (the reference
simulator's ``render`` shapes): ``nan-logits``, every logprob ``NaN`` and every position's
text the first one's; ``inf-logits``, every logprob ``-Infinity``; ``garbage``, unrelated
words for text and ``"logprobs": null``.

This module must never do I/O or keep state beyond one answer.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from gameday.faultproxy.kinds import KernelParams

KL_PER_MAGNITUDE_SQ = 0.05
FLIP_SHARE_PER_MAGNITUDE = 0.1
MAX_FLIP_SHARE = 0.5
# Unrelated words a garbage kernel emits (none is a word of the simulator's vocabulary).
GARBAGE_WORDS = (
    "qzx", "vrrk", "xxj", "pfft", "zzq", "kxv", "wqj", "jjx",
    "qqv", "xkz", "vzq", "trxq", "bxq", "fjq", "zxv", "qjk",
)  # fmt: skip
_NORMAL = NormalDist()
_PIECES = re.compile(r"\s*\S+|\s+$")
NEWTON_STEPS = 30
KL_TOLERANCE = 1e-10


# The benign modes' KL per position at magnitude 1 (canarystack.model's quantized; numerics
# at the size of batch noise): healthy builds the gate must not trip on.
BENIGN_KL = {"quantized": 1.5e-4, "numerics": 2e-5}


def target_kl(magnitude: float) -> float:
    return KL_PER_MAGNITUDE_SQ * magnitude**2


def flip_share(magnitude: float) -> float:
    return min(MAX_FLIP_SHARE, FLIP_SHARE_PER_MAGNITUDE * magnitude)


def _unit(seed: int, *parts: object) -> float:
    """A number in (0, 1) fixed by ``seed`` and ``parts``."""
    key = "\x1f".join([str(seed), *map(str, parts)]).encode()
    n = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return (n + 0.5) / 2.0**64


def drifted(lps: list[float], tokens: list[str], kl: float, seed: int, pos: int) -> list[float]:
    """``lps`` (the top-k logprobs of one position) moved so that KL(p || q) over the k
    candidates renormalised is ``kl``; their total mass kept. Unchanged when there is
    nothing to move (fewer than two candidates, a non-finite value, ``kl`` 0)."""
    if len(lps) < 2 or kl <= 0 or not all(math.isfinite(v) for v in lps):
        return list(lps)
    top = max(lps)
    log_mass = top + math.log(sum(math.exp(v - top) for v in lps))
    logp = [v - log_mass for v in lps]
    p = [math.exp(v) for v in logp]
    d = [_NORMAL.inv_cdf(_unit(seed, "dir", pos, tok)) for tok in tokens]
    mean = sum(pi * di for pi, di in zip(p, d, strict=True))
    d = [di - mean for di in d]
    var = sum(pi * di * di for pi, di in zip(p, d, strict=True))
    if var <= 1e-300:
        return list(lps)

    # With E_p[d] = 0, KL(p || q_t) for q_t ∝ p·exp(t·d) is log E_p[exp(t·d)]: convex and
    # increasing in t >= 0, so Newton from the quadratic guess converges.
    def log_z(t: float) -> tuple[float, float]:
        a = [lp + t * di for lp, di in zip(logp, d, strict=True)]
        m = max(a)
        e = [math.exp(x - m) for x in a]
        s = sum(e)
        slope = sum(ei * di for ei, di in zip(e, d, strict=True)) / s  # E_q[d]
        return m + math.log(s), slope

    t = math.sqrt(2.0 * kl / var)
    for _ in range(NEWTON_STEPS):
        value, slope = log_z(t)
        gap = value - kl
        if abs(gap) < KL_TOLERANCE or slope <= 0:
            break
        t = max(t - gap / slope, t / 2.0)
    value, _ = log_z(t)
    return [log_mass + lp + t * di - value for lp, di in zip(logp, d, strict=True)]


@dataclass
class _Choice:
    """One choice's state across the events of a stream."""

    position: int = 0
    first: str | None = None
    previous: str | None = None
    offset_shift: int = 0


@dataclass
class _Pos:
    token: str
    logprob: float | None
    top: list[list[Any]] = field(default_factory=list)  # [token, logprob] pairs
    offset: int | None = None  # where the token starts in the text (completions)


def _pieces(text: str) -> list[str]:
    return _PIECES.findall(text)


class KernelEffect:
    """A kernel fault applied to one answer: ``apply(obj)`` changes each JSON object of it
    (a streamed event, or the whole non-streamed body) in place, in order."""

    def __init__(self, params: KernelParams, echo_chars: int = 0) -> None:
        self.mode = params.mode
        # An echo answer's first ``echo_chars`` characters are the prompt, scored by the
        # kernel but never generated by it: their logprobs change, their tokens never.
        self.echo_chars = echo_chars
        self.kl = target_kl(params.magnitude)
        self.share = flip_share(params.magnitude)
        if self.mode in BENIGN_KL:  # a healthy build's numerics: a small drift, no flip
            self.kl, self.share = BENIGN_KL[self.mode] * params.magnitude**2, 0.0
        self.seed = params.seed
        self._choices: dict[int, _Choice] = {}

    def apply(self, obj: dict[str, Any]) -> None:
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if isinstance(choice, dict):
                self._choice(choice)

    # -- one choice ---------------------------------------------------------------------
    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        state = self._choices.setdefault(index if isinstance(index, int) else 0, _Choice())
        holder: dict[str, Any] | None = None
        key = "text"
        if "text" in choice:
            holder = choice
        else:
            for name in ("delta", "message"):
                if isinstance(choice.get(name), dict):
                    holder, key = choice[name], "content"
                    break
        text = holder.get(key) if holder is not None else None
        logprobs = choice.get("logprobs")
        positions, write = self._positions(logprobs, text if isinstance(text, str) else "")
        if not positions:
            if self.mode == "garbage" and logprobs is not None:
                choice["logprobs"] = None
            return
        old_tokens = [p.token for p in positions]
        for pos in positions:
            if pos.offset is not None and pos.offset < self.echo_chars:
                self._echoed(pos, state)
            else:
                self._position(pos, state)
        if write is not None:
            write(positions, old_tokens, state)
        if isinstance(text, str) and holder is not None and "".join(old_tokens) == text:
            holder[key] = "".join(p.token for p in positions)
        if self.mode == "garbage":
            choice["logprobs"] = None

    def _positions(self, logprobs: Any, text: str) -> tuple[list[_Pos], Any]:
        """The positions of a choice and how to write them back into its logprobs (None
        when the positions are the text's own pieces: no logprobs were asked for)."""
        if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
            return _completion_positions(logprobs)
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            return _chat_positions(logprobs)
        return [_Pos(piece, None) for piece in _pieces(text)], None

    def _position(self, pos: _Pos, state: _Choice) -> None:
        n = state.position
        state.position += 1
        if self.mode == "fp8-kv-scale" or self.mode in BENIGN_KL:
            self._drift(pos, state, n)
        elif self.mode == "nan-logits":
            _set_all(pos, math.nan)
            if state.first is not None:
                pos.token = state.first
        elif self.mode == "inf-logits":
            _set_all(pos, -math.inf)
        elif self.mode == "garbage":
            word = GARBAGE_WORDS[int(_unit(self.seed, "garbage", n) * len(GARBAGE_WORDS))]
            lead = pos.token[: len(pos.token) - len(pos.token.lstrip())]
            pos.token = lead + word if pos.token.strip() else pos.token
        if state.first is None:
            state.first = pos.token
        state.previous = pos.token

    def _echoed(self, pos: _Pos, state: _Choice) -> None:
        """An echoed prompt token: its distribution is the kernel's, its token the
        prompt's (no flip, no garbage word, no repeated piece)."""
        n = state.position
        state.position += 1
        if self.mode == "fp8-kv-scale" or self.mode in BENIGN_KL:
            self._drift(pos, state, n, flips=False)
        elif self.mode in ("nan-logits", "inf-logits") and pos.top:
            _set_all(pos, math.nan if self.mode == "nan-logits" else -math.inf)

    def _drift(self, pos: _Pos, state: _Choice, n: int, *, flips: bool = True) -> None:
        tokens = [str(t) for t, _ in pos.top]
        lps = [v for _, v in pos.top]
        new = drifted(lps, tokens, self.kl, self.seed, n) if lps else []
        flip = flips and self.share > 0 and _unit(self.seed, "flip", n) < self.share
        if flip and len(new) >= 2:
            # The best other candidate takes the top: it swaps values with the token (if
            # the drift has not already put it above) and becomes the token.
            c = tokens.index(pos.token) if pos.token in tokens else new.index(max(new))
            o = max((i for i in range(len(new)) if i != c), key=lambda i: new[i])
            if new[o] < new[c]:
                new[o], new[c] = new[c], new[o]
            pos.token, pos.logprob = tokens[o], new[o]
        elif flip and state.previous is not None:
            pos.token = state.previous
        elif pos.token in tokens:
            pos.logprob = new[tokens.index(pos.token)]
        for pair, value in zip(pos.top, new, strict=True):
            pair[1] = value


def _set_all(pos: _Pos, value: float) -> None:
    pos.logprob = value
    for pair in pos.top:
        pair[1] = value


def _ranked(top: list[list[Any]]) -> list[list[Any]]:
    """Candidates best first, as engines list them (order kept when values are broken)."""
    if all(math.isfinite(v) for _, v in top):
        return sorted(top, key=lambda kv: -kv[1])
    return top


def _finite_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _completion_positions(lp: dict[str, Any]) -> tuple[list[_Pos], Any]:
    tokens = lp["tokens"]
    chosen = lp.get("token_logprobs") or [None] * len(tokens)
    tops = lp.get("top_logprobs") or [None] * len(tokens)
    given = lp.get("text_offset")
    offsets: list[Any] = given if isinstance(given, list) else []
    positions = []
    for i, tok in enumerate(tokens):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        off = offsets[i] if i < len(offsets) else None
        positions.append(
            _Pos(
                str(tok),
                _finite_or_none(chosen[i] if i < len(chosen) else None),
                [[t, float(v)] for t, v in top.items() if _finite_or_none(v) is not None],
                off if isinstance(off, int) and not isinstance(off, bool) else None,
            )
        )

    def write(positions: list[_Pos], old: list[str], state: _Choice) -> None:
        offsets = lp.get("text_offset")
        for i, pos in enumerate(positions):
            tokens[i] = pos.token
            if isinstance(lp.get("token_logprobs"), list) and i < len(lp["token_logprobs"]):
                lp["token_logprobs"][i] = pos.logprob
            if isinstance(lp.get("top_logprobs"), list) and isinstance(tops[i], dict):
                lp["top_logprobs"][i] = dict(_ranked(pos.top))
            if isinstance(offsets, list) and i < len(offsets) and isinstance(offsets[i], int):
                offsets[i] += state.offset_shift
            state.offset_shift += len(pos.token) - len(old[i])

    return positions, write


def _chat_positions(lp: dict[str, Any]) -> tuple[list[_Pos], Any]:
    entries = [e for e in lp["content"] if isinstance(e, dict)]
    positions = []
    for e in entries:
        given = e.get("top_logprobs")
        tops: list[Any] = given if isinstance(given, list) else []
        top = [
            [t.get("token"), float(t["logprob"])]
            for t in tops
            if isinstance(t, dict) and _finite_or_none(t.get("logprob")) is not None
        ]
        positions.append(_Pos(str(e.get("token", "")), _finite_or_none(e.get("logprob")), top))

    def write(positions: list[_Pos], old: list[str], state: _Choice) -> None:
        for e, pos in zip(entries, positions, strict=True):
            if e.get("token") != pos.token:
                e["token"] = pos.token
                if "bytes" in e:
                    e["bytes"] = list(pos.token.encode())
            e["logprob"] = pos.logprob
            tops = e.get("top_logprobs")
            if isinstance(tops, list):
                values = {str(t): v for t, v in pos.top}
                for t in tops:
                    if isinstance(t, dict) and str(t.get("token")) in values:
                        t["logprob"] = values[str(t.get("token"))]
                if all(isinstance(t, dict) and math.isfinite(t["logprob"]) for t in tops):
                    tops.sort(key=lambda t: -t["logprob"])

    return positions, write
