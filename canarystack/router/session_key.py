"""A request's session key: what the gate's dependence rule groups comparisons by.

The release test (``canarystack.gate.sessions``) admits at most one comparison per session
key every few seconds, so that the alike comparisons of one conversation, agent run or RAG
user cannot crowd a detector's memory. The router names the session, since only it sees
the request:

1. the OpenAI ``user`` field of the body (the end-user id clients send for abuse
   monitoring), else
2. the ``x-user-id`` header (the key of sticky canary routing), else
3. the prompt's opening: for chat, the messages up to and including the first ``user``
   message (every later turn of a conversation repeats them); for completions, the
   prompt's first ``PREFIX_BYTES`` bytes (a multi-turn or RAG prompt that grows at its end
   keeps its start).

The key is a hash (``u:`` or ``p:`` and 24 hex digits of SHA-256): no user id or prompt
text leaves the router in a sample. A prompt template shared by *different* users with
nothing user-specific in its first ``PREFIX_BYTES`` bytes groups them into one key; a
client that sends ``user`` (or ``x-user-id``) avoids that, and the gate counts thinned
comparisons in ``/v1/gate`` so it can be seen.

This module must never do I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from canary_contract import strictjson

# The prompt opening hashed when no user is named: about 256 tokens of English.
PREFIX_BYTES = 1024


def _digest(kind: str, data: bytes) -> str:
    return f"{kind}:{hashlib.sha256(data).hexdigest()[:24]}"


def _opening(body: Mapping[str, Any], chat: bool) -> Any:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("role") == "user":
                return messages[: i + 1]
        return messages
    return body.get("prompt")


def session_key(body: Mapping[str, Any], chat: bool, user_header: str | None) -> str | None:
    """The request's session key, or None when it names no user and has no prompt."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return _digest("u", user.encode())
    if user_header:
        return _digest("u", user_header.encode())
    opening = _opening(body, chat)
    if opening is None:
        return None
    try:
        data = strictjson.dumps_bytes(opening)
    except (TypeError, ValueError):
        return None
    return _digest("p", data[:PREFIX_BYTES])
