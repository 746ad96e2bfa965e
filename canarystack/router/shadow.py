"""Shadow comparison: sample requests per prompt-length bucket, send a copy to the other
variant, and compare the two next-token distributions.

Sampling. Each request's prompt-length bucket has a rate (``--shadow-rates``, long
prompts sampled more). A sampled request gets a *baseline-canary* comparison (the copy
goes to the variant that did not serve the user) while the canary is live; with
probability ``rate × noise_fraction`` a request served by the baseline also gets a
*baseline-baseline* comparison against another baseline replica — the live noise floor.
At most ``max_inflight`` shadow copies run at once; beyond that the sample is dropped and
counted, so shadow load never grows without bound.

Which positions are compared. Position 0 (the first generated token) always: both sides
condition on the same prompt. Position i > 0 only while both requests decode greedily
(``temperature == 0``) and the tokens generated at positions 0..i-1 agree on both sides —
otherwise the two sides condition on different prefixes and their distributions are not
comparable. The top-k lists are cut to the shorter side's k.

KL per position, over the union of the two top-k sets. For side X in {P, Q} (P is the
baseline, Q the canary — or the second baseline replica) with top-k set T_X and
log-probabilities l_X(t)::

    U       = T_P ∪ T_Q
    f_X     = max(eps, min(min_{s in T_X} exp l_X(s),  1 - sum_{s in T_X} exp l_X(s)))
    p~_X(t) = exp l_X(t)  if t in T_X  else  f_X          (floor for a token X did not list)
    p_X(t)  = p~_X(t) / sum_{u in U} p~_X(u)              (renormalised over U)
    KL(P || Q) = sum_{t in U} p_P(t) * ln(p_P(t) / p_Q(t))   [nats, >= 0]

with eps = 1e-6. The floor is the largest probability a token missing from X's top-k
could have (it is at most X's k-th probability and at most X's tail mass), so a token
that only fell just below the other side's cut-off costs little, and a token the other
side ranks high but X does not list at all costs a lot. Per comparison we report the mean
KL over compared positions, the KL at position 0, the share of positions whose top-1
tokens agree, both TTFTs (send to first content event), the bucket and the versions.

A broken engine is evidence, never silence. Upstream JSON is read with
``canarystack.common.strictjson`` (``NaN``/``Infinity`` tokens are seen, not accepted). A
side whose answer is broken — a non-finite logprob, a missing or malformed ``logprobs``
object, an empty top list, an event that is not JSON, a ``text``/``delta.content`` that is
not a string — is *invalid* (``SideResult.invalid`` says why). In a baseline-canary pair
an invalid canary side is a comparison of maximal divergence (``KL_MAX_NATS``, top-1
disagreement, ``"invalid": <reason>`` in the record); an invalid baseline side says
nothing about the canary and is dropped (counted). In a baseline-baseline pair an invalid
side is dropped (counted), so the noise floor never sees an infinite value.

Shadow work must never delay or break the user's response: copies run as fire-and-forget
tasks, every error is counted and swallowed, and the comparison waits for the user's
stream to finish rather than the other way round. A record sent to the gate must never
hold a non-finite number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from canary_contract.buckets import bucket_labels
from canarystack.common import strictjson

FLOOR_EPS = 1e-6
# Maximal divergence: what a comparison against a broken canary side counts as. The gate
# clips each comparison's KL at its --drift-kl-clip (default 1.0 nats), so this is the
# largest value the gate's drift test can use.
KL_MAX_NATS = 1.0
# A logprob above this is not a log-probability (rounding may give a hair above 0).
LOGPROB_MAX = 1e-3

# Why a side is invalid (SideResult.invalid, the record's "invalid").
NON_FINITE = "non_finite_logprobs"
MALFORMED = "malformed_logprobs"
MISSING = "missing_logprobs"
BAD_JSON = "bad_json"
BAD_TEXT = "bad_text"
DEFAULT_TOPK = 5
# Default sampling rates by bucket label (the default edges); other labels get
# DEFAULT_OTHER_RATE unless given on the command line.
DEFAULT_RATES: dict[str, float] = {
    "0-512": 0.05,
    "512-1k": 0.1,
    "1k-2k": 0.25,
    "2k-4k": 1.0,
    "4k+": 1.0,
}
DEFAULT_OTHER_RATE = 0.1
# How long a shadow comparison waits for the user's stream to finish before giving up.
PRIMARY_WAIT_S = 120.0
SHADOW_TIMEOUT_S = 60.0

# The header a model server names its shared dependency's part in the answer with.
DEPENDENCY_HEADER = "x-dependency"

_EVENT_SPLIT = re.compile(rb"\r?\n\r?\n")


# --------------------------------------------------------------------------- math


def kl_topk(
    p_top: Mapping[str, float], q_top: Mapping[str, float], eps: float = FLOOR_EPS
) -> float:
    """KL(P || Q) in nats over the union of two top-k lists (token -> logprob).

    See the module docstring for the formula (floor for missing tokens, renormalised).
    A non-finite logprob on either side, or a result that is not finite, is maximal
    divergence (``KL_MAX_NATS``): never 0, never an exception.
    """
    if not p_top or not q_top:
        raise ValueError("kl_topk needs two non-empty top-k lists")
    values = (*p_top.values(), *q_top.values())
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return KL_MAX_NATS
    p_probs = {t: math.exp(lp) for t, lp in p_top.items()}
    q_probs = {t: math.exp(lp) for t, lp in q_top.items()}
    p_floor = max(eps, min(min(p_probs.values()), 1.0 - sum(p_probs.values())))
    q_floor = max(eps, min(min(q_probs.values()), 1.0 - sum(q_probs.values())))
    union = p_probs.keys() | q_probs.keys()
    p_vals = [p_probs.get(t, p_floor) for t in union]
    q_vals = [q_probs.get(t, q_floor) for t in union]
    p_sum = sum(p_vals)
    q_sum = sum(q_vals)
    kl = 0.0
    for pv, qv in zip(p_vals, q_vals, strict=True):
        pn = pv / p_sum
        if pn <= 0.0:
            continue  # 0 * log(0 / q) is 0
        qn = qv / q_sum
        if qn <= 0.0:
            return KL_MAX_NATS  # P lists a token Q gives probability 0: unbounded
        kl += pn * math.log(pn / qn)
    if not math.isfinite(kl):
        return KL_MAX_NATS
    return max(0.0, kl)


def top1(top: Mapping[str, float]) -> str:
    # Ties broken by token text so both sides break them the same way.
    return max(top.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _rank(v: Any) -> float:
    """Sort key for a logprob that may be malformed (what is not a finite number sorts last)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return math.inf
    return -float(v)


