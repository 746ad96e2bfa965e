"""Variant choice: which pool (baseline or canary) serves one request.

This module must never do I/O or keep state: it is pure functions on the hot path.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping
from typing import Any, Literal

from canarystack.common.errors import BadRequest
from canarystack.tokenizer import render_chat

Variant = Literal["baseline", "canary"]
PIN_HEADER = "x-canary-variant"
USER_HEADER = "x-user-id"
SLOTS = 10_000  # hash resolution: weights are honoured to 0.01 pp
# Texts longer than this are counted slice by slice (each slice ~1 ms of str.split).
COUNT_SLICE_CHARS = 64 * 1024
_SPACE = re.compile(r"\s")


def count_tokens(text: str) -> int:
    """``canarystack.tokenizer.count_tokens`` (whitespace words), in slices cut at
    whitespace so no word is split: the same count, without one long C call.

    Prompt token counts use the simulator's tokenizer (one token per whitespace word; chat
    messages rendered with ``canarystack.tokenizer.render_chat``). For a real engine this is
    an estimate of the engine's own count, good enough for bucketing and the long-prompt rule.
    A long text is counted in slices (the same count), so a worker thread counting a
    megabytes-long prompt lets the event loop in between slices.
    """
    n = len(text)
    if n <= COUNT_SLICE_CHARS:
        return len(text.split())
    total = 0
    start = 0
    while start < n:
        end = start + COUNT_SLICE_CHARS
        if end < n:
            m = _SPACE.search(text, end)
            end = m.start() if m else n
        total += len(text[start:end].split())
        start = end
    return total


def user_slot(release: str, user_key: str) -> int:
    """The user's stable slot in [0, SLOTS)."""
    digest = hashlib.blake2b(
        release.encode() + b"\0" + user_key.encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") % SLOTS


def canary_threshold(weight_pct: float) -> int:
    """Slots below this number go to the canary (weight 0..100 percent)."""
    return max(0, min(SLOTS, round(weight_pct * SLOTS / 100)))


def parse_pin(value: str | None) -> Variant | None:
    """The pinned variant from the ``x-canary-variant`` header, or None when absent."""
    if value is None:
        return None
    v = value.strip().lower()
    if v == "baseline":
        return "baseline"
    if v == "canary":
        return "canary"
    raise BadRequest(
        f"Header {PIN_HEADER}: {value!r} is not a variant; send 'baseline' or 'canary', "
        "or leave the header out to let the router choose.",
        param=PIN_HEADER,
    )


def choose_variant(
    *,
    release: str,
    user_key: str | None,
    weight_pct: float,
    prompt_tokens: int,
    max_canary_prompt_tokens: int | None = None,
    rng: random.Random | None = None,
) -> Variant:
    """The variant for an unpinned request (the pin is handled by the caller).

    Order of rules (first match wins):

    1. ``x-canary-variant: baseline|canary`` pins the variant (any other value is a 400).
    2. Prompts above ``max_canary_prompt_tokens`` (when set) go to the baseline.
    3. Sticky weighted consistent hashing on the user key (``x-user-id``, else a random key):
       ``slot = H(release, user) mod 10000`` and the request goes to the canary when
       ``slot < round(weight_pct * 100)``. A user keeps its variant while the weight does not
       change, raising the weight only moves users from baseline to canary (never back), and
       over many users the canary share is the weight (±1 pp over a few thousand users).

    The hash is BLAKE2b over ``release + "\\0" + user``: stable across processes, replicas
    and Python versions (unlike ``hash()``), and salted with the release so two releases do
    not pick the same users.
    """
    threshold = canary_threshold(weight_pct)
    if threshold <= 0:
        return "baseline"
    if max_canary_prompt_tokens is not None and prompt_tokens > max_canary_prompt_tokens:
        return "baseline"
    if user_key is None:
        slot = (rng or random).randrange(SLOTS)
    else:
        slot = user_slot(release, user_key)
    return "canary" if slot < threshold else "baseline"


def _count_prompt(prompt: Any) -> int:
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):  # one prompt as token ids
            return len(prompt)
        return sum(_count_prompt(p) for p in prompt)
    return 0


def prompt_tokens_of(body: Mapping[str, Any]) -> int:
    """Prompt length in simulator tokens for a completions or chat body (0 if none).

    Never raises: a malformed prompt counts 0 tokens and the upstream answers the 4xx.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return count_tokens(render_chat(m for m in messages if isinstance(m, Mapping)))
    return _count_prompt(body.get("prompt"))
