"""Caps on concurrent proxied requests, per client and per variant pool (#27 finding 1).

Every proxied request, streamed or not, holds an engine slot until it ends, so a client
that opens many streams and never reads them can fill a whole model pool and every other
user waits. ``StreamCaps`` counts the requests in flight per client key (the ``x-user-id``
the router routes on, else the peer address) and per variant pool; a request above either
cap is answered 429 naming the cap, the count and what to do. The deadlines in
``forward`` bound how long each admitted request may hold its place.

This module must never await or do I/O: taking and giving back a place is O(1).
"""

from __future__ import annotations

from dataclasses import dataclass

from canary_contract.errors import ErrorKind
from canarystack.common.errors import ApiError
from canarystack.router.routing import USER_HEADER


class TooManyStreams(ApiError):
    """A client or a pool has as many requests in flight as its cap allows."""

    status = 429
    type = ErrorKind.INVALID_REQUEST


@dataclass(frozen=True)
class Place:
    """One admitted request's place: given back once, when it ends."""

    client: str
    variant: str


def client_key(user_id: str | None, peer: str | None) -> str:
    """Whom a request counts against: its ``x-user-id``, else its peer address."""
    if user_id:
        return f"user:{user_id}"
    return f"addr:{peer or 'unknown'}"


class StreamCaps:
    """Requests in flight per client key and per variant pool, with their caps."""

    def __init__(self, per_client: int, per_pool: int) -> None:
        self.per_client = per_client
        self.per_pool = per_pool
        self.clients: dict[str, int] = {}
        self.pools: dict[str, int] = {}
        self.refused = {"client": 0, "pool": 0}

    def take(self, client: str, variant: str) -> Place:
        """A place for one request, or ``TooManyStreams`` (429) naming the cap."""
        held = self.clients.get(client, 0)
        if held >= self.per_client:
            self.refused["client"] += 1
            who = client.split(":", 1)
            name = f"{USER_HEADER} {who[1]!r}" if who[0] == "user" else f"client {who[1]}"
            raise TooManyStreams(
                f"Too many concurrent requests: {name} has {held} in flight, the cap per "
                f"client is {self.per_client} (--max-client-streams). Finish or close a "
                "stream (read it to the end) before opening another, or retry shortly.",
                code="too_many_client_streams",
                param=USER_HEADER if who[0] == "user" else None,
            )
        in_pool = self.pools.get(variant, 0)
        if in_pool >= self.per_pool:
            self.refused["pool"] += 1
            raise TooManyStreams(
                f"Too many concurrent requests to the {variant} pool: {in_pool} in flight, "
                f"the cap per pool is {self.per_pool} (--max-pool-streams); retry shortly.",
                code="too_many_pool_streams",
            )
        self.clients[client] = held + 1
        self.pools[variant] = in_pool + 1
        return Place(client, variant)

    def give_back(self, place: Place) -> None:
        left = self.clients.get(place.client, 0) - 1
        if left > 0:
            self.clients[place.client] = left
        else:
            self.clients.pop(place.client, None)
        self.pools[place.variant] = max(0, self.pools.get(place.variant, 0) - 1)

    def to_json(self) -> dict[str, object]:
        return {
            "per_client_cap": self.per_client,
            "per_pool_cap": self.per_pool,
            "in_flight": dict(self.pools),
            "clients": len(self.clients),
            "refused": dict(self.refused),
        }
