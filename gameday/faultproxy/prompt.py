"""What the proxy reads from an inference request: its route (completion or chat), whether
it streams, its ``max_tokens``, the model it names, and an estimate of its prompt tokens.

Prompt tokens are estimated with the reference simulator's own rule, one token per
whitespace-separated word, and one more per chat message for its role marker (the
simulator renders a chat as ``<|role|> content`` lines). For the simulator the estimate is
exact; for a real engine's BPE tokenizer it is an under-estimate (a word is often 1-3
tokens), so a ``min_prompt_tokens`` threshold acts on somewhat longer prompts than named.

This module must never raise on a body it cannot read: such a request is passed through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ROUTES = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
# OpenAI's default max_tokens for completions; what the cut point of a truncation uses when
# the request names none.
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class RequestFacts:
    route: str  # "completion" or "chat"
    stream: bool
    include_usage: bool
    max_tokens: int
    model: str
    prompt_tokens: int
    # An ``echo`` completions request: the length of its prompt in characters (its echoed
    # tokens are the prompt, scored, not generated); 0 otherwise.
    echo_chars: int = 0


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def _content_words(content: Any) -> int:
    if isinstance(content, list):  # OpenAI content parts: the text parts count
        return sum(_words(p.get("text")) for p in content if isinstance(p, dict))
    return _words(content)


def estimate_prompt_tokens(route: str, body: dict[str, Any]) -> int:
    """Prompt tokens of a request body, by the whitespace-word rule (module docstring).
    Token-id prompts count their ids."""
    if route == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return 0
        return sum(1 + _content_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _words(prompt)
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)
        return sum(_words(p) if isinstance(p, str) else len(p) for p in prompt if p)
    return 0


def read_request(route: str, raw: bytes) -> RequestFacts | None:
    """The facts of an inference request, or None when the body is not a JSON object (the
    upstream answers it as it would)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    options = body.get("stream_options")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = DEFAULT_MAX_TOKENS
    model = body.get("model")
    return RequestFacts(
        route=route,
        stream=body.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        max_tokens=max_tokens,
        model=model if isinstance(model, str) else "unknown",
        prompt_tokens=estimate_prompt_tokens(route, body),
        echo_chars=_echo_chars(route, body),
    )


def _echo_chars(route: str, body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if route != "completion" or body.get("echo") is not True or not isinstance(prompt, str):
        return 0
    return len(prompt)
