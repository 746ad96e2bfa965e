"""The shared dependency's command-line flags, one set for every model server (the
simulator, ``canarystack.model``, and the engine pod, ``canarystack.engine``), and the
``DependencyConfig`` they give (a usage error naming the flag when one is wrong)."""

from __future__ import annotations

import argparse

from canarystack.dependency.client import DependencyConfig, DependencyConfigError


def add_dependency_options(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group(
        "shared dependency (Redis)",
        "Per request a context lookup (GET ctx:<hash of the first user message>, the value "
        "prepended as a system context) and a prompt-prefix cache write (SETEX), through a "
        "bounded pool with timeouts and a circuit breaker: a slow, full or dead Redis "
        "makes the answer without context (x-dependency: degraded), never fails it.",
    )
    d.add_argument(
        "--redis-url",
        default=None,
        help="redis://HOST:PORT of the dependency (default: none, no lookups and no "
        "x-dependency header)",
    )
    d.add_argument(
        "--redis-max-connections", type=int, default=16, help="pool size (default %(default)s)"
    )
    for flag, default, what in (
        ("--redis-socket-timeout-ms", 250.0, "one Redis read or write"),
        ("--redis-connect-timeout-ms", 250.0, "connecting"),
        ("--redis-pool-timeout-ms", 100.0, "waiting for a free pooled connection"),
        ("--redis-deadline-ms", 300.0, "all Redis calls of one request together"),
    ):
        d.add_argument(
            flag, type=float, default=default, help=f"timeout for {what} (ms, default %(default)s)"
        )
    d.add_argument(
        "--redis-cache-ttl-s",
        type=int,
        default=30,
        help="TTL of the prompt-prefix cache entries (default %(default)s)",
    )
    d.add_argument(
        "--redis-breaker-failures",
        type=int,
        default=5,
        help="failures in the window that open the circuit (default %(default)s)",
    )
    d.add_argument(
        "--redis-breaker-window-s",
        type=float,
        default=10.0,
        help="the breaker's failure window (s, default %(default)s)",
    )
    d.add_argument(
        "--redis-breaker-cooldown-s",
        type=float,
        default=2.0,
        help="open -> half-open, one probe call (s, default %(default)s)",
    )
    d.add_argument(
        "--redis-breaker-min-failure-ratio",
        type=float,
        default=0.5,
        help="share of the window's calls that must have failed too (default %(default)s)",
    )


def dependency_from_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> DependencyConfig | None:
    if args.redis_url is None:
        return None
    try:
        return DependencyConfig(
            url=args.redis_url,
            max_connections=args.redis_max_connections,
            socket_timeout_s=args.redis_socket_timeout_ms / 1000.0,
            connect_timeout_s=args.redis_connect_timeout_ms / 1000.0,
            pool_timeout_s=args.redis_pool_timeout_ms / 1000.0,
            deadline_s=args.redis_deadline_ms / 1000.0,
            cache_ttl_s=args.redis_cache_ttl_s,
            breaker_failures=args.redis_breaker_failures,
            breaker_window_s=args.redis_breaker_window_s,
            breaker_cooldown_s=args.redis_breaker_cooldown_s,
            breaker_min_failure_ratio=args.redis_breaker_min_failure_ratio,
        )
    except DependencyConfigError as exc:
        parser.error(str(exc))