def truncate_top(top: Mapping[str, float], k: int) -> dict[str, float]:
    if len(top) <= k:
        return dict(top)
    return dict(sorted(top.items(), key=lambda kv: (_rank(kv[1]), str(kv[0])))[:k])


@dataclass
class Position:
    """One generated position: the token chosen and the top-k alternatives."""

    token: str | None
    top: dict[str, float]


@dataclass
class PositionScore:
    kl: float
    top1_agree: bool


def compare_positions(a: list[Position], b: list[Position], greedy: bool) -> list[PositionScore]:
    """Scores at the positions where both sides condition on the same prefix."""
    scores: list[PositionScore] = []
    for i in range(min(len(a), len(b))):
        if i > 0 and not (
            greedy and a[i - 1].token is not None and a[i - 1].token == b[i - 1].token
        ):
            break
        pa, pb = a[i].top, b[i].top
        k = min(len(pa), len(pb))
        if k == 0:
            break
        pa, pb = truncate_top(pa, k), truncate_top(pb, k)
        scores.append(PositionScore(kl_topk(pa, pb), top1(pa) == top1(pb)))
    return scores


# --------------------------------------------------------------- response shapes


def _logprob_ok(v: Any) -> str | None:
    """None when ``v`` is a usable logprob, else why not."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return MALFORMED
    if not math.isfinite(v):
        return NON_FINITE
    if v > LOGPROB_MAX:
        return MALFORMED
    return None


def parse_positions(lp: Any) -> tuple[list[Position], str | None]:
    """Positions from one choice's ``logprobs`` object (OpenAI chat or completions shape)
    and, when it is broken, why (``NON_FINITE`` or ``MALFORMED``). ``None`` (no logprobs)
    gives no positions and no reason: the caller knows whether logprobs were due."""
    if lp is None:
        return [], None
    if not isinstance(lp, dict):
        return [], MALFORMED
    out: list[Position] = []
    content = lp.get("content")
    if isinstance(content, list):  # chat: [{"token", "logprob", "top_logprobs": [...]}]
        for item in content:
            if not isinstance(item, dict):
                return out, MALFORMED
            alts = item.get("top_logprobs")
            if not isinstance(alts, list) or not alts:
                return out, MALFORMED
            top: dict[str, float] = {}
            for alt in alts:
                if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                    return out, MALFORMED
                why = _logprob_ok(alt.get("logprob"))
                if why is not None:
                    return out, why
                top[alt["token"]] = float(alt["logprob"])
            if "logprob" in item and (why := _logprob_ok(item["logprob"])) is not None:
                return out, why
            tok = item.get("token")
            out.append(Position(tok if isinstance(tok, str) else None, top))
        return out, None
    tops = lp.get("top_logprobs")
    if isinstance(tops, list):  # completions: tokens[], top_logprobs[{token: logprob}]
        tokens = lp.get("tokens") or []
        if not isinstance(tokens, list):
            return out, MALFORMED
        for v in lp.get("token_logprobs") or ():
            if v is not None and (why := _logprob_ok(v)) is not None:
                return out, why
        for i, t in enumerate(tops):
            if not isinstance(t, dict) or not t:
                return out, MALFORMED
            top = {}
            for k, v in t.items():
                why = _logprob_ok(v)
                if why is not None:
                    return out, why
                top[str(k)] = float(v)
            tok = tokens[i] if i < len(tokens) and isinstance(tokens[i], str) else None
            out.append(Position(tok, top))
        return out, None
    if content is None and tops is None:
        return out, None  # an empty logprobs object (no token in this event)
    return out, MALFORMED


def positions_from_logprobs(lp: Any) -> list[Position]:
    """The positions ``parse_positions`` could read (up to the first broken one)."""
    return parse_positions(lp)[0]


def _trim_logprobs(lp: Any, keep_k: int | None) -> Any:
    """``None`` strips logprobs entirely; an int cuts every top list to that many."""
    if keep_k is None or not isinstance(lp, dict):
        return None
    lp = dict(lp)
    content = lp.get("content")
    if isinstance(content, list):
        new_content = []
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("top_logprobs"), list):
                item = dict(item)
                alts = [a for a in item["top_logprobs"] if isinstance(a, dict)]
                alts.sort(key=lambda a: _rank(a.get("logprob")))
                item["top_logprobs"] = alts[:keep_k]
            new_content.append(item)
        lp["content"] = new_content
    tops = lp.get("top_logprobs")
    if isinstance(tops, list):
        lp["top_logprobs"] = [truncate_top(t, keep_k) if isinstance(t, dict) else t for t in tops]
    return lp


def _has_content(choice: Mapping[str, Any]) -> bool:
    if choice.get("text") or choice.get("logprobs"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(delta.get("content"))


def _text_broken(choice: Mapping[str, Any]) -> bool:
    """True when the generated text is not a string (garbage from the engine)."""
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        return True
    delta = choice.get("delta")
    if delta is None:
        return False
    if not isinstance(delta, dict):
        return True
    content = delta.get("content")
    return content is not None and not isinstance(content, str)


def _lenient_non_finite(payload: bytes) -> tuple[Any, bool]:
    """Parse what strict JSON refused, leniently: (object or None, whether it held a
    non-finite number). Only used to say *why* an answer is broken and to strip it."""
    seen = False

    def const(_name: str) -> float:
        nonlocal seen
        seen = True
        return math.nan

    def flt(text: str) -> float:
        nonlocal seen
        v = float(text)
        if not math.isfinite(v):
            seen = True
        return v

    try:
        return json.loads(payload, parse_constant=const, parse_float=flt), seen
    except (ValueError, RecursionError):
        return None, False


@dataclass
class LogprobRequest:
    """What the router asked upstream for, versus what the user asked for."""

    chat: bool
    k: int  # top-k requested upstream
    user_k: int | None  # None: the user did not ask for logprobs at all

    @property
    def rewrite(self) -> bool:
        return self.user_k is None or self.user_k < self.k


def user_logprobs_k(body: Mapping[str, Any], chat: bool) -> int | None:
    """The top-k the user asked for, or None when the user did not ask for logprobs."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        k = body.get("top_logprobs")
        return k if isinstance(k, int) and not isinstance(k, bool) else 0
    k = body.get("logprobs")
    if k is None or isinstance(k, bool) or not isinstance(k, int):
        return None
    return k


