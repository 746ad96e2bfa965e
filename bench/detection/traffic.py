"""The benchmark's user traffic: the game day's load, request for request.

The game day's Locust load (``probes.load`` → ``gameday.load``) runs ``--users`` closed-loop
users (16 by default), each sending the next request of the synthetic mix as soon as its
last one ended: lognormal prompt lengths (``gameday.load.prompts.SyntheticMix``, median
1020 tokens, clipped to 16-8192), ``max_tokens`` from the mix capped at the game day's 48,
streamed completions, no ``temperature`` (the model server's default, 1.0: the router
couples the two sides' sampling with a shared seed and compares positions while their
tokens agree) and a ``user`` per request. This
module sends exactly those bodies (``gameday.load.rows.build_body``), so what the gate
sees here is what it sees in a game day.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import aiohttp

from canary_contract.json import JsonObject
from gameday.load.options import LoadOptions
from gameday.load.prompts import MixSettings, parse_mix
from gameday.load.rows import build_body

GAMEDAY_USERS = 16  # experiments/*.yaml load_users
GAMEDAY_MAX_TOKENS = 48  # experiments/*.yaml load_max_tokens
REQUEST_TIMEOUT_S = 60.0


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
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.opts = LoadOptions(host=self.url)
        self.mix = parse_mix(
            "synthetic", MixSettings(seed=self.seed, max_tokens_cap=self.max_tokens)
        )
        self.next_index = itertools.count()

    def describe(self) -> JsonObject:
        p = self.mix.params
        return {
            "shape": f"closed loop, {self.users} users (the game day's Locust load)",
            "prompt_mix": "synthetic (gameday.load.prompts.SyntheticMix)",
            "prompt_tokens_median": p.median_tokens,
            "prompt_tokens_range": [p.min_tokens, p.max_tokens],
            "max_tokens_cap": self.max_tokens,
            "temperature": "server default (1.0), as the game day",
            "stream": True,
            "seed": self.seed,
        }

    async def one(self, session: aiohttp.ClientSession) -> None:
        req = self.mix.request(next(self.next_index))
        rec = Record(start=time.time(), prompt_tokens=req.planned_prompt_tokens)
        body = build_body(self.opts, req, stream=True)
        try:
            async with session.post(self.url + self.opts.api_path, json=body) as r:
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
