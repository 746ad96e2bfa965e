"""Turning generated tokens into OpenAI/vLLM response bytes: SSE chunks and JSON bodies.

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

Everything else is written strictly (``allow_nan=False``): a healthy answer can never
carry a non-finite number by accident.

The per-chunk path is string concatenation over pre-encoded pieces (no pydantic, one
small ``json.dumps`` only when logprobs were asked for). This module must never decide
timing or read requests.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from canarystack.model.generation import Output, Piece, token_texts

DONE = b"data: [DONE]\n\n"
_dumps = functools.partial(json.dumps, separators=(",", ":"), allow_nan=False)
# Only a broken kernel's logprobs are written with this one.
_dumps_broken = functools.partial(json.dumps, separators=(",", ":"), allow_nan=True)
# The logprob a broken kernel reports at every position it touches.
BROKEN_LOGPROB = {"nan-logits": math.nan, "inf-logits": -math.inf}


@functools.cache
def token_json() -> tuple[str, ...]:
    return tuple(_dumps(t) for t in token_texts())


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class Renderer:
    """Builds the bytes of one response, for ``kind`` "completion" or "chat".

    ``logprobs`` is None when the client did not ask for logprobs, else the number of top
    alternatives per position."""

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
    ) -> None:
        self.kind = kind
        self.logprobs = logprobs
        self.broken = broken
        # garbage: no logprobs at all, whatever was asked; NaN/-inf: every value replaced.
        self._no_logprobs = logprobs is None or broken == "garbage"
        self._bad_value = BROKEN_LOGPROB.get(broken or "")
        self._lp_dumps = _dumps if self._bad_value is None else _dumps_broken
        self.include_usage = include_usage
        self._offset = 0

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
    def _completion_logprobs(self, piece: Piece) -> dict[str, Any]:
        texts = token_texts()
        dist = piece.step.dist
        bad = self._bad_value
        lp = dist.logprob_of(piece.token_id) if bad is None else bad
        n = self.logprobs or 0
        top = {texts[t]: (v if bad is None else bad) for t, v in dist.top(n)}
        top.setdefault(texts[piece.token_id], lp)
        entry = {
            "text_offset": [self._offset],
            "token_logprobs": [lp],
            "tokens": [texts[piece.token_id]],
            "top_logprobs": [top],
        }
        return entry

    def _chat_logprob(self, piece: Piece) -> dict[str, Any]:
        texts = token_texts()
        dist = piece.step.dist
        bad = self._bad_value
        return {
            "token": texts[piece.token_id],
            "logprob": dist.logprob_of(piece.token_id) if bad is None else bad,
            "bytes": list(texts[piece.token_id].encode()),
            "top_logprobs": [
                {
                    "token": texts[t],
                    "logprob": v if bad is None else bad,
                    "bytes": list(texts[t].encode()),
                }
                for t, v in dist.top(self.logprobs or 0)
            ],
        }

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
                lp = self._lp_dumps(self._completion_logprobs(piece))
            else:
                lp = '{"content":[' + self._lp_dumps(self._chat_logprob(piece)) + "]}"
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
    def full_response(self, out: Output, prompt_tokens: int) -> bytes:
        text = "".join(p.text for p in out.pieces)
        logprobs: Any = None
        if not self._no_logprobs:
            if self.kind == "completion":
                merged: dict[str, list[Any]] = {
                    "text_offset": [],
                    "token_logprobs": [],
                    "tokens": [],
                    "top_logprobs": [],
                }
                for piece in out.pieces:
                    entry = self._completion_logprobs(piece)
                    self._offset += len(piece.text)
                    for key in merged:
                        merged[key].extend(entry[key])
                logprobs = merged
            else:
                logprobs = {"content": [self._chat_logprob(p) for p in out.pieces]}
        choice: dict[str, Any]
        if self.kind == "completion":
            choice = {
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
            }
        else:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": out.finish_reason,
            }
        tail = {
            "choices": [choice],
            "usage": usage_json(prompt_tokens, out.completion_tokens),
        }
        dumps = _dumps if logprobs is None else self._lp_dumps
        return (self._final_head + dumps(tail)[1:]).encode()