def shadow_safe(body: Mapping[str, Any], chat: bool) -> bool:
    """Whether a request may be sampled: its logprob fields are absent or well-formed (a
    malformed one must reach the upstream untouched and get its 400 there) and it does
    not ask for things a comparison cannot use (``echo``, several choices)."""
    if body.get("echo") or body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return False
    lp = body.get("logprobs")
    if chat:
        if lp not in (None, True, False):
            return False
        top = body.get("top_logprobs")
        return top is None or (isinstance(top, int) and not isinstance(top, bool) and top >= 0)
    return lp is None or (isinstance(lp, int) and not isinstance(lp, bool) and lp >= 0)


def with_logprobs(body: dict[str, Any], chat: bool, k: int) -> dict[str, Any]:
    out = dict(body)
    if chat:
        out["logprobs"] = True
        out["top_logprobs"] = k
    else:
        out["logprobs"] = k
    return out


class Collector:
    """Reads a response (SSE chunks or a whole JSON body) for choice 0's positions and the
    time of the first content event, and rewrites logprobs the user did not ask for.

    Used only for sampled requests: it parses every event, which the plain relay never does.
    ``invalid`` is the first reason the answer is broken (module docstring), else None;
    ``broken`` adds "logprobs were due but none came".
    """

    def __init__(self, lp: LogprobRequest, max_positions: int, clock: Callable[[], float]) -> None:
        self.lp = lp
        self.max_positions = max_positions
        self.clock = clock
        self.positions: list[Position] = []
        self.first_content_t: float | None = None
        self._buf = b""
        self.keep_k: int | None = lp.user_k
        self.invalid: str | None = None
        self._content_events = 0
        self._missing_events = 0

    def _mark(self, reason: str) -> None:
        if self.invalid is None:
            self.invalid = reason

    @property
    def broken(self) -> str | None:
        if self.invalid is not None:
            return self.invalid
        if self._missing_events or (self._content_events and not self.positions):
            return MISSING
        return None

    def _parse(self, payload: bytes) -> tuple[Any, bool]:
        """(object, strict): the strict parse, or on failure a lenient one (marked invalid)
        whose logprobs may only be stripped, never read."""
        try:
            return strictjson.loads(payload), True
        except ValueError:
            obj, non_finite = _lenient_non_finite(payload)
            self._mark(NON_FINITE if non_finite else BAD_JSON)
            return obj, False

    def _take(self, obj: Any, now: float) -> bool:
        """Collect from one response object; True when it was changed by the rewrite."""
        if not isinstance(obj, dict):
            self._mark(BAD_JSON)
            return False
        choices = obj.get("choices")
        if not isinstance(choices, list):
            self._mark(BAD_JSON)
            return False
        changed = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) == 0:
                if _text_broken(choice):
                    self._mark(BAD_TEXT)
                has_content = _has_content(choice)
                if self.first_content_t is None and has_content:
                    self.first_content_t = now
                lp = choice.get("logprobs")
                if has_content:
                    self._content_events += 1
                    if lp is None:
                        self._missing_events += 1
                got, why = parse_positions(lp)
                if why is not None:
                    self._mark(why)
                if len(self.positions) < self.max_positions:
                    self.positions.extend(got[: self.max_positions - len(self.positions)])
            if self.lp.rewrite and choice.get("logprobs") is not None:
                choice["logprobs"] = _trim_logprobs(choice["logprobs"], self.keep_k)
                changed = True
        return changed

    def feed_event(self, event: bytes, now: float) -> bytes:
        """One SSE event (without its blank-line terminator) -> the bytes to send on."""
        lines = event.split(b"\n")
        changed = False
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            obj, strict = self._parse(payload)
            if strict:
                if self._take(obj, now):
                    lines[i] = b"data: " + strictjson.dumps_bytes(obj)
                    changed = True
            elif (out := self._strip_broken(obj)) is not None:
                lines[i] = b"data: " + out
                changed = True
        return b"\n".join(lines) if changed else event

    def _strip_broken(self, obj: Any) -> bytes | None:
        """A leniently parsed object with the logprobs the user did not ask for removed,
        when that leaves strict JSON; None to pass the upstream's bytes on unchanged."""
        if not self.lp.rewrite or not isinstance(obj, dict):
            return None
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return None
        for choice in choices:
            if isinstance(choice, dict) and choice.get("logprobs") is not None:
                choice["logprobs"] = _trim_logprobs(choice["logprobs"], self.keep_k)
        try:
            return strictjson.dumps_bytes(obj)
        except ValueError:
            return None

    def feed_chunk(self, chunk: bytes) -> bytes:
        """Stream chunk in, bytes out. Without a rewrite the chunk goes out unchanged
        (events are parsed from a copy); with one, only whole events go out."""
        now = self.clock()
        self._buf += chunk
        parts = _EVENT_SPLIT.split(self._buf)
        self._buf = parts.pop()
        if not self.lp.rewrite:
            for ev in parts:
                self.feed_event(ev, now)
            return chunk
        if not parts:
            return b""
        return b"".join(self.feed_event(ev, now) + b"\n\n" for ev in parts)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        rest, self._buf = self._buf, b""
        if not rest:
            return b""
        out = self.feed_event(rest, self.clock())
        return out if self.lp.rewrite else b""

    def feed_body(self, body: bytes) -> bytes:
        """A whole (non-streaming) JSON response."""
        now = self.clock()
        obj, strict = self._parse(body)
        if self.first_content_t is None:
            self.first_content_t = now
        if not strict:
            out = self._strip_broken(obj)
            return body if out is None else out
        if self._take(obj, now):
            return strictjson.dumps_bytes(obj)
        return body


