"""``python -m canarystack.broker --state-dir DIR [--credentials-dir DIR] [--router-expiry-s 3]
[--max-watch-s 60] [--rollback-overdue-s 60]``.

This module must never start serving when the state folder is unusable or already in use.
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from canarystack.broker import kube_identity
from canarystack.broker.capabilities import load_credentials_dir
from canarystack.broker.overdue import DEFAULT_ROLLBACK_OVERDUE_S
from canarystack.broker.server import build_app
from canarystack.broker.service import DEFAULT_MAX_ROUTERS
from canarystack.broker.store import StateDirError
from canarystack.common.auth import describe_admin_flag, load_admin_token
from canarystack.common.cli import base_parser, entry, parse, serve
from canarystack.common.logs import get_logger

LOCK_FILE = "broker.lock"


def build_parser() -> argparse.ArgumentParser:
    p = base_parser("broker", "The version broker: releases, weights, phases and events.")
    p.add_argument(
        "--state-dir",
        required=True,
        help="folder for broker.sqlite (created if missing)",
    )
    p.add_argument(
        "--router-expiry-s",
        type=float,
        default=3.0,
        help="a router missing heartbeats this long drops off GET /v1/routers (default 3)",
    )
    p.add_argument(
        "--max-watch-s",
        type=float,
        default=60.0,
        help="longest long-poll a client may ask for with timeout_s (default 60)",
    )
    p.add_argument(
        "--max-routers",
        type=int,
        default=DEFAULT_MAX_ROUTERS,
        help="router ids the shared heartbeat credential may have listed at once (live or "
        "recent); a new one beyond is refused with 429 (default %(default)s)",
    )
    p.add_argument(
        "--rollback-overdue-s",
        type=float,
        default=DEFAULT_ROLLBACK_OVERDUE_S,
        help="a release tripped or rolling back with no phase change this long makes "
        "/health degraded, naming it (the rollback executor is not moving it; default "
        "%(default)g)",
    )
    p.add_argument(
        "--require-router-credentials",
        action="store_true",
        help="take heartbeats only from router-bound credentials (python -m "
        "canarystack.broker.router_token), so no router can speak for another",
    )
    k = p.add_argument_group(
        "router identity on Kubernetes",
        "--router-identity kubernetes: each router pod heartbeats with its own projected "
        "service-account token (audience --router-audience), which the API server reviews "
        "(TokenReview; the broker's service account needs system:auth-delegator); the "
        "shared heartbeat credential is then refused for heartbeats, as with "
        "--require-router-credentials, and only live router pods can be listed",
    )
    k.add_argument("--router-identity", choices=("tokens", "kubernetes"), default="tokens")
    k.add_argument(
        "--kube-api",
        default=None,
        help="the API server's URL (default: the pod's KUBERNETES_SERVICE_HOST/PORT)",
    )
    k.add_argument("--kube-ca-file", default=str(kube_identity.SA_DIR / "ca.crt"))
    k.add_argument(
        "--kube-token-file",
        default=str(kube_identity.SA_DIR / "token"),
        help="the broker's own service-account token, read afresh for every review",
    )
    k.add_argument("--router-audience", default=kube_identity.DEFAULT_AUDIENCE)
    k.add_argument(
        "--router-service-account",
        default=kube_identity.DEFAULT_ROUTER_SERVICE_ACCOUNT,
        help="the routers' service account, NAME (in the broker's namespace) or "
        "NAMESPACE:NAME (default %(default)s)",
    )
    p.add_argument(
        "--credentials-dir",
        default=None,
        help="folder with one token file per capability: operator, trip, rollback, "
        "heartbeat (docs/ARCHITECTURE.md §8). Without it: single-credential mode, the admin "
        "token grants every write (least privilege off; for tests only)",
    )
    describe_admin_flag(p)
    return p


def router_identity(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> kube_identity.KubeRouterIdentity | None:
    """The Kubernetes router identity ``--router-identity kubernetes`` asks for, checked:
    an API server URL and a namespace for the routers' service account."""
    if args.router_identity != "kubernetes":
        return None
    api = args.kube_api or kube_identity.in_cluster_api()
    if not api or not api.startswith(("https://", "http://")):
        parser.error(
            "--router-identity kubernetes: no API server URL: give --kube-api "
            "https://HOST:PORT (outside a pod there is no KUBERNETES_SERVICE_HOST)"
        )
    namespace, _, name = args.router_service_account.rpartition(":")
    namespace = namespace or kube_identity.namespace_of() or ""
    if not namespace or not name:
        parser.error(
            f"--router-service-account {args.router_service_account!r}: give NAMESPACE:NAME "
            "(outside a pod the broker's own namespace is unknown)"
        )
    ca = Path(args.kube_ca_file)
    return kube_identity.KubeRouterIdentity(
        api_url=api,
        namespace=namespace,
        service_account=name,
        audience=args.router_audience,
        token_file=Path(args.kube_token_file),
        ca_file=ca if ca.exists() else None,
    )


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold an exclusive lock on ``DIR/broker.lock`` for the life of the process.

    The kernel drops the lock when the process dies, SIGKILL included, so a restarted
    broker never finds a stale lock.
    """
    path = state_dir / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - held open until the process exits
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise SystemExit(
            f"--state-dir {state_dir}: another broker (pid {holder}) is using this folder "
            f"(it holds {path}). Stop that broker first, or give another --state-dir."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def main(argv: Sequence[str] | None = None) -> None:
    """Check the flags, lock the state folder (two brokers on one database would each
    cache their own view of it) and serve until SIGTERM. ``--credentials-dir`` holds one
    token per capability (files ``operator``, ``trip``, ``rollback``, ``heartbeat``; a
    Kubernetes Secret mounts exactly like that) and ``--admin-token-file`` is then the
    broker's fault credential only; without it the broker runs in single-credential mode
    (the admin token grants every write) and says so in a warning."""
    parser = build_parser()
    args = parse(parser, argv)
    # Finite too: an infinite expiry keeps dead routers listed for ever, an infinite
    # --max-watch-s lets a client hold a long-poll for ever.
    if not 0 < args.router_expiry_s < math.inf:
        parser.error(
            f"--router-expiry-s must be a finite number of seconds > 0, got {args.router_expiry_s}"
        )
    if not 0 < args.max_watch_s < math.inf:
        parser.error(
            f"--max-watch-s must be a finite number of seconds > 0, got {args.max_watch_s}"
        )
    if not 0 < args.rollback_overdue_s < math.inf:
        parser.error(
            "--rollback-overdue-s must be a finite number of seconds > 0, got "
            f"{args.rollback_overdue_s}"
        )
    if args.max_routers < 1:
        parser.error(f"--max-routers must be at least 1, got {args.max_routers}")
    state_dir = Path(args.state_dir).resolve()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--state-dir {args.state_dir}: cannot create it ({exc.strerror})")
    if not os.access(state_dir, os.W_OK):
        parser.error(f"--state-dir {state_dir}: not writable; give a folder this user can write")
    lock = lock_state_dir(state_dir)
    token = load_admin_token(args.admin_token_file)
    credentials = None
    if args.credentials_dir:
        credentials = load_credentials_dir(args.credentials_dir, token)
    else:
        get_logger("broker").warning(
            "least_privilege_off",
            message="no --credentials-dir: single-credential mode, the admin token grants "
            "every broker write; give --credentials-dir for one credential per capability",
        )
    identity = router_identity(parser, args)
    app = build_app(
        state_dir,
        token,
        router_expiry_s=args.router_expiry_s,
        max_watch_s=args.max_watch_s,
        max_fault_ttl_s=args.max_fault_ttl_s,
        credentials=credentials,
        max_routers=args.max_routers,
        require_router_credentials=args.require_router_credentials or identity is not None,
        rollback_overdue_s=args.rollback_overdue_s,
        kube_identity=identity,
    )
    try:
        serve(app, args, "broker")
    except StateDirError as exc:
        # The store opens as the app starts, before it listens: say why and exit 1.
        raise SystemExit(str(exc)) from None
    finally:
        lock.close()


if __name__ == "__main__":
    entry(main)
