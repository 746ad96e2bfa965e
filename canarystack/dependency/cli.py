"""The shared dependency's command-line flags, one set for every model server (the
simulator, ``canarystack.model``, and the engine pod, ``canarystack.engine``), and the
``DependencyConfig`` they give (a usage error naming the flag when one is wrong)."""

from __future__ import annotations

import argparse

from canarystack.common.cli import Flag, add_flags, fields_from_args
from canarystack.dependency.client import DependencyConfig, DependencyConfigError


def _timeout(flag: str, field: str, default: float, what: str) -> Flag:
    return Flag(
        flag, field, f"timeout for {what} (ms, default %(default)s)", default=default, scale=1000.0
    )


DEPENDENCY_FLAGS = (
    Flag(
        "--redis-url",
        "url",
        "redis://HOST:PORT of the dependency (default: none, no lookups and no "
        "x-dependency header)",
        type=str,
    ),
    Flag("--redis-max-connections", "max_connections", "pool size (default %(default)s)", int, 16),
    _timeout("--redis-socket-timeout-ms", "socket_timeout_s", 250.0, "one Redis read or write"),
    _timeout("--redis-connect-timeout-ms", "connect_timeout_s", 250.0, "connecting"),
    _timeout(
        "--redis-pool-timeout-ms",
        "pool_timeout_s",
        100.0,
        "waiting for a free pooled connection",
    ),
    _timeout("--redis-deadline-ms", "deadline_s", 300.0, "all Redis calls of one request together"),
    Flag(
        "--redis-cache-ttl-s",
        "cache_ttl_s",
        "TTL of the prompt-prefix cache entries (default %(default)s)",
        int,
        30,
    ),
    Flag(
        "--redis-breaker-failures",
        "breaker_failures",
        "failures in the window that open the circuit (default %(default)s)",
        int,
        5,
    ),
    Flag(
        "--redis-breaker-window-s",
        "breaker_window_s",
        "the breaker's failure window (s, default %(default)s)",
        default=10.0,
    ),
    Flag(
        "--redis-breaker-cooldown-s",
        "breaker_cooldown_s",
        "open -> half-open, one probe call (s, default %(default)s)",
        default=2.0,
    ),
    Flag(
        "--redis-breaker-min-failure-ratio",
        "breaker_min_failure_ratio",
        "share of the window's calls that must have failed too (default %(default)s)",
        default=0.5,
    ),
)


def add_dependency_options(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group(
        "shared dependency (Redis)",
        "Per request a context lookup (GET ctx:<hash of the first user message>, the value "
        "prepended as a system context) and a prompt-prefix cache write (SETEX), through a "
        "bounded pool with timeouts and a circuit breaker: a slow, full or dead Redis "
        "makes the answer without context (x-dependency: degraded), never fails it.",
    )
    add_flags(d, DEPENDENCY_FLAGS)


def dependency_from_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> DependencyConfig | None:
    if args.redis_url is None:
        return None
    try:
        return DependencyConfig(**fields_from_args(args, DEPENDENCY_FLAGS))
    except DependencyConfigError as exc:
        parser.error(str(exc))