# ---------------------------------------------------------------------- sampling


def parse_shadow_rates(text: str, edges: tuple[int, ...]) -> dict[str, float]:
    """``"0-512=0.05,2k-4k=1"`` -> rate per bucket label (others keep their defaults)."""
    labels = bucket_labels(edges)
    rates = {lab: DEFAULT_RATES.get(lab, DEFAULT_OTHER_RATE) for lab in labels}
    if not text.strip():
        return rates
    for item in text.split(","):
        if not item.strip():
            continue
        label, sep, value = item.partition("=")
        label = label.strip()
        if not sep or label not in rates:
            raise ValueError(
                f"--shadow-rates item {item.strip()!r}: write BUCKET=RATE with BUCKET one of "
                f"{', '.join(labels)} (from --bucket-edges), e.g. 2k-4k=1"
            )
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not 0.0 <= rate <= 1.0:
            raise ValueError(
                f"--shadow-rates item {item.strip()!r}: the rate must be a number from 0 to 1"
            )
        rates[label] = rate
    return rates


@dataclass
class ShadowSettings:
    rates: dict[str, float]
    noise_fraction: float = 0.2
    max_inflight: int = 8
    max_tokens: int = 8
    topk: int = DEFAULT_TOPK


@dataclass
class SideResult:
    positions: list[Position] = field(default_factory=list)
    ttft_s: float | None = None
    version: str = ""
    error: str | None = None  # the side failed (http_5xx, broken_stream, connect, ...)
    invalid: str | None = None  # the side answered, but broken (module docstring)
    # The model server's x-dependency answer ("ok" | "degraded"), None when it sent none.
    dependency: str | None = None


