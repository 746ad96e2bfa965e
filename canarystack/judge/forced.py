"""Teacher-forced scoring: every side (baseline, canary, noise baseline) scores the
baseline's own answer, so every position of it is compared, not only those before the first
token the two free-running answers disagree on; and both sides of a comparison are the same
kind of computation (a prefill of the same text), with the same load on each engine.

A free-running comparison stops at the first position where the two sides drew different
tokens: past it they condition on different prefixes (``divergence.compare_positions``). At
temperature 1.0 that is often after a few tokens. Teacher forcing sends every side the
prompt followed by the baseline's answer as one completions prompt with ``echo: true`` and
``logprobs: k`` (the OpenAI legacy completions API; vLLM answers it from its prompt
logprobs, the simulator from its model; the harness's fault proxy drifts an echoed prompt's
logprobs as a kernel would, never its tokens): the echoed answer's tokens then carry that side's
distribution at each position *given the baseline's prefix*, position for position. Those
positions keep the baseline's tokens, so the comparison reads all of them.

What it needs, and what happens without it. Only completions requests: a chat request's
prompt is the engine's chat template, which the judge does not know, so chat comparisons
stay free-running. An engine that refuses ``echo`` (a 4xx) or answers it without the
``text_offset``/``tokens``/``top_logprobs`` columns is *unsupported*: the judge says so
in its verdict and falls back to free-running scoring for that release (``--scoring
auto``) or makes no drift comparison (``--scoring teacher-forced``). An echoed token that
is not the baseline's (the engine tokenised the joined text differently) ends the
comparison there. An echo answer with
``"logprobs": null`` or non-finite logprobs is a broken side, as in a free-running
comparison (maximal divergence for a canary).

This module must never raise on an engine's answer: what is broken becomes a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from canary_contract import strictjson
from canarystack.router.collector import parse_positions
from canarystack.router.divergence import BAD_JSON, MALFORMED, MISSING, Position, SideResult
from canarystack.router.shadow import post_json

# Body fields of the user's request that do not belong in a scoring request.
_DROP = ("stream", "stream_options", "n", "best_of", "echo", "seed", "stop", "suffix")


def answer_text(positions: list[Position]) -> str | None:
    """The baseline's answer as the text its positions name, or None when a position has
    no token text (then nothing can be forced)."""
    tokens = [p.token for p in positions]
    if not tokens or any(t is None for t in tokens):
        return None
    return "".join(t for t in tokens if t is not None)


def forced_body(body: Mapping[str, object], answer: str, k: int) -> dict[str, object] | None:
    """The scoring request: the user's prompt followed by ``answer``, echoed with ``k``
    logprobs, greedy, one new token (which is ignored). None when the prompt is not one
    string (a batch or token ids: nothing to append the answer to)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    out = {key: v for key, v in body.items() if key not in _DROP}
    out.update(
        prompt=prompt + answer,
        echo=True,
        logprobs=k,
        max_tokens=1,
        temperature=0,
        stream=False,
    )
    return out


@dataclass(frozen=True)
class Forced:
    """A forced side: its positions over the answer, or why there are none."""

    positions: list[Position]
    version: str = ""
    error: str | None = None  # the request failed (connect, http_5xx, broken_stream)
    invalid: str | None = None  # answered, but its logprobs are broken
    unsupported: str | None = None  # the engine does not score an echoed prompt: why


def forced_positions(
    doc: Any, prompt_chars: int, answer: list[Position]
) -> tuple[list[Position], str | None, str | None]:
    """(positions, invalid reason, unsupported reason) from an echo answer ``doc``: the
    echoed tokens that start inside the answer (``text_offset`` from ``prompt_chars`` on),
    each while it is the baseline's token at that position."""
    try:
        lp = doc["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        return [], MALFORMED, None
    if lp is None:
        return [], MISSING, None  # asked for logprobs, got none: a broken side
    if not isinstance(lp, dict):
        return [], MALFORMED, None
    names = ("text_offset", "tokens", "top_logprobs", "token_logprobs")
    columns = [lp.get(name) for name in names]
    lists = [c for c in columns if isinstance(c, list)]
    if len(lists) != len(names) or len({len(c) for c in lists}) != 1:
        return [], None, "the echo answer has no text_offset/tokens/top_logprobs columns"
    shift = _leading_text(doc["choices"][0], lp["tokens"])
    offsets = [o - shift if isinstance(o, int) and not isinstance(o, bool) else o for o in lists[0]]
    end = prompt_chars + sum(len(p.token or "") for p in answer)
    region = [
        i
        for i, off in enumerate(offsets)
        if isinstance(off, int) and not isinstance(off, bool) and prompt_chars <= off < end
    ]
    sliced = {name: [lp[name][i] for i in region] for name in ("tokens", "top_logprobs")}
    sliced["token_logprobs"] = [lp["token_logprobs"][i] for i in region]
    positions, why = parse_positions(sliced)
    aligned: list[Position] = []
    for mine, theirs in zip(positions, answer, strict=False):
        if mine.token != theirs.token:
            break
        aligned.append(mine)
    return aligned, why, None


def _leading_text(choice: Any, tokens: list[Any]) -> int:
    """How many characters of token text come before the echoed text: vLLM echoes its
    BOS token ``<s>`` and counts it in ``text_offset`` (the prompt's first token at 3),
    while ``text`` starts with the prompt. 0 when the tokens spell the text exactly (the
    simulator, llama.cpp) or do not end with it (then the offsets are read as given)."""
    text = choice.get("text") if isinstance(choice, dict) else None
    if not isinstance(text, str) or not all(isinstance(t, str) for t in tokens):
        return 0
    joined = "".join(tokens)
    extra = len(joined) - len(text)
    return extra if extra > 0 and joined.endswith(text) else 0


async def fetch_forced(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    headers: Mapping[str, str],
    prompt_chars: int,
    answer: list[Position],
    timeout_s: float,
) -> Forced:
    """Send one scoring request and read its echoed positions."""
    try:
        async with post_json(session, url, body, headers, timeout_s) as resp:
            version = resp.headers.get("x-model-version", "")
            raw = await resp.read()
            if 400 <= resp.status < 500:
                why = f"the engine refused echo with logprobs (HTTP {resp.status})"
                return Forced([], version, unsupported=why)
            if resp.status >= 500:
                return Forced([], version, error=f"http_{resp.status}")
    except aiohttp.ClientConnectorError:
        return Forced([], error="connect")
    except (TimeoutError, aiohttp.ClientError, OSError):
        return Forced([], error="broken_stream")
    try:
        doc = strictjson.loads(raw, keep_non_finite=True)
    except ValueError:
        return Forced([], version, invalid=BAD_JSON)
    positions, invalid, unsupported = forced_positions(doc, prompt_chars, answer)
    if invalid is None and unsupported is None and answer and not positions:
        invalid = MISSING
    return Forced(positions, version, invalid=invalid, unsupported=unsupported)


def as_side(forced: Forced, free: SideResult) -> SideResult:
    """The forced side as a comparison side: its positions, the free-running side's TTFT
    (the latency evidence is the real answer's) and version when the scoring answer named
    none."""
    return SideResult(
        positions=forced.positions,
        ttft_s=free.ttft_s,
        version=forced.version or free.version,
        invalid=forced.invalid,
        dependency=free.dependency,
    )
