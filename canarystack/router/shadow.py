"""Shadow comparison: sample requests per prompt-length bucket, send a copy to the other
variant, and compare the two next-token distributions.

The comparison math is ``divergence.py``, reading an answer ``collector.py``; the names
are re-exported here for the callers that import them from this module.

Shadow work must never delay or break the user's response: copies run as fire-and-forget
tasks, every error is counted and swallowed, and the comparison waits for the user's
answer to hold the positions it compares (not for its whole stream), never the other way
round. A record sent to the gate must never hold a non-finite number.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from canary_contract import strictjson
from canary_contract.buckets import bucket_labels
from canarystack.router.collector import (
    Collector,
    LogprobRequest,
    parse_positions,
    positions_from_logprobs,
    shadow_safe,
    user_logprobs_k,
    with_logprobs,
)
from canarystack.router.divergence import (
    BAD_JSON,
    BAD_TEXT,
    KL_MAX_NATS,
    MALFORMED,
    MISSING,
    NON_FINITE,
    Position,
    SideResult,
    compare_positions,
    comparison_result,
    kl_topk,
    top1,
    truncate_top,
)

__all__ = [
    "BAD_JSON",
    "BAD_TEXT",
    "KL_MAX_NATS",
    "MALFORMED",
    "MISSING",
    "NON_FINITE",
    "Collector",
    "LogprobRequest",
    "Position",
    "SideResult",
    "compare_positions",
    "comparison_result",
    "kl_topk",
    "parse_positions",
    "positions_from_logprobs",
    "shadow_safe",
    "top1",
    "truncate_top",
    "user_logprobs_k",
    "with_logprobs",
]

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
    # In-flight slots only the long-prompt buckets (those at the highest shadow rate) may
    # take: their comparisons carry most of the detection power (a long prompt is
    # shadowed at rate 1), so a burst of short prompts must not use every slot.
    reserved_long: int = 4

    def long_bucket(self, bucket: str) -> bool:
        """Whether ``bucket`` is a long-prompt one: shadowed at the highest rate."""
        top = max(self.rates.values(), default=0.0)
        return top > 0.0 and self.rates.get(bucket, 0.0) >= top

    def slots_for(self, bucket: str) -> int:
        """The in-flight copies a request of ``bucket`` may find running and still start."""
        if self.long_bucket(bucket):
            return self.max_inflight
        return max(0, self.max_inflight - self.reserved_long)


def is_greedy(body: Mapping[str, object]) -> bool:
    t = body.get("temperature")
    return isinstance(t, int | float) and not isinstance(t, bool) and t == 0


# A shared seed fits every engine's seed field (vLLM: int64; llama.cpp's server: uint32).
SEED_RANGE = 2**31


def coupled_body(body: Mapping[str, object]) -> Mapping[str, object]:
    """The request with a seed both sides of a comparison share (coupled sampling).

    A sampled request (temperature > 0) that carries no ``seed`` gets a fresh random one;
    the user's copy and the shadow copy then draw with the same random numbers (vLLM's
    per-request seed, the simulator's too), so where the two distributions are close they
    draw the same tokens and the comparison reads every position up to the first
    difference (``compare_positions``), not only the first. Unseeded draws agree only by
    chance. The user's answer is as random as before: the seed is new for every request and
    never reused. A request that is greedy or brings its own seed (any value: the upstream
    judges it) is sent as it came.
    """
    if is_greedy(body) or body.get("seed") is not None:
        return body
    return {**body, "seed": secrets.randbelow(SEED_RANGE)}


def shadow_body(
    body: Mapping[str, object], chat: bool, k: int, max_tokens: int
) -> dict[str, object]:
    """The shadow copy: same prompt and sampling params (seed included), streamed, n=1,
    few tokens."""
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
    """Decides which requests get shadow copies and keeps the in-flight cap.

    Sampling. Each request's prompt-length bucket has a rate (``--shadow-rates``, long
    prompts sampled more). A sampled request gets a *baseline-canary* comparison (the copy
    goes to the variant that did not serve the user) while the canary is live; with
    probability ``rate × noise_fraction`` a request served by the baseline also gets a
    *baseline-baseline* comparison against another baseline replica — the live noise floor.
    At most ``max_inflight`` shadow copies run at once, and the last ``reserved_long`` of
    them only for the long-prompt buckets; beyond that the sample is dropped and counted
    (``dropped_cap``), so shadow load never grows without bound. A copy holds its slot until
    its comparison is scored: once both sides have ``max_tokens`` positions, not when the
    user's whole answer has been relayed (``shadow_session``).
    """

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
        slots = self.settings.slots_for(bucket)
        for pair in pairs:
            if self.inflight + len(kept) >= slots:
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


def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    headers: Mapping[str, str],
    timeout_s: float,
) -> Any:
    """``session.post`` of ``body`` as strict JSON within ``timeout_s`` (a context manager:
    the answer), as every shadow and judge request to an engine is sent."""
    return session.post(
        url,
        data=strictjson.dumps_bytes(body),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def fetch_side(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
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
        async with post_json(session, url, body, headers, timeout_s) as resp:
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