def is_greedy(body: Mapping[str, Any]) -> bool:
    t = body.get("temperature")
    return isinstance(t, int | float) and not isinstance(t, bool) and t == 0


def shadow_body(body: Mapping[str, Any], chat: bool, k: int, max_tokens: int) -> dict[str, Any]:
    """The shadow copy: same prompt and sampling params, streamed, n=1, few tokens."""
    out = {k_: v for k_, v in body.items() if k_ not in ("stream_options", "best_of", "echo")}
    out["stream"] = True
    out["n"] = 1
    user_max = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(user_max, int) and not isinstance(user_max, bool) and user_max > 0:
        max_tokens = min(max_tokens, user_max)
    out["max_tokens"] = max_tokens
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = max_tokens
    return with_logprobs(out, chat, k)


class ShadowStats:
    """Counters the shadow code reports through (the server binds them to Prometheus)."""

    def __init__(
        self,
        on_request: Callable[[str, str], None],
        on_comparison: Callable[[str, str], None],
    ) -> None:
        self.on_request = on_request  # (pair, result)
        self.on_comparison = on_comparison  # (pair, bucket)


class ShadowManager:
    """Decides which requests get shadow copies and keeps the in-flight cap."""

    def __init__(
        self, settings: ShadowSettings, stats: ShadowStats, rng: random.Random | None = None
    ) -> None:
        self.settings = settings
        self.stats = stats
        self.rng = rng or random.Random()
        self.inflight = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def plan(
        self, bucket: str, served: str, canary_live: bool, baseline_replicas: int
    ) -> list[str]:
        rate = self.settings.rates.get(bucket, 0.0)
        if rate <= 0.0:
            return []
        u = self.rng.random()
        pairs: list[str] = []
        if canary_live and u < rate:
            pairs.append("baseline-canary")
        if (
            served == "baseline"
            and baseline_replicas >= 2
            and self.settings.noise_fraction > 0
            and self.rng.random() < rate * self.settings.noise_fraction
        ):
            pairs.append("baseline-baseline")
        kept: list[str] = []
        for pair in pairs:
            if self.inflight + len(kept) >= self.settings.max_inflight:
                self.stats.on_request(pair, "dropped_cap")
                continue
            kept.append(pair)
        return kept

    def launch(self, coro: Any) -> None:
        self.inflight += 1
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight -= 1
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.stats.on_request("any", "internal_error")

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(BaseException):
                await task


