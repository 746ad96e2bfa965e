"""The simulator's tokenizer: one token per whitespace-separated word.

Simple on purpose, so that the harness can build a prompt of exactly N tokens without
importing this module (``gameday.load`` mirrors ``make_prompt``): a prompt of N words is
N prompt tokens. Generated tokens come from a fixed vocabulary of ``VOCAB_SIZE`` words;
the completion text is the tokens joined with a leading space each (" ka lumo ...").

Chat messages are rendered as ``<|role|> content`` lines; the role marker is one token.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Mapping
from typing import Any

VOCAB_SIZE = 512
_ONSETS = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")


@functools.cache
def vocab() -> tuple[str, ...]:
    """``VOCAB_SIZE`` distinct pronounceable words, the same in every process."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]  # 128
    words: list[str] = []
    for a in syllables:
        for b in syllables:
            word = a + b
            if word not in words:
                words.append(word)
            if len(words) == VOCAB_SIZE:
                return tuple(words)
    raise AssertionError("vocabulary too small")  # pragma: no cover


def count_tokens(text: str) -> int:
    return len(text.split())


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        lines.append(f"<|{m.get('role', 'user')}|> {content}")
    return "\n".join(lines)


def make_prompt(n_tokens: int, seed: int = 0) -> str:
    """A prompt of exactly ``n_tokens`` tokens, deterministic from ``seed``."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    rng = random.Random(seed)
    words = vocab()
    return " ".join(rng.choice(words) for _ in range(n_tokens))
