"""``python -m gameday.faultproxy`` / ``gameday fault-proxy``: run the fault proxy in
front of an OpenAI-compatible engine.

    python -m gameday.faultproxy --upstream http://127.0.0.1:8000 \\
        --listen 127.0.0.1:9000 --token-file faults.token

This module must never start a proxy on a non-loopback address unless
``--allow-non-loopback`` is given, nor start one without a token.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import click
from yarl import URL

from gameday.faultproxy.registry import DEFAULT_MAX_FAULTS, DEFAULT_MAX_TTL_S

TOKEN_ENV = "GAMEDAY_FAULT_PROXY_TOKEN"  # also app.TOKEN_ENV (kept light: no aiohttp here)


@dataclass(frozen=True)
class Settings:
    upstream: str
    host: str
    port: int
    token: str
    max_faults: int
    max_ttl_s: float
    ready_file: Path | None


def check_upstream(upstream: str) -> str:
    try:
        url = URL(upstream)
    except ValueError as exc:
        raise click.BadParameter(
            f"{upstream!r} is not a URL ({exc}).", param_hint="--upstream"
        ) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise click.BadParameter(
            f"{upstream!r} is not an http(s) URL with a host: give the engine's base URL, "
            "e.g. http://127.0.0.1:8000 (the proxy adds each request's path to it).",
            param_hint="--upstream",
        )
    if url.query_string or url.fragment:
        raise click.BadParameter(
            f"{upstream!r} has a query or fragment: give the base URL only.",
            param_hint="--upstream",
        )
    return upstream.rstrip("/")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(listen: str, allow_non_loopback: bool) -> tuple[str, int]:
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise click.BadParameter(
            f"{listen!r} is not HOST:PORT: give e.g. 127.0.0.1:9000 (port 0 picks a free "
            "one; --ready-file then says which).",
            param_hint="--listen",
        )
    if not is_loopback(host) and not allow_non_loopback:
        raise click.BadParameter(
            f"{host!r} is not a loopback address: the fault proxy's admin API can break the "
            "engine behind it, so it listens on 127.0.0.1 / ::1 / localhost unless you add "
            "--allow-non-loopback (and keep its token secret).",
            param_hint="--listen",
        )
    return host, int(port_text)


def load_token(token_file: str | None, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise click.BadParameter(
                f"{token_file}: cannot read it ({exc.strerror}); give a readable file "
                f"holding the token, or set {TOKEN_ENV} instead.",
                param_hint="--token-file",
            ) from None
        where = f"--token-file {token_file}"
        if not token:
            raise click.BadParameter(
                f"{token_file} is empty: write the token into it.", param_hint="--token-file"
            )
    else:
        token = env.get(TOKEN_ENV, "").strip()
        where = TOKEN_ENV
        if not token:
            raise click.UsageError(
                "The fault proxy needs a token for its /admin/faults API: give --token-file "
                f"PATH (a file holding it) or set {TOKEN_ENV}."
            )
    if not all(" " <= ch <= "~" for ch in token):
        raise click.UsageError(
            f"{where}: the token holds characters that are not printable ASCII (a client "
            "could never send it in an HTTP header); use letters, digits and punctuation."
        )
    return token


def check_limits(max_faults: int, max_ttl_s: float) -> None:
    if max_faults < 1:
        raise click.BadParameter(
            f"{max_faults}: give at least 1 (default {DEFAULT_MAX_FAULTS}).",
            param_hint="--max-faults",
        )
    if not (math.isfinite(max_ttl_s) and max_ttl_s > 0):
        raise click.BadParameter(
            f"{max_ttl_s}: give a finite number of seconds > 0 (default "
            f"{DEFAULT_MAX_TTL_S:g}); an unbounded TTL would let a fault outlive a game day.",
            param_hint="--max-ttl-s",
        )


async def serve(settings: Settings) -> None:
    """Run the proxy until SIGTERM or SIGINT."""
    from aiohttp import web

    from gameday.faultproxy.app import create_app
    from gameday.faultproxy.logs import JsonLog

    log = JsonLog()
    app = create_app(
        settings.upstream,
        settings.token,
        max_faults=settings.max_faults,
        max_ttl_s=settings.max_ttl_s,
        log=log,
    )
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise click.ClickException(
            f"--listen {settings.host}:{settings.port}: cannot listen there ({exc.strerror}); "
            "pick a free port (or 0 for any, with --ready-file to learn it)."
        ) from None
    port = int(runner.addresses[0][1])
    if settings.ready_file is not None:
        tmp = settings.ready_file.with_name(settings.ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
        tmp.replace(settings.ready_file)
    log.info(
        "listening",
        host=settings.host,
        port=port,
        upstream=settings.upstream,
        max_faults=settings.max_faults,
        max_ttl_s=settings.max_ttl_s,
        pid=os.getpid(),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("stopping", pid=os.getpid())
        await runner.cleanup()


def run(settings: Settings) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))


@click.command("fault-proxy", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="base URL of the OpenAI-compatible engine behind the proxy",
)
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    help="where the proxy listens (loopback only unless --allow-non-loopback; port 0: any)",
)
@click.option(
    "--token-file",
    default=None,
    metavar="PATH",
    help=f"file holding the /admin/faults token (default: env {TOKEN_ENV})",
)
@click.option(
    "--max-faults",
    type=int,
    default=DEFAULT_MAX_FAULTS,
    show_default=True,
    help="most faults active at once (429 beyond)",
)
@click.option(
    "--max-ttl-s",
    type=float,
    default=DEFAULT_MAX_TTL_S,
    show_default=True,
    help="the longest ttl_s a fault may ask for",
)
@click.option(
    "--allow-non-loopback",
    is_flag=True,
    help="allow --listen on an address other than loopback",
)
@click.option(
    "--ready-file",
    default=None,
    metavar="PATH",
    help='write {"port": N, "pid": P} here once listening',
)
def fault_proxy_cmd(
    upstream: str,
    listen: str,
    token_file: str | None,
    max_faults: int,
    max_ttl_s: float,
    allow_non_loopback: bool,
    ready_file: str | None,
) -> None:
    """The LLM-aware fault proxy: in front of any OpenAI-compatible engine, with the stack's
    TTL'd /admin/faults API (kinds: latency, errors, hang, kernel; docs/fault-proxy.md).
    Every other path, /health and /metrics included, goes to the upstream untouched; the
    proxy's own are /admin/health and /admin/metrics."""
    check_limits(max_faults, max_ttl_s)
    host, port = check_listen(listen, allow_non_loopback)
    settings = Settings(
        upstream=check_upstream(upstream),
        host=host,
        port=port,
        token=load_token(token_file),
        max_faults=max_faults,
        max_ttl_s=max_ttl_s,
        ready_file=Path(ready_file) if ready_file else None,
    )
    run(settings)