def build_comparison(
    *,
    pair: str,
    a: SideResult,
    b: SideResult,
    greedy: bool,
    bucket: str,
    prompt_tokens: int,
    request_id: str,
) -> dict[str, Any] | None:
    """The comparison record (docs/ARCHITECTURE.md §3), or None when nothing comparable."""
    scores = compare_positions(a.positions, b.positions, greedy)
    if not scores:
        return None
    kls = [s.kl for s in scores]
    return {
        "time": time.time(),
        "pair": pair,
        "bucket": bucket,
        "prompt_tokens": prompt_tokens,
        "positions": len(scores),
        "kl_mean": sum(kls) / len(kls),
        "kl_first": kls[0],
        "top1_agree": sum(1 for s in scores if s.top1_agree) / len(scores),
        "ttft_a_s": a.ttft_s,
        "ttft_b_s": b.ttft_s,
        "version_a": a.version,
        "version_b": b.version,
        "request_id": request_id,
    }


def broken_record(
    *,
    pair: str,
    a: SideResult,
    b: SideResult,
    bucket: str,
    prompt_tokens: int,
    request_id: str,
    reason: str,
) -> dict[str, Any]:
    """A comparison of maximal divergence against a broken side ``b`` (finite values)."""
    return {
        "time": time.time(),
        "pair": pair,
        "bucket": bucket,
        "prompt_tokens": prompt_tokens,
        "positions": max(1, len(a.positions)),
        "kl_mean": KL_MAX_NATS,
        "kl_first": KL_MAX_NATS,
        "top1_agree": 0.0,
        "ttft_a_s": a.ttft_s,
        "ttft_b_s": b.ttft_s,
        "version_a": a.version,
        "version_b": b.version,
        "request_id": request_id,
        "invalid": reason,
    }


