"""Turning generated tokens into OpenAI/vLLM response bytes: SSE chunks and JSON bodies.

This module must never decide timing, read requests, or write a non-finite number into a
healthy answer.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Generator, Iterable

from canarystack.model.generation import EchoPosition, Output, Piece, token_ids, token_texts

DONE = b"data: [DONE]\n\n"
_dumps = functools.partial(json.dumps, separators=(",", ":"), allow_nan=False)
# The logprob a broken kernel reports at every position it touches.
BROKEN_LOGPROB = {"nan-logits": math.nan, "inf-logits": -math.inf}
# Positions rendered between two yields of a non-streaming answer.
FULL_RESPONSE_BATCH = 64


@functools.cache
def token_json() -> tuple[str, ...]:
    return tuple(_dumps(t) for t in token_texts())


@functools.cache
def chat_token_parts() -> tuple[tuple[str, str], ...]:
    """Per token id, a chat logprob entry around its value: ``{"token":T,"logprob":`` and
    ``,"bytes":[...]`` (the caller closes it)."""
    return tuple(
        ('{"token":' + tj + ',"logprob":', ',"bytes":' + _dumps(list(t.encode())))
        for t, tj in zip(token_texts(), token_json(), strict=True)
    )


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _joined(chunks: list[bytes]) -> list[bytes]:
    """``chunks`` with b"," between them, to join once with the rest of the answer."""
    out: list[bytes] = []
    for i, chunk in enumerate(chunks):
        if i:
            out.append(b",")
        out.append(chunk)
    return out


class Renderer:
    """Builds the bytes of one response, for ``kind`` "completion" or "chat".

    ``logprobs`` is None when the client did not ask for logprobs, else the number of top
    alternatives per position.

    Shapes (as vLLM's OpenAI server sends them):

    - completions chunk: ``{"id", "object": "text_completion", "created", "model",
      "choices": [{"index": 0, "text", "logprobs", "finish_reason", "stop_reason"}]}`` with
      ``logprobs = {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{tok: lp}]}``
      (the sampled token is always in ``top_logprobs``, so it may hold n+1 entries);
    - chat chunk: ``{"id", "object": "chat.completion.chunk", "created", "model",
      "choices": [{"index": 0, "delta": {"role"?, "content"}, "logprobs", "finish_reason"}]}``
      with ``logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
      [{"token", "logprob", "bytes"}]}]}``;
    - with ``stream_options.include_usage`` every chunk carries ``"usage": null`` and a last
      chunk ``{"choices": [], "usage": {...}}`` comes before ``data: [DONE]``.

    A broken kernel (``broken``, only for requests the fault acts on) changes the logprobs as
    an engine that writes them with Python's ``json`` would (``allow_nan=True``):

    - ``nan-logits``: every logprob of the position (the chosen token's and each
      alternative's) is the bare JSON token ``NaN``;
    - ``inf-logits``: every logprob of the position is ``-Infinity`` (the normaliser
      overflowed; the text is the healthy one);
    - ``garbage``: ``"logprobs": null`` even when the client asked for logprobs.

    Everything else is written strictly: a healthy answer can never carry a non-finite
    number by accident (``_num`` raises rather than write one).

    The per-chunk path is string concatenation over pre-encoded pieces (no pydantic, no
    ``json.dumps`` of logprobs: the fragments are built by hand); a non-streaming answer is
    built in steps (``full_response_steps``) so the server can yield between them.
    """

    def __init__(
        self,
        kind: str,
        response_id: str,
        created: int,
        model: str,
        *,
        logprobs: int | None,
        include_usage: bool = False,
        broken: str | None = None,
        echo: tuple[str, Iterable[EchoPosition]] | None = None,
    ) -> None:
        self.kind = kind
        # ``echo`` (completions, not streamed): the prompt and its scored tokens, which
        # come before the answer in the text and in every logprobs column, as vLLM's.
        self._echo_text = echo[0] if echo is not None else ""
        self._echo: Iterable[EchoPosition] | None = echo[1] if echo is not None else None
        self.logprobs = logprobs
        self.broken = broken
        # garbage: no logprobs at all, whatever was asked; NaN/-inf: every value replaced.
        self._no_logprobs = logprobs is None or broken == "garbage"
        self._bad_value = BROKEN_LOGPROB.get(broken or "")
        self.include_usage = include_usage
        self._offset = len(self._echo_text)

        def head(obj: str) -> str:
            return (
                f'{{"id":{_dumps(response_id)},"object":"{obj}","created":{created},'
                f'"model":{_dumps(model)},'
            )

        chat = kind == "chat"
        self._chunk_head = head("chat.completion.chunk" if chat else "text_completion")
        self._final_head = head("chat.completion" if chat else "text_completion")
        self._usage_tail = ',"usage":null}\n\n' if include_usage else "}\n\n"

    # -- logprobs -------------------------------------------------------------------
    # JSON fragments built by hand from pre-encoded token parts: a request with 20
    # alternatives per position over thousands of tokens must not spend seconds in
    # json.dumps (which never lets the event loop in).
    def _num(self, value: float) -> str:
        """A logprob as JSON: float.__repr__ (what json writes) or, for a broken kernel
        only, the bare tokens Python's json would write; never NaN in a healthy answer."""
        if math.isfinite(value):
            return float.__repr__(value)
        if self._bad_value is None:
            raise ValueError(f"non-finite logprob {value!r} in a healthy answer")
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")

    def _value(self, value: float) -> float:
        return value if self._bad_value is None else self._bad_value

    def _completion_parts(self, piece: Piece) -> tuple[str, str, str, str]:
        """(text_offset, token_logprob, token, top_logprobs) of one position as JSON; the
        sampled token is always in top_logprobs, as vLLM does."""
        tj = token_json()
        dist = piece.step.dist
        chosen = dist.logprob_of(piece.token_id)
        top = dict(dist.top(self.logprobs or 0))
        top.setdefault(piece.token_id, chosen)
        top_json = "{" + ",".join(tj[t] + ":" + self._num(self._value(v)) for t, v in top.items())
        return (
            str(self._offset),
            self._num(self._value(chosen)),
            tj[piece.token_id],
            top_json + "}",
        )

    def _echo_parts(self, pos: EchoPosition) -> tuple[str, str, str, str]:
        """(text_offset, token_logprob, token, top_logprobs) of one echoed prompt token;
        the first has null logprobs (nothing predicts it), as vLLM's echo."""
        chosen = pos.logprob
        if pos.dist is None or chosen is None:
            return str(pos.offset), "null", _dumps(pos.text), "null"
        tj = token_json()
        top = {tj[t]: v for t, v in pos.dist.top(self.logprobs or 0)}
        own = _dumps(" " + pos.word) if pos.word not in token_ids() else tj[token_ids()[pos.word]]
        top.setdefault(own, chosen)
        top_json = "{" + ",".join(t + ":" + self._num(self._value(v)) for t, v in top.items())
        return (
            str(pos.offset),
            self._num(self._value(chosen)),
            _dumps(pos.text),
            top_json + "}",
        )

    def _chat_logprob(self, piece: Piece) -> str:
        """One ``logprobs.content`` entry of chat as JSON."""
        parts = chat_token_parts()
        dist = piece.step.dist
        head, tail = parts[piece.token_id]
        tops = ",".join(
            parts[t][0] + self._num(self._value(v)) + parts[t][1] + "}"
            for t, v in dist.top(self.logprobs or 0)
        )
        chosen = self._num(self._value(dist.logprob_of(piece.token_id)))
        return head + chosen + tail + ',"top_logprobs":[' + tops + "]}"

    # -- streaming --------------------------------------------------------------------
    def first_chunk(self) -> bytes:
        """Chat's role announcement (vLLM sends it with the first output); b"" otherwise."""
        if self.kind != "chat":
            return b""
        return (
            "data: "
            + self._chunk_head
            + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            + '"logprobs":null,"finish_reason":null}]'
            + self._usage_tail
        ).encode()

    def token_chunk(
        self,
        piece: Piece | None,
        finish_reason: str | None = None,
        stop_reason: str | None = None,
    ) -> bytes:
        """The SSE event for one token (``piece`` None: an empty closing chunk);
        with ``finish_reason`` it is the last chunk of the choice."""
        if piece is None:
            text_json = '""'
        elif piece.text is token_texts()[piece.token_id]:
            text_json = token_json()[piece.token_id]  # pre-encoded: the common case
        else:
            text_json = _dumps(piece.text)
        if piece is not None and not self._no_logprobs:
            if self.kind == "completion":
                offset, chosen, token, top = self._completion_parts(piece)
                lp = (
                    f'{{"text_offset":[{offset}],"token_logprobs":[{chosen}],'
                    f'"tokens":[{token}],"top_logprobs":[{top}]}}'
                )
            else:
                lp = '{"content":[' + self._chat_logprob(piece) + "]}"
        else:
            lp = "null"
        if piece is not None:
            self._offset += len(piece.text)
        fr = "null" if finish_reason is None else _dumps(finish_reason)
        if self.kind == "completion":
            sr = _dumps(stop_reason)
            body = (
                f'"choices":[{{"index":0,"text":{text_json},"logprobs":{lp},'
                f'"finish_reason":{fr},"stop_reason":{sr}}}]'
            )
        else:
            body = (
                f'"choices":[{{"index":0,"delta":{{"content":{text_json}}},"logprobs":{lp},'
                f'"finish_reason":{fr}}}]'
            )
        return ("data: " + self._chunk_head + body + self._usage_tail).encode()

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        usage = _dumps(usage_json(prompt_tokens, completion_tokens))
        return ("data: " + self._chunk_head + f'"choices":[],"usage":{usage}}}\n\n').encode()

    # -- non-streaming ----------------------------------------------------------------
    def full_response_steps(
        self, out: Output, prompt_tokens: int, batch: int = FULL_RESPONSE_BATCH
    ) -> Generator[None, None, bytes]:
        """The whole answer's bytes (the generator's return value), built ``batch``
        positions at a time and encoded per batch (one copy of a big answer at the end,
        not several): the caller yields to the event loop at each step."""
        text = _dumps(self._echo_text + "".join(p.text for p in out.pieces))
        fr = _dumps(out.finish_reason)
        if self.kind == "completion":
            head = f'"choices":[{{"index":0,"text":{text},"logprobs":'
            tail = f',"finish_reason":{fr},"stop_reason":{_dumps(out.stop_reason)}}}]'
        else:
            head = (
                f'"choices":[{{"index":0,"message":{{"role":"assistant","content":{text}}},'
                '"logprobs":'
            )
            tail = f',"finish_reason":{fr}}}]'
        usage = _dumps(usage_json(prompt_tokens, out.completion_tokens))
        parts: list[bytes] = [(self._final_head + head).encode()]
        if self._no_logprobs:
            parts.append(b"null")
        elif self.kind == "completion":
            names = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
            columns: tuple[list[bytes], ...] = ([], [], [], [])
            echoed: tuple[list[str], ...] = ([], [], [], [])
            for pos in self._echo or ():
                for row, part in zip(echoed, self._echo_parts(pos), strict=True):
                    row.append(part)
                if len(echoed[0]) == batch:
                    for column, row in zip(columns, echoed, strict=True):
                        column.append(",".join(row).encode())
                        row.clear()
                    yield
            if echoed[0]:
                for column, row in zip(columns, echoed, strict=True):
                    column.append(",".join(row).encode())
            for i in range(0, len(out.pieces), batch):
                rows: tuple[list[str], ...] = ([], [], [], [])
                for piece in out.pieces[i : i + batch]:
                    for row, part in zip(rows, self._completion_parts(piece), strict=True):
                        row.append(part)
                    self._offset += len(piece.text)
                for column, row in zip(columns, rows, strict=True):
                    column.append(",".join(row).encode())
                yield
            for n, (name, column) in enumerate(zip(names, columns, strict=True)):
                parts.append(('{"' if n == 0 else ',"').encode() + name.encode() + b'":[')
                parts += _joined(column)
                parts.append(b"]")
            parts.append(b"}")
        else:
            entries: list[bytes] = []
            for i in range(0, len(out.pieces), batch):
                entries.append(
                    ",".join(self._chat_logprob(p) for p in out.pieces[i : i + batch]).encode()
                )
                yield
            parts += [b'{"content":[', *_joined(entries), b"]}"]
        parts.append((tail + f',"usage":{usage}}}').encode())
        return b"".join(parts)

    def full_response(self, out: Output, prompt_tokens: int) -> bytes:
        """The whole answer's bytes in one go (for tests and small answers)."""
        steps = self.full_response_steps(out, prompt_tokens)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return bytes(done.value)
