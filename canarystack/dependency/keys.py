"""The keys both model variants read and write, so a hit on one side is a hit on the
other: ``ctx:<hash>`` (the retrieved context of a conversation, keyed by its first user
message) and ``prefix:<hash>`` (the prompt-prefix cache entry a request writes, with a
short TTL). The stack seeds a few ``ctx:`` keys at start (``SEED_CONTEXTS``); a miss is
the normal case.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib

CONTEXT_PREFIX = "ctx:"
CACHE_PREFIX = "prefix:"

# First user messages whose context the stack seeds at start (a retrieval index, in
# miniature). The value is prepended to the prompt as a system context.
SEED_CONTEXTS: dict[str, str] = {
    "hello world": "context: greetings are answered briefly and politely",
    "what is a canary release": "context: a canary serves a small share of traffic first",
    "summarise the incident": "context: incidents are summarised as cause impact and fix",
    "explain the rollback": "context: a rollback moves all traffic back to the stable version",
}


def _digest(text: str) -> str:
    return hashlib.blake2b(
        text.strip().encode("utf-8", "surrogatepass"), digest_size=16
    ).hexdigest()


def context_key(first_user_message: str) -> str:
    return CONTEXT_PREFIX + _digest(first_user_message)


def cache_key(prompt: str) -> str:
    return CACHE_PREFIX + _digest(prompt)


def seed_items() -> dict[str, str]:
    """``{key: value}`` of the seeded contexts."""
    return {context_key(msg): value for msg, value in SEED_CONTEXTS.items()}
