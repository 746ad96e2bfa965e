"""Upstream pools: round robin over a variant's replicas with passive health.

This module must never buffer a stream or parse response bodies: relaying is the
server's job, chunk by chunk.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# How long a replica that refused a connection is skipped (while others are up).
DOWN_S = 2.0

# Hop-by-hop and length headers that must not be copied from upstream responses.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
    }
)


@dataclass
class Upstream:
    url: str
    down_until: float = 0.0
    failures: int = 0

    def is_up(self, now: float) -> bool:
        return self.down_until <= now


@dataclass
class Pool:
    """The replicas of one variant.

    A pool is the list of model-server URLs for one variant. ``Pool.candidates()`` gives the
    order in which to try replicas for one request: round robin over the healthy ones, then
    the ones marked down (so a pool whose replicas all refused recently is still tried, and
    recovers on the first success — there is no active health check).

    Passive health: a replica that refused a connection is marked down for ``DOWN_S`` seconds
    and skipped while any other replica is up. A request is retried on another replica only
    when nothing was sent (a connect error); once the request went out it is never resent,
    because a second generation would be a second, different answer to the user.
    """

    variant: str
    upstreams: list[Upstream]
    clock: Callable[[], float] = time.monotonic
    _rr: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def from_urls(
        cls, variant: str, urls: Iterable[str], clock: Callable[[], float] = time.monotonic
    ) -> Pool:
        return cls(variant, [Upstream(u.rstrip("/")) for u in urls], clock=clock)

    def __len__(self) -> int:
        return len(self.upstreams)

    def candidates(self, exclude: str | None = None) -> list[Upstream]:
        """Replicas to try, in order: healthy ones round robin, then the marked-down ones."""
        ups = self.upstreams
        n = len(ups)
        if n == 0:
            return []
        start = next(self._rr) % n
        now = self.clock()
        ordered = ups[start:] + ups[:start]
        if exclude is not None:
            ordered = [u for u in ordered if u.url != exclude]
        up = [u for u in ordered if u.down_until <= now]
        if len(up) == len(ordered):
            return ordered
        return up + sorted((u for u in ordered if u.down_until > now), key=lambda u: u.down_until)

    def mark_down(self, upstream: Upstream) -> None:
        upstream.down_until = self.clock() + DOWN_S
        upstream.failures += 1

    def mark_up(self, upstream: Upstream) -> None:
        if upstream.down_until:
            upstream.down_until = 0.0

    def to_json(self) -> list[dict[str, object]]:
        now = self.clock()
        return [
            {"url": u.url, "up": u.is_up(now), "connect_failures": u.failures}
            for u in self.upstreams
        ]
