"""One request a prompt mix asks for (``PromptRequest``), its words, the mix protocol and
how every mix draws its requests (``MixDraws``).

This module never imports ``canarystack`` and never does I/O.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from gameday.errors import GamedayError

_ONSETS = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
VOCAB_SIZE = 512


class PromptFileError(GamedayError, ValueError):
    """A prompt or trace file is wrong; the message names the file, line and field."""

    def __init__(self, path: str | Path, line: int | None, field_name: str | None, problem: str):
        self.path = str(path)
        self.line = line
        self.field = field_name
        where = self.path
        if line is not None:
            where += f", line {line}"
        if field_name is not None:
            where += f", field {field_name!r}"
        super().__init__(f"{where}: {problem}")


class MixSpecError(GamedayError, ValueError):
    """``--prompt-mix`` (or a mix option) is not understood."""


@functools.cache
def vocab() -> tuple[str, ...]:
    """``VOCAB_SIZE`` distinct pronounceable words (two syllables each)."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    words: list[str] = []
    seen: set[str] = set()
    for a in syllables:
        for b in syllables:
            w = a + b
            if w not in seen:
                seen.add(w)
                words.append(w)
                if len(words) == VOCAB_SIZE:
                    return tuple(words)
    raise AssertionError("vocabulary too small")  # pragma: no cover


def make_prompt(n_tokens: int, seed: int = 0) -> str:
    """A prompt of exactly ``n_tokens`` whitespace words, deterministic from ``seed``.

    Mirrors the simulator's ``make_prompt`` contract (N words = N tokens there); the words
    themselves need not match. A chat message adds one token for the role marker, so chat
    content is built one word shorter. A real engine tokenizes differently — these
    pseudo-words are typically 2-3 BPE tokens each — so ``planned_prompt_tokens`` is the
    length the mix asked for, and the records also keep the server's own ``prompt_tokens``.
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return " ".join(random.Random(seed).choices(vocab(), k=n_tokens))


def count_words(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True)
class PromptRequest:
    """One request a mix asks for. The prompt text is built when sent, not held."""

    index: int
    planned_prompt_tokens: int
    max_tokens: int
    user_id: str | None = None
    offset_s: float | None = None  # trace arrival offset (unscaled); None = closed loop
    prompt: str | None = None  # given text (JSONL); None = synthetic words
    messages: tuple[Mapping[str, Any], ...] | None = None
    seed: int = 0

    def completion_prompt(self) -> str:
        if self.prompt is not None:
            return self.prompt
        if self.messages is not None:
            return "\n".join(str(m.get("content", "")) for m in self.messages)
        return make_prompt(self.planned_prompt_tokens, self.seed)

    def chat_messages(self) -> list[Mapping[str, Any]]:
        if self.messages is not None:
            return list(self.messages)
        if self.prompt is not None:
            return [{"role": "user", "content": self.prompt}]
        # the simulator counts the role marker as a token: one word fewer keeps the total
        return [
            {
                "role": "user",
                "content": make_prompt(max(0, self.planned_prompt_tokens - 1), self.seed),
            }
        ]


class PromptMix(Protocol):
    """A deterministic sequence of requests; ``request(i)`` is the i-th."""

    name: str
    open_loop: bool

    def request(self, index: int) -> PromptRequest: ...

    def __len__(self) -> int: ...  # requests in one pass (synthetic: effectively unbounded)


class Draws(TypedDict):
    """``MixDraws``' fields by name, as a mix's constructor takes them."""

    seed: int
    user_id_pool: int
    max_tokens_cap: int | None
    max_prompt_tokens: int | None


@dataclass(frozen=True, kw_only=True)
class MixDraws:
    """How a mix draws request ``index``: from its own ``random.Random`` (``rng``, from
    ``seed``: the same index is the same request in every run and worker), a user id from
    ``user_id_pool`` users (0: none), output tokens capped at ``max_tokens_cap`` and
    prompt tokens at ``max_prompt_tokens`` (None: uncapped). Every mix is one; so is
    ``MixSettings``, which hands these to the mix it builds (``draws``)."""

    seed: int = 0
    user_id_pool: int = 1000
    max_tokens_cap: int | None = None
    max_prompt_tokens: int | None = None

    def rng(self, index: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + index)

    def draws(self) -> Draws:
        """These fields by name, for building a mix (``Mix(..., **settings.draws())``)."""
        return Draws(
            seed=self.seed,
            user_id_pool=self.user_id_pool,
            max_tokens_cap=self.max_tokens_cap,
            max_prompt_tokens=self.max_prompt_tokens,
        )


def user_id_for(rng: random.Random, pool: int) -> str | None:
    return f"user-{rng.randrange(pool)}" if pool > 0 else None


def capped(value: int, cap: int | None) -> int:
    return value if cap is None else min(value, cap)
