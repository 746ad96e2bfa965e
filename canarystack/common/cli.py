"""Command-line options every component shares, and serving an app.

This module must never accept a flag value a component cannot honour: argparse's
message names the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from aiohttp import web

from canarystack.common import logs
from canarystack.common.auth import describe_admin_flag
from canarystack.common.deadlines import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    deadline_runner,
)
from canarystack.common.errors import StartupError
from canarystack.common.faults import DEFAULT_MAX_TTL_S, check_max_ttl_s


def entry(main: Callable[[], object]) -> NoReturn:
    """Run a component's ``main`` as ``python -m`` does: a ``StartupError`` (a flag, file
    or folder it cannot use) is printed as its message alone on stderr and exits 1; what
    ``main`` returns is the exit status (None: 0)."""
    try:
        status = main()
    except StartupError as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)


def max_ttl_seconds(text: str) -> float:
    """argparse type of ``--max-fault-ttl-s``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds (e.g. {DEFAULT_MAX_TTL_S:g})"
        ) from None
    try:
        return check_max_ttl_s(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: it must be a finite number of seconds > 0 (default "
            f"{DEFAULT_MAX_TTL_S:g}); an infinite or zero cap would make a fault permanent "
            "or impossible"
        ) from None


def positive_seconds(text: str) -> float:
    """argparse type of a read deadline (``--header-timeout-s`` and friends): a finite
    number of seconds > 0 (no deadline at all is what let slow clients hold connections)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a finite number of seconds > 0; without a deadline a client "
            "that sends slowly holds its connection for good"
        )
    return value


def port_number(text: str) -> int:
    """argparse type of ``--port``: 0 (a free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value} is not a port number: give 0 (a free port) to 65535"
        )
    return value


def base_parser(component: str, description: str) -> argparse.ArgumentParser:
    """A parser with ``--host``, ``--port`` (0 picks a free port), ``--admin-token-file``,
    ``--max-fault-ttl-s`` (finite seconds > 0: ``inf`` would make a fault permanent),
    ``--log-level``, ``--reuse-port`` and ``--ready-file`` (written as ``{"port": P,
    "pid": N}`` once the socket listens, so a test or supervisor can start a component on
    port 0 and learn its port without races)."""
    p = argparse.ArgumentParser(prog=f"python -m canarystack.{component}", description=description)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=port_number, default=0, help="port to listen on (0 = a free port)"
    )
    p.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding the admin token (default: env CANARYSTACK_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--max-fault-ttl-s",
        type=max_ttl_seconds,
        default=DEFAULT_MAX_TTL_S,
        help="cap on any fault's ttl_s, finite seconds > 0 (default %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--reuse-port",
        action="store_true",
        help="set SO_REUSEPORT so several replicas can share one port",
    )
    p.add_argument("--ready-file", default=None, help="write {port, pid} here once listening")
    p.add_argument(
        "--header-timeout-s",
        type=positive_seconds,
        default=HEADER_TIMEOUT_S,
        help="a request's line and headers must arrive within this (default %(default)s)",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=positive_seconds,
        default=IDLE_TIMEOUT_S,
        help="close a kept-alive connection idle this long (default %(default)s)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=positive_seconds,
        default=BODY_TIMEOUT_S,
        help="a request body must arrive within this once read (default %(default)s; 408)",
    )
    return p


def add_broker_client_flags(p: argparse.ArgumentParser, token_help: str) -> None:
    """``--broker`` (required) and ``--broker-token-file`` (``token_help`` says which
    credential it holds) of a component that writes to the broker; ``--admin-token-file``'s
    help then says it is the fault credential."""
    p.add_argument("--broker", required=True, help="broker URL, e.g. http://127.0.0.1:18100")
    p.add_argument("--broker-token-file", default=None, help=token_help)
    describe_admin_flag(p)


def add_release_flag(p: argparse.ArgumentParser, verb: str) -> None:
    """``--release NAME``, repeatable, for a component that serves several releases."""
    p.add_argument(
        "--release",
        action="append",
        default=None,
        help=f"release to {verb} (repeat for several; default: default)",
    )


@dataclass(frozen=True)
class Flag:
    """One option that sets one field of a component's configuration: ``flag`` (its value
    in the flag's unit) gives ``field`` = value / ``scale`` (a ``--...-ms`` flag of a field
    in seconds has scale 1000). ``type`` None makes a switch (store_true); ``invert`` gives
    the field ``not`` the switch (``--no-tail-pooling`` sets ``pool_tails``)."""

    flag: str
    field: str
    help: str
    type: Callable[[str], Any] | None = float
    default: Any = None
    scale: float = 1.0
    invert: bool = False

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def add_to(self, group: argparse._ActionsContainer) -> None:
        if self.type is None:
            group.add_argument(self.flag, action="store_true", help=self.help)
        else:
            group.add_argument(self.flag, type=self.type, default=self.default, help=self.help)

    def value(self, args: argparse.Namespace) -> Any:
        given = getattr(args, self.dest)
        if self.invert:
            return not given
        return given / self.scale if self.scale != 1.0 and given is not None else given


def add_flags(group: argparse._ActionsContainer, flags: Sequence[Flag]) -> None:
    """Declare ``flags`` on ``group`` (a parser or an argument group), in order."""
    for flag in flags:
        flag.add_to(group)


def fields_from_args(args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, Any]:
    """``{field: value}`` of ``flags`` as parsed into ``args``."""
    return {flag.field: flag.value(args) for flag in flags}


def write_ready_file(path: str | None, port: int, **extra: Any) -> None:
    """``{"port", "pid", **extra}`` at ``path``, atomically (nothing when no path)."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps({"port": port, "pid": os.getpid(), **extra}))
    tmp.replace(target)


def bound_port(site: web.TCPSite, requested: int) -> int:
    """The port ``site`` listens on: the one the OS chose when ``requested`` was 0."""
    server = getattr(site, "_server", None)
    if server is not None and server.sockets:
        return int(server.sockets[0].getsockname()[1])
    return requested


async def until_stopped() -> None:
    """Return once the process gets SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(app: web.Application, args: argparse.Namespace, component: str) -> None:
    runner = deadline_runner(app, args)
    await runner.setup()
    site = web.TCPSite(
        runner, args.host, args.port, reuse_port=args.reuse_port or None, backlog=1024
    )
    await site.start()
    bound = bound_port(site, args.port)
    write_ready_file(args.ready_file, bound)
    logs.get_logger(component).info("listening", host=args.host, port=bound, pid=os.getpid())
    await until_stopped()
    logs.get_logger(component).info("stopping", pid=os.getpid())
    await runner.cleanup()


def serve(app: web.Application, args: argparse.Namespace, component: str) -> None:
    """Run ``app`` until SIGTERM/SIGINT (uvloop when available), with the read deadlines
    of ``args`` (``deadlines.deadline_runner``)."""
    install_uvloop()
    asyncio.run(_serve(app, args, component))


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    return args
