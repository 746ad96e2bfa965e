"""One request's generation, token by token: the engine's steps, sampling, and stop
sequences, with the counts the response reports.

This module must never sleep, do I/O or render bytes.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from canarystack.model.engine import (
    Distribution,
    NextTokenModel,
    Step,
    extend_context,
    next_context,
    prompt_context,
)
from canarystack.tokenizer import vocab

# A prompt token as echoed: the whitespace before a word, and the word.
_PROMPT_TOKEN = re.compile(r"\s*\S+")


@functools.cache
def token_texts() -> tuple[str, ...]:
    """The text of each token id: the word with one leading space."""
    return tuple(" " + w for w in vocab())


@functools.cache
def token_ids() -> dict[str, int]:
    """The id of each vocabulary word."""
    return {w: i for i, w in enumerate(vocab())}


@dataclass(frozen=True)
class EchoPosition:
    """One prompt token as ``echo`` returns it: its text (with the whitespace before it),
    where it starts in the prompt, and the distribution it was drawn from given the tokens
    before it (None for the first prompt token, which nothing predicts, as vLLM)."""

    text: str
    offset: int
    word: str
    dist: Distribution | None

    @property
    def logprob(self) -> float | None:
        """The token's logprob (a word outside the vocabulary is one of the tail)."""
        if self.dist is None:
            return None
        tid = token_ids().get(self.word)
        return self.dist.tail_token_logprob if tid is None else self.dist.logprob_of(tid)


def echo_positions(
    model: NextTokenModel,
    prompt: str,
    context_words: Sequence[str] = (),
    *,
    kernel_scale: float = 0.0,
    batch: int = 0,
) -> Iterator[EchoPosition]:
    """The prompt's tokens with the distributions the model gives each one after the
    tokens before it (``context_words``, e.g. a retrieved context, come first): the
    teacher-forced scoring of a text. Their contexts are the ones a generation reaches, so
    a prompt ending in an answer scores the answer's positions as its generation drew them.
    One distribution per token: the caller takes them in batches."""
    ctx = prompt_context(context_words)
    for i, m in enumerate(_PROMPT_TOKEN.finditer(prompt)):
        word = m.group().lstrip()
        dist = None if i == 0 else model.distribution(ctx, kernel_scale, batch)
        yield EchoPosition(m.group(), m.start(), word, dist)
        ctx = extend_context(ctx, word)


@dataclass(frozen=True)
class Piece:
    """One emitted token: its id, its text (cut if a stop sequence ends in it), its step."""

    token_id: int
    text: str
    step: Step


@dataclass(frozen=True)
class Output:
    """A finished generation (what a non-streaming response holds)."""

    pieces: list[Piece]
    finish_reason: str  # "length" | "stop"
    stop_reason: str | None
    completion_tokens: int


class Generation:
    """The tokens of one request, made on demand.

    ``completion_tokens`` counts every generated token, the one that completed a stop
    sequence included (as vLLM does); the stop sequence itself is not emitted.
    ``broken`` is the broken kernel mode acting on this request, if any
    (``NextTokenModel.choose`` picks its tokens).

    ``batch`` is the key of the batch the request runs in (``NextTokenModel.batch_key``;
    0: no batch noise). Left out, it is taken when the first token is made — after the
    server admitted the request into a slot, so the running count it reads is the one at
    admission — and kept for every later token of the request.

    ``Generation.next_piece()`` yields the next emitted token (its text cut short when a stop
    sequence ends inside it) or None when the request is finished; then ``finish_reason``,
    ``stop_reason`` and ``completion_tokens`` are final. Tokens are made one at a time so a
    long ``max_tokens`` never blocks the event loop for long, and a stream computes the next
    token while it waits for the current one's deadline.
    """

    def __init__(
        self,
        model: NextTokenModel,
        prompt_words: Sequence[str],
        max_tokens: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        rng: random.Random | None = None,
        kernel_scale: float = 0.0,
        broken: str | None = None,
        stop: Sequence[str] = (),
        batch: int | None = None,
    ) -> None:
        self._model = model
        self._ctx = prompt_context(prompt_words)
        self._left = max_tokens
        self._temperature = temperature
        self._top_p = top_p
        self._rng = rng or random.Random()
        self._kernel_scale = kernel_scale
        self._broken = broken
        self._batch = batch
        self._stop = list(stop)
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self._text = ""
        self.finished = False
        self.finish_reason = "length"
        self.stop_reason: str | None = None
        self.completion_tokens = 0

    def next_piece(self) -> Piece | None:
        while not self.finished:
            if self._left <= 0:
                self.finished = True
                return None
            if self._batch is None:
                self._batch = self._model.batch_key()
            dist = self._model.distribution(self._ctx, self._kernel_scale, self._batch)
            tok = self._model.choose(dist, self._temperature, self._top_p, self._rng, self._broken)
            self._ctx = next_context(self._ctx, tok)
            self._left -= 1
            self.completion_tokens += 1
            text = token_texts()[tok]
            step = Step(tok, dist)
            if not self._stop:
                return Piece(tok, text, step)
            before = len(self._text)
            self._text += text
            window = max(0, before - self._longest_stop + 1)
            hits = [(i, s) for s in self._stop if (i := self._text.find(s, window)) >= 0]
            if not hits:
                return Piece(tok, text, step)
            cut, seq = min(hits)
            self.finished = True
            self.finish_reason = "stop"
            self.stop_reason = seq
            if cut > before:
                return Piece(tok, self._text[before:cut], step)
            return None
        return None

    def run(self) -> Output:
        """Generate to the end (for non-streaming responses and tests)."""
        pieces = []
        while (piece := self.next_piece()) is not None:
            pieces.append(piece)
        return Output(pieces, self.finish_reason, self.stop_reason, self.completion_tokens)
