"""The benchmark's user traffic: the game day's load, request for request.

The game day's Locust load (``probes.load`` → ``gameday.load``) runs ``--users`` closed-loop
users (16 by default), each sending the next request of the synthetic mix as soon as its
last one ended: lognormal prompt lengths (``gameday.load.prompts.SyntheticMix``, median
1020 tokens, clipped to 16-8192), ``max_tokens`` from the mix capped at the game day's 48,
streamed completions, no ``temperature`` (the model server's default, 1.0: the router
couples the two sides' sampling with a shared seed and compares positions while their
tokens agree) and a ``user`` per request (body and ``x-user-id``). This
module sends exactly those bodies (``gameday.load.rows.build_body``), so what the gate
sees here is what it sees in a game day.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import itertools
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from canary_contract.json import JsonObject
from gameday.load.options import LoadOptions
from gameday.load.prompts import MixSettings, SyntheticMix, parse_mix
from gameday.load.rows import build_body

GAMEDAY_USERS = 16  # experiments/*.yaml load_users
GAMEDAY_MAX_TOKENS = 48  # experiments/*.yaml load_max_tokens
REQUEST_TIMEOUT_S = 120.0


def trace_output_lengths(path: Path) -> list[int]:
    """The ``GeneratedTokens`` column of an Azure LLM inference trace CSV (the lengths of
    real answers), for ``--output-lengths trace``."""
    with path.open(newline="") as fh:
        rows = csv.DictReader(fh)
        if rows.fieldnames is None or "GeneratedTokens" not in rows.fieldnames:
            raise SystemExit(f"--trace {path}: no GeneratedTokens column (an Azure LLM trace?)")
        out = [int(r["GeneratedTokens"]) for r in rows if r["GeneratedTokens"].strip()]
    if not out or min(out) < 1:
        raise SystemExit(f"--trace {path}: GeneratedTokens must be >= 1 on every row")
    return out


@dataclass
class Record:
    start: float
    prompt_tokens: int
    served_by: str = ""
    status: int = 0
    error: str = ""


@dataclass
class Traffic:
    url: str
    users: int = GAMEDAY_USERS
    seed: int = 0
    max_tokens: int = GAMEDAY_MAX_TOKENS
    # When given: each request's max_tokens is drawn from these (a trace's answer lengths)
    # instead of the mix's own capped at ``max_tokens``.
    output_lengths: list[int] | None = None
    trace_name: str = ""
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.opts = LoadOptions(host=self.url)
        mix = parse_mix("synthetic", MixSettings(seed=self.seed, max_tokens_cap=self.max_tokens))
        assert isinstance(mix, SyntheticMix)
        self.mix = mix
        self.next_index = itertools.count()
        self.length_rng = random.Random(self.seed + 7919)

    def describe(self) -> JsonObject:
        p = self.mix.params
        return {
            "shape": f"closed loop, {self.users} users (the game day's Locust load)",
            "prompt_mix": "synthetic (gameday.load.prompts.SyntheticMix)",
            "prompt_tokens_median": p.median_tokens,
            "prompt_tokens_range": [p.min_tokens, p.max_tokens],
            **self._lengths(),
            "temperature": "server default (1.0), as the game day",
            "stream": True,
            "seed": self.seed,
        }

    def _lengths(self) -> JsonObject:
        if self.output_lengths is None:
            return {"max_tokens_cap": self.max_tokens}
        q = statistics.quantiles(self.output_lengths, n=20, method="inclusive")
        return {
            "max_tokens": f"drawn per request from {self.trace_name} GeneratedTokens",
            "max_tokens_median": statistics.median(self.output_lengths),
            "max_tokens_p95": q[-1],
            "max_tokens_max": max(self.output_lengths),
        }

    async def one(self, session: aiohttp.ClientSession) -> None:
        req = self.mix.request(next(self.next_index))
        if self.output_lengths is not None:
            req = dataclasses.replace(req, max_tokens=self.length_rng.choice(self.output_lengths))
        rec = Record(start=time.time(), prompt_tokens=req.planned_prompt_tokens)
        body = build_body(self.opts, req, stream=True)
        # The header the game day's Locust user sends (gameday.load.user): the router's
        # sticky routing and per-client stream cap key on it (else on the peer address,
        # which all 16 users here share).
        headers = {"x-user-id": req.user_id} if req.user_id else None
        try:
            async with session.post(self.url + self.opts.api_path, json=body, headers=headers) as r:
                await r.read()
                rec.status = r.status
                rec.served_by = r.headers.get("x-served-by", "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            rec.error = type(exc).__name__
            await asyncio.sleep(0.1)  # a refused connect fails at once: do not spin
        self.records.append(rec)

    async def user(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.one(session)

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self.user(session, stop) for _ in range(self.users)))
