"""``python -m canarystack.router``: parse flags, build the app, serve it.

This module must never do work at import time, nor start listening misconfigured
(exit code 2, a message naming the flags).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from aiohttp import web

from canary_contract import strictjson
from canary_contract.buckets import DEFAULT_EDGES, parse_edges
from canarystack.common import logs
from canarystack.common.auth import ENV_VAR, describe_admin_flag, load_admin_token, token_or_admin
from canarystack.common.cli import (
    base_parser,
    bound_port,
    entry,
    install_uvloop,
    parse,
    until_stopped,
    write_ready_file,
)
from canarystack.common.deadlines import deadline_runner
from canarystack.router.config import WATCH_ERROR_FAILSAFE_S
from canarystack.router.server import (
    DEFAULT_MAX_BODY_BYTES,
    RouterSettings,
    build_app,
    default_control_session,
    default_upstream_session,
)
from canarystack.router.settings import (
    CLIENT_WRITE_S,
    GATE_DEADMAN_S,
    MAX_CLIENT_STREAMS,
    MAX_POOL_STREAMS,
    REQUEST_DEADLINE_S,
    STALL_EVIDENCE_S,
    UPSTREAM_FIRST_BYTE_S,
    UPSTREAM_IDLE_S,
    StreamDeadlines,
)
from canarystack.router.shadow import ShadowSettings, parse_shadow_rates

_DEFAULT_RATES = "0-512=0.05,512-1k=0.1,1k-2k=0.25,2k-4k=1,4k+=1"
MIN_BODY_BYTES = 1024
BROKER_HEALTH_TIMEOUT_S = 2.0
PROG = "python -m canarystack.router"


def _usage_error(msg: str) -> SystemExit:
    """Exit code 2 (a usage error, as argparse's) with the message on stderr."""
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return SystemExit(2)


def _urls(flag: str, text: str) -> list[str]:
    urls = [u.strip().rstrip("/") for u in text.split(",") if u.strip()]
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise SystemExit(
                f"{flag} {text!r}: {u!r} is not an http(s) URL; give base URLs separated "
                "by commas, e.g. http://127.0.0.1:18120,http://127.0.0.1:18121"
            )
    return urls


def build_parser() -> argparse.ArgumentParser:
    p = base_parser("router", "Model router: canary routing, shadow comparison, fail-safe config")
    p.add_argument("--router-id", default=None, help="this replica's id (default router-<pid>)")
    p.add_argument("--broker", default=None, help="broker base URL (without it: 0%% canary)")
    p.add_argument("--release", default="default", help="release to follow (default %(default)s)")
    p.add_argument("--baseline", required=True, help="baseline replica URLs, comma-separated")
    p.add_argument("--canary", default="", help="canary replica URLs, comma-separated")
    p.add_argument("--gate", default=None, help="gate base URL for samples (optional)")
    p.add_argument(
        "--broker-token-file",
        default=None,
        help="file holding the heartbeat credential sent to the broker (default: the admin "
        "token, single-credential mode)",
    )
    p.add_argument(
        "--gate-token-file",
        default=None,
        help="file holding the samples credential sent to the gate (default: the admin "
        "token, single-credential mode)",
    )
    describe_admin_flag(p)
    p.add_argument("--state-dir", default=".stack", help="where router-<id>.json is cached")
    p.add_argument("--instance-port", type=int, default=None, help="second, per-replica port")
    p.add_argument("--heartbeat-s", type=float, default=1.0, help="heartbeat interval (s)")
    p.add_argument(
        "--watch-timeout-s", type=float, default=10.0, help="broker long-poll length (s)"
    )
    p.add_argument(
        "--bucket-edges",
        default=",".join(str(e) for e in DEFAULT_EDGES),
        help="prompt-length bucket edges in tokens (default %(default)s)",
    )
    p.add_argument(
        "--max-canary-prompt-tokens",
        type=int,
        default=None,
        help="prompts above this many tokens never go to the canary",
    )
    p.add_argument(
        "--shadow-rates",
        default=_DEFAULT_RATES,
        help="shadow sampling rate per bucket, BUCKET=RATE,... (default %(default)s)",
    )
    p.add_argument(
        "--shadow-noise-fraction",
        type=float,
        default=0.2,
        help="baseline-vs-baseline comparisons at this fraction of the bucket rate "
        "(needs 2+ baseline replicas; 0 disables; default %(default)s)",
    )
    p.add_argument("--shadow-max-inflight", type=int, default=8, help="cap on shadow copies")
    p.add_argument(
        "--shadow-reserved-long",
        type=int,
        default=None,
        help="of --shadow-max-inflight, the slots only the long-prompt buckets (those at the "
        "highest --shadow-rates rate) may take (default: half, rounded down)",
    )
    p.add_argument("--shadow-max-tokens", type=int, default=8, help="max_tokens of a shadow copy")
    p.add_argument("--shadow-topk", type=int, default=5, help="top-k logprobs compared")
    p.add_argument("--no-shadow", action="store_true", help="turn shadow comparison off")
    p.add_argument(
        "--sample-queue-size", type=int, default=10_000, help="bound on records for the gate"
    )
    p.add_argument("--gate-flush-s", type=float, default=0.2, help="batch interval to the gate")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body read, in bytes; larger ones get 413 (default %(default)s "
        "= 1 MiB, about 32k tokens of prompt: size it from the model's max_model_len, "
        "since a bigger body can only stall the event loop that parses it)",
    )
    p.add_argument(
        "--watch-error-failsafe-s",
        type=float,
        default=WATCH_ERROR_FAILSAFE_S,
        help="broker watch errors lasting longer than this put the router at 0%% canary "
        "until a watch succeeds (default %(default)s)",
    )
    _deadline_flags(p)
    return p


# (flag, default, help): the deadlines and caps of #27 (settings.py says why each default).
_DEADLINE_FLAGS = (
    ("--request-deadline-s", REQUEST_DEADLINE_S, "longest a proxied request may take, "
     "arrival to last byte; past it the upstream is cancelled (error upstream_deadline)"),
    ("--upstream-first-byte-s", UPSTREAM_FIRST_BYTE_S, "longest a stream's upstream may "
     "stay silent before its first body byte (queue wait + prefill)"),
    ("--upstream-idle-s", UPSTREAM_IDLE_S, "longest a stream's upstream may stay silent "
     "between two body bytes; past it the stream is cancelled (error upstream_stall)"),
    ("--client-write-s", CLIENT_WRITE_S, "longest one write to a client may stay blocked; "
     "past it the client has stopped reading: its stream is cancelled, its upstream released"),
    ("--stall-evidence-s", STALL_EVIDENCE_S, "a client that leaves while its upstream has "
     "been silent this long left because of the stall: an upstream_stall outcome"),
    ("--gate-deadman-s", GATE_DEADMAN_S, "samples the gate has not accepted for this long "
     "put the canary at 0%% and /health at degraded, until the gate accepts again"),
)  # fmt: skip
_CAP_FLAGS = (
    ("--max-client-streams", MAX_CLIENT_STREAMS, "concurrent proxied requests per client "
     "(x-user-id, else the peer address); above it 429"),
    ("--max-pool-streams", MAX_POOL_STREAMS, "concurrent proxied requests per variant pool; "
     "above it 429"),
)  # fmt: skip


def _deadline_flags(p: argparse.ArgumentParser) -> None:
    for flag, default, text in _DEADLINE_FLAGS:
        p.add_argument(flag, type=float, default=default, help=f"{text} (default %(default)s)")
    for flag, default, text in _CAP_FLAGS:
        p.add_argument(flag, type=int, default=default, help=f"{text} (default %(default)s)")


def _deadlines_from_args(args: argparse.Namespace, fail: Callable[[str], SystemExit]) -> None:
    """Refuse a deadline that is not a finite number of seconds > 0, or a cap below 1."""
    for flag, _, _ in _DEADLINE_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if not 0 < value < float("inf"):
            raise fail(f"{flag} must be a finite number of seconds > 0, got {value}")
    for flag, _, _ in _CAP_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value < 1:
            raise fail(f"{flag} must be at least 1, got {value}")


def settings_from_args(args: argparse.Namespace) -> RouterSettings:
    def fail(msg: str) -> SystemExit:
        return SystemExit(f"python -m canarystack.router: {msg}")

    try:
        edges = parse_edges(args.bucket_edges)
    except ValueError as exc:
        raise fail(f"--bucket-edges: {exc}") from None
    baseline = _urls("--baseline", args.baseline)
    if not baseline:
        raise fail("--baseline: give at least one baseline replica URL")
    shadow: ShadowSettings | None = None
    if not args.no_shadow:
        try:
            rates = parse_shadow_rates(args.shadow_rates, edges)
        except ValueError as exc:
            raise fail(str(exc)) from None
        if not 0 <= args.shadow_noise_fraction <= 1:
            raise fail("--shadow-noise-fraction must be from 0 to 1")
        for flag, value in (
            ("--shadow-max-inflight", args.shadow_max_inflight),
            ("--shadow-max-tokens", args.shadow_max_tokens),
            ("--shadow-topk", args.shadow_topk),
        ):
            if value < 1:
                raise fail(f"{flag} must be at least 1, got {value}")
        reserved = args.shadow_reserved_long
        if reserved is None:
            reserved = args.shadow_max_inflight // 2
        if not 0 <= reserved < args.shadow_max_inflight:
            raise fail(
                f"--shadow-reserved-long must be from 0 to --shadow-max-inflight - 1 "
                f"({args.shadow_max_inflight - 1}), got {reserved}: the short "
                "buckets need at least one slot"
            )
        shadow = ShadowSettings(
            rates=rates,
            noise_fraction=args.shadow_noise_fraction,
            max_inflight=args.shadow_max_inflight,
            reserved_long=reserved,
            max_tokens=args.shadow_max_tokens,
            topk=args.shadow_topk,
        )
    if args.max_canary_prompt_tokens is not None and args.max_canary_prompt_tokens < 0:
        raise fail("--max-canary-prompt-tokens must be >= 0")
    if args.heartbeat_s <= 0 or args.watch_timeout_s <= 0:
        raise fail("--heartbeat-s and --watch-timeout-s must be > 0")
    if args.sample_queue_size < 1:
        raise fail("--sample-queue-size must be at least 1")
    if args.max_body_bytes < MIN_BODY_BYTES:
        raise fail(f"--max-body-bytes must be at least {MIN_BODY_BYTES}, got {args.max_body_bytes}")
    if not 0 < args.watch_error_failsafe_s < float("inf"):
        raise fail(
            "--watch-error-failsafe-s must be a finite number of seconds > 0, "
            f"got {args.watch_error_failsafe_s}"
        )
    _deadlines_from_args(args, fail)
    return RouterSettings(
        router_id=args.router_id or f"router-{os.getpid()}",
        release=args.release,
        baseline_urls=baseline,
        canary_urls=_urls("--canary", args.canary),
        broker_url=args.broker.rstrip("/") if args.broker else None,
        gate_url=args.gate.rstrip("/") if args.gate else None,
        state_dir=args.state_dir,
        heartbeat_s=args.heartbeat_s,
        watch_timeout_s=args.watch_timeout_s,
        edges=edges,
        max_canary_prompt_tokens=args.max_canary_prompt_tokens,
        shadow=shadow,
        sample_queue_size=args.sample_queue_size,
        gate_flush_s=args.gate_flush_s,
        instance_port=args.instance_port,
        max_body_bytes=args.max_body_bytes,
        watch_error_failsafe_s=args.watch_error_failsafe_s,
        deadlines=StreamDeadlines(
            request_s=args.request_deadline_s,
            first_byte_s=args.upstream_first_byte_s,
            idle_s=args.upstream_idle_s,
            client_write_s=args.client_write_s,
            stall_evidence_s=args.stall_evidence_s,
        ),
        max_client_streams=args.max_client_streams,
        max_pool_streams=args.max_pool_streams,
        gate_deadman_s=args.gate_deadman_s,
    )


def check_token(settings: RouterSettings, token: str | None, gate_token: str | None) -> None:
    """A router that talks to the broker needs its heartbeat credential (``token``), one
    that talks to the gate its samples credential (``gate_token``); each is the admin
    token when its own flag is not given (single-credential mode)."""
    missing = [
        (flag, cred, what)
        for flag, url, tok, cred, what in (
            ("--gate", settings.gate_url, gate_token, "--gate-token-file", "sample batches"),
            ("--broker", settings.broker_url, token, "--broker-token-file", "heartbeats"),
        )
        if url and tok is None
    ]
    if missing:
        flags = " and ".join(m[0] for m in missing)
        creds = " and ".join(m[1] for m in missing)
        what = " and ".join(m[2] for m in missing)
        raise _usage_error(
            f"{flags} given but no credential for it: its {what} would be refused (401) and "
            f"the gate would see nothing. Start it with {creds} FILE (the stack's "
            f"credentials/ folder), or in single-credential mode --admin-token-file FILE "
            f"or {ENV_VAR} set."
        )


def check_watch_timeout(settings: RouterSettings) -> None:
    """Refuse a --watch-timeout-s the broker would refuse (its /health max_watch_s)."""
    if not settings.broker_url:
        return
    log = logs.get_logger("router")
    url = settings.broker_url + "/health"
    try:
        with urllib.request.urlopen(url, timeout=BROKER_HEALTH_TIMEOUT_S) as resp:
            health = strictjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            health = strictjson.loads(exc.read())  # a degraded broker answers 503 + body
        except ValueError:
            health = None
    except (OSError, ValueError) as exc:
        log.warning(
            "watch_timeout_check_skipped",
            broker=settings.broker_url,
            reason=f"broker /health unreadable: {type(exc).__name__}: {exc}",
        )
        return
    max_watch = health.get("max_watch_s") if isinstance(health, dict) else None
    if isinstance(max_watch, bool) or not isinstance(max_watch, int | float):
        log.warning(
            "watch_timeout_check_skipped",
            broker=settings.broker_url,
            reason="the broker's /health has no max_watch_s",
        )
        return
    if settings.watch_timeout_s > max_watch:
        raise _usage_error(
            f"--watch-timeout-s {settings.watch_timeout_s:g} is larger than the broker's "
            f"--max-watch-s {max_watch:g} ({url}): every watch would be refused and no trip "
            f"applied. Start the router with --watch-timeout-s {max_watch:g} or less."
        )


async def _serve(
    args: argparse.Namespace,
    settings: RouterSettings,
    token: str | None,
    broker_token: str | None,
    gate_token: str | None,
) -> None:
    log = logs.get_logger("router")
    async with default_upstream_session() as upstream, default_control_session() as control:
        app = build_app(
            settings,
            token,
            max_fault_ttl_s=args.max_fault_ttl_s,
            broker_token=broker_token,
            broker_token_file=args.broker_token_file,
            gate_token=gate_token,
            upstream=upstream,
            control=control,
        )
        await _run(app, args, settings, log)


async def _run(
    app: web.Application, args: argparse.Namespace, settings: RouterSettings, log: logs.JsonLogger
) -> None:
    """Listen on the public ``--port`` (shared by replicas with ``--reuse-port``) and, with
    ``--instance-port``, on a second port unique to this replica, so a harness can reach
    this replica's ``/admin/faults``, ``/health`` and ``/metrics``. The ready file holds
    ``{"port", "pid", "instance_port"}`` once both listen."""
    runner = deadline_runner(app, args)  # header, idle and body read deadlines
    await runner.setup()
    public = web.TCPSite(
        runner, args.host, args.port, reuse_port=args.reuse_port or None, backlog=1024
    )
    await public.start()
    port = bound_port(public, args.port)
    instance_port: int | None = None
    if args.instance_port is not None:
        inst = web.TCPSite(runner, args.host, args.instance_port, backlog=128)
        await inst.start()
        instance_port = bound_port(inst, args.instance_port)
        settings.instance_port = instance_port
    write_ready_file(args.ready_file, port, instance_port=instance_port)
    log.info(
        "listening",
        host=args.host,
        port=port,
        instance_port=instance_port,
        pid=os.getpid(),
        router_id=settings.router_id,
    )
    await until_stopped()
    log.info("stopping", pid=os.getpid())
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    """Misconfiguration fails loud, before the router listens: ``--gate`` or ``--broker``
    without a credential (its samples and heartbeats would be refused and the gate blind,
    ``check_token``), and a ``--watch-timeout-s`` above the broker's ``--max-watch-s``
    (``check_watch_timeout``; a broker that does not answer at start skips that check)."""
    args = parse(build_parser(), argv)
    settings = settings_from_args(args)
    token = load_admin_token(args.admin_token_file)
    broker_token = token_or_admin("--broker-token-file", args.broker_token_file, token)
    gate_token = token_or_admin("--gate-token-file", args.gate_token_file, token)
    check_token(settings, broker_token, gate_token)
    check_watch_timeout(settings)
    install_uvloop()
    asyncio.run(_serve(args, settings, token, broker_token, gate_token))


if __name__ == "__main__":
    entry(main)
