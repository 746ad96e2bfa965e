"""The model server's Redis client: a bounded connection pool, timeouts, a per-request
deadline and a circuit breaker, so a slow, full or dead Redis degrades an answer (no
retrieved context) instead of failing or hanging it.

This module must never retry a call, wait past a request's ``deadline_s``, or fail an
answer because Redis failed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypedDict
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from canary_contract.bounds import bounded, check_bounds
from canarystack.common.error_fields import CanaryStackError
from canarystack.dependency.breaker import STATES, CircuitBreaker
from canarystack.dependency.keys import cache_key, context_key

Result = Literal["ok", "miss", "timeout", "error", "circuit_open"]
RESULTS: tuple[Result, ...] = ("ok", "miss", "timeout", "error", "circuit_open")
DEGRADED: frozenset[str] = frozenset({"timeout", "error", "circuit_open"})
MAX_CONTEXT_CHARS = 4096  # a context value longer than this is cut (it lands in prompts)
MAX_ERROR_CHARS = 300
# The fields their flags give in milliseconds (``canarystack.dependency.cli``).
_MS_FIELDS = frozenset({"socket_timeout_s", "connect_timeout_s", "pool_timeout_s", "deadline_s"})


class DependencyConfigError(CanaryStackError, ValueError):
    """A dependency option is wrong; the message names it."""


def _flag(field_name: str) -> str:
    """The ``--redis-*`` flag that sets ``field_name`` (a time in ms is checked in s)."""
    flag = "--redis-" + field_name.replace("_", "-")
    return flag.removesuffix("-s") + "-ms (in seconds)" if field_name in _MS_FIELDS else flag


@dataclass(frozen=True)
class DependencyConfig:
    url: str  # redis://127.0.0.1:PORT[/DB]
    max_connections: int = bounded(16, ge=1, le=1024)
    # Times in seconds, at most 60. Generous enough for a loaded 2-core machine (50/100 ms
    # timed out healthy calls in the game days), short against a 2 s TTFT SLO.
    socket_timeout_s: float = bounded(0.25, gt=0, le=60)
    connect_timeout_s: float = bounded(0.25, gt=0, le=60)
    pool_timeout_s: float = bounded(0.1, gt=0, le=60)  # waiting for a free pooled connection
    deadline_s: float = bounded(0.3, gt=0, le=60)  # both calls of one request together
    cache_ttl_s: int = bounded(30, ge=1, le=86400)
    breaker_failures: int = bounded(5, ge=1)
    breaker_window_s: float = bounded(10.0, gt=0, le=60)
    breaker_cooldown_s: float = bounded(2.0, gt=0, le=60)
    breaker_min_failure_ratio: float = bounded(0.5, gt=0, le=1)  # a share of the window's calls

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme != "redis" or not parts.hostname or parts.port is None:
            raise DependencyConfigError(
                f"--redis-url {self.url!r}: give redis://HOST:PORT (e.g. redis://127.0.0.1:6379)"
            )
        check_bounds(self, DependencyConfigError, _flag)


@dataclass(frozen=True)
class Lookup:
    context: str | None
    result: Result

    @property
    def degraded(self) -> bool:
        return self.result in DEGRADED

    @property
    def header(self) -> str:
        """The ``x-dependency`` value of the answer."""
        return "degraded" if self.degraded else "ok"


class DependencyHealth(TypedDict):
    """What ``/health`` says about the dependency (its ``dependency`` field)."""

    name: str
    state: str
    last_error: str | None
    last_error_at: float | None


class DependencyClient:
    """The model server's bounded, deadline-bound, circuit-broken Redis client.

    Per request (``DependencyClient.lookup``): ``GET ctx:<hash of the first user message>``
    (the retrieved context; a miss is normal) and ``SETEX prefix:<hash of the prompt>`` (the
    prompt-prefix cache write, ``cache_ttl_s``), both within ``deadline_s``. The result is
    one of ``RESULTS``:

    - ``ok`` / ``miss``: Redis answered (with or without a context);
    - ``timeout``: the deadline, a socket timeout or no free pooled connection in time;
    - ``error``: refused, reset, ``max number of clients reached``, any other Redis error;
    - ``circuit_open``: the breaker keeps calls away (after ``breaker_failures``
      consecutive failures, or that many within ``breaker_window_s`` that are at least
      ``breaker_min_failure_ratio`` of its calls; one probe after ``breaker_cooldown_s``).

    The last three are *degraded* answers (``x-dependency: degraded``). Metrics:
    ``canarystack_dependency_requests_total{dependency,result}`` and
    ``canarystack_dependency_circuit_state{dependency,state}`` (1 for the current state).
    No retries: one attempt, bounded, then the answer goes without the dependency.
    """

    def __init__(
        self,
        config: DependencyConfig,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.breaker = CircuitBreaker(
            failures=config.breaker_failures,
            window_s=config.breaker_window_s,
            cooldown_s=config.breaker_cooldown_s,
            min_failure_ratio=config.breaker_min_failure_ratio,
            clock=clock,
        )
        parts = urlsplit(config.url)
        no_retry = Retry(NoBackoff(), 0)
        self.pool = aioredis.BlockingConnectionPool(
            max_connections=config.max_connections,
            timeout=config.pool_timeout_s,
            host=parts.hostname,
            port=parts.port,
            db=int((parts.path or "/0").lstrip("/") or 0),
            socket_timeout=config.socket_timeout_s,
            socket_connect_timeout=config.connect_timeout_s,
            retry=no_retry,
            decode_responses=True,
            client_name="canarystack-model",
        )
        self.redis = aioredis.Redis(connection_pool=self.pool, retry=no_retry)
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        requests_total = Counter(
            "canarystack_dependency_requests",
            "Dependency lookups per request, by result (timeout, error and circuit_open "
            "answers were made without the dependency: x-dependency degraded)",
            ["dependency", "result"],
            registry=registry,
        )
        self.counts = {r: requests_total.labels(dependency="redis", result=r) for r in RESULTS}
        gauge = Gauge(
            "canarystack_dependency_circuit_state",
            "The dependency's circuit breaker: 1 for its current state",
            ["dependency", "state"],
            registry=registry,
        )
        for state in STATES:
            gauge.labels(dependency="redis", state=state).set_function(self._is_state(state))

    def _is_state(self, state: str) -> Callable[[], float]:
        return lambda: 1.0 if self.breaker.state == state else 0.0

    def health(self) -> DependencyHealth:
        """What ``/health`` says about the dependency (the model still serves)."""
        return {
            "name": "redis",
            "state": self.breaker.state,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }

    async def lookup(
        self, first_user_message: str, prompt: str, *, on_call: Callable[[], None] | None = None
    ) -> Lookup:
        """The retrieved context of this request (None on a miss or a degraded answer)
        and the result; never raises for what Redis does, never takes more than
        ``deadline_s``. ``on_call`` runs before each Redis call (a colouring hop)."""
        if not self.breaker.allow():
            return self._done(Lookup(None, "circuit_open"))
        try:
            async with asyncio.timeout(self.config.deadline_s):
                if on_call is not None:
                    on_call()
                value = await self.redis.get(context_key(first_user_message))
                if on_call is not None:
                    on_call()
                await self.redis.setex(cache_key(prompt), self.config.cache_ttl_s, "1")
        except (TimeoutError, RedisTimeoutError) as exc:
            return self._failed("timeout", exc)
        except RedisConnectionError as exc:
            # A pool with no free connection in time is a timeout; the rest are errors.
            kind: Result = "timeout" if "No connection available" in str(exc) else "error"
            return self._failed(kind, exc)
        except (RedisError, OSError) as exc:
            return self._failed("error", exc)
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        self.breaker.success()
        if value is None:
            return self._done(Lookup(None, "miss"))
        return self._done(Lookup(str(value)[:MAX_CONTEXT_CHARS], "ok"))

    def _failed(self, result: Result, exc: BaseException) -> Lookup:
        self.breaker.failure()
        text = str(exc) or type(exc).__name__
        self.last_error = f"{result}: {type(exc).__name__}: {text}"[:MAX_ERROR_CHARS]
        self.last_error_at = time.time()
        return self._done(Lookup(None, result))

    def _done(self, lookup: Lookup) -> Lookup:
        self.counts[lookup.result].inc()
        return lookup

    async def close(self) -> None:
        await self.redis.aclose()
        await self.pool.disconnect()
