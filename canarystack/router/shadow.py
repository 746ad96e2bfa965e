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

Shadow work must never delay or break the user's response: copies run as fire-and-forget
tasks, every error is counted and swallowed, and the comparison waits for the user's
stream to finish rather than the other way round.
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

from canarystack.common.buckets import bucket_labels

FLOOR_EPS = 1e-6
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

_EVENT_SPLIT = re.compile(rb"\r?\n\r?\n")


# --------------------------------------------------------------------------- math


def kl_topk(
    p_top: Mapping[str, float], q_top: Mapping[str, float], eps: float = FLOOR_EPS
) -> float:
    """KL(P || Q) in nats over the union of two top-k lists (token -> logprob).

    See the module docstring for the formula (floor for missing tokens, renormalised).
    """
    if not p_top or not q_top:
        raise ValueError("kl_topk needs two non-empty top-k lists")
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
        kl += pn * math.log(pn / (qv / q_sum))
    return max(0.0, kl)


def top1(top: Mapping[str, float]) -> str:
    # Ties broken by token text so both sides break them the same way.
    return max(top.items(), key=lambda kv: (kv[1], kv[0]))[0]


def truncate_top(top: Mapping[str, float], k: int) -> dict[str, float]:
    if len(top) <= k:
        return dict(top)
    return dict(sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:k])


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


def positions_from_logprobs(lp: Any) -> list[Position]:
    """Positions from one choice's ``logprobs`` object, OpenAI chat or completions shape."""
    if not isinstance(lp, dict):
        return []
    out: list[Position] = []
    content = lp.get("content")
    if isinstance(content, list):  # chat: [{"token", "logprob", "top_logprobs": [...]}]
        for item in content:
            if not isinstance(item, dict):
                continue
            top: dict[str, float] = {}
            for alt in item.get("top_logprobs") or ():
                if isinstance(alt, dict) and isinstance(alt.get("logprob"), int | float):
                    top[str(alt.get("token"))] = float(alt["logprob"])
            tok = item.get("token")
            out.append(Position(tok if isinstance(tok, str) else None, top))
        return out
    tops = lp.get("top_logprobs")
    if isinstance(tops, list):  # completions: tokens[], top_logprobs[{token: logprob}]
        tokens = lp.get("tokens") or []
        for i, t in enumerate(tops):
            top = (
                {str(k): float(v) for k, v in t.items() if isinstance(v, int | float)}
                if isinstance(t, dict)
                else {}
            )
            tok = tokens[i] if i < len(tokens) and isinstance(tokens[i], str) else None
            out.append(Position(tok, top))
    return out


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
                alts.sort(key=lambda a: -float(a.get("logprob", -math.inf)))
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
    """

    def __init__(self, lp: LogprobRequest, max_positions: int, clock: Callable[[], float]) -> None:
        self.lp = lp
        self.max_positions = max_positions
        self.clock = clock
        self.positions: list[Position] = []
        self.first_content_t: float | None = None
        self._buf = b""
        self.keep_k: int | None = lp.user_k

    def _take(self, obj: Any, now: float) -> bool:
        """Collect from one response object; True when it was changed by the rewrite."""
        if not isinstance(obj, dict):
            return False
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return False
        changed = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) == 0:
                if self.first_content_t is None and _has_content(choice):
                    self.first_content_t = now
                if len(self.positions) < self.max_positions:
                    got = positions_from_logprobs(choice.get("logprobs"))
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
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if self._take(obj, now):
                lines[i] = b"data: " + json.dumps(obj, separators=(",", ":")).encode()
                changed = True
        return b"\n".join(lines) if changed else event

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
        try:
            obj = json.loads(body)
        except ValueError:
            return body
        if self.first_content_t is None:
            self.first_content_t = now
        if self._take(obj, now):
            return json.dumps(obj, separators=(",", ":")).encode()
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
    error: str | None = None


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
            data=json.dumps(body, separators=(",", ":")).encode(),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            result.version = resp.headers.get("x-model-version", "")
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
    if collector.first_content_t is not None:
        result.ttft_s = collector.first_content_t - t_send
    return result