def comparison_result(
    *,
    pair: str,
    a: SideResult,
    b: SideResult,
    greedy: bool,
    bucket: str,
    prompt_tokens: int,
    request_id: str,
) -> tuple[str, dict[str, Any] | None]:
    """(result for the metric, record for the gate or None) for two sides that answered.

    ``a`` is a baseline side; ``b`` the canary (baseline-canary) or a second baseline.
    Results: ``ok``; ``canary_invalid`` (record of maximal divergence); ``baseline_invalid``
    and ``invalid_dropped`` (dropped: a broken baseline says nothing about the canary, and
    the noise floor must stay finite); ``not_comparable``.
    """
    a_bad = a.invalid or (MISSING if b.positions and not a.positions else None)
    b_bad = b.invalid or (MISSING if a.positions and not b.positions else None)
    if pair == "baseline-canary":
        if a_bad is not None:
            return "baseline_invalid", None
        if b_bad is not None:
            return "canary_invalid", broken_record(
                pair=pair,
                a=a,
                b=b,
                bucket=bucket,
                prompt_tokens=prompt_tokens,
                request_id=request_id,
                reason=b_bad,
            )
    elif a_bad is not None or b_bad is not None:
        return "invalid_dropped", None
    record = build_comparison(
        pair=pair,
        a=a,
        b=b,
        greedy=greedy,
        bucket=bucket,
        prompt_tokens=prompt_tokens,
        request_id=request_id,
    )
    if record is None:
        return "not_comparable", None
    return "ok", record


async def fetch_side(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    max_positions: int,
    timeout_s: float = SHADOW_TIMEOUT_S,
) -> SideResult:
    """Send one shadow copy (streamed) and collect its positions and TTFT."""
    clock = time.perf_counter
    collector = Collector(LogprobRequest(chat=False, k=0, user_k=10**6), max_positions, clock)
    t_send = clock()
    result = SideResult()
    try:
        async with session.post(
            url,
            data=strictjson.dumps_bytes(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            result.version = resp.headers.get("x-model-version", "")
            result.dependency = resp.headers.get(DEPENDENCY_HEADER)
            if resp.status >= 400:
                result.error = f"http_{resp.status}"
                await resp.read()
                return result
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                async for chunk in resp.content.iter_any():
                    collector.feed_chunk(chunk)
                collector.flush()
            else:
                collector.feed_body(await resp.read())
    except aiohttp.ClientConnectorError:
        result.error = "connect"
        return result
    except (TimeoutError, aiohttp.ClientError, OSError):
        result.error = "broken_stream"
        return result
    result.positions = collector.positions
    result.invalid = collector.broken
    if collector.first_content_t is not None:
        result.ttft_s = collector.first_content_t - t_send
    return result
