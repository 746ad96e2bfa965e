"""``python -m canarystack.rollback --broker URL [--release NAME ...]``.

This module must never start serving with a setting the executor cannot honour: bad
values end the process with a message naming the flag.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from canarystack.common import cli
from canarystack.common.auth import load_admin_token, token_or_admin
from canarystack.rollback.executor import ExecutorConfig
from canarystack.rollback.server import build_app

_D = ExecutorConfig()
# The broker's release names (canarystack.broker.server.NAME_PATTERN).
_RELEASE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


EXECUTOR_FLAGS = (
    cli.Flag(
        "--poll-ms",
        "poll_s",
        "how often step 2 reads the routers' applied revisions (default %(default)s)",
        default=_D.poll_s * 1000,
        scale=1000.0,
    ),
    cli.Flag(
        "--apply-timeout-s",
        "apply_timeout_s",
        "one attempt of step 2 waits this long for every router (default %(default)s)",
        default=_D.apply_timeout_s,
    ),
    cli.Flag(
        "--apply-retries",
        "apply_retries",
        "attempts of step 2 after the first; then the lagging routers are recorded "
        "and the rollback goes on (default %(default)s)",
        type=int,
        default=_D.apply_retries,
    ),
    cli.Flag(
        "--empty-routers-grace-s",
        "empty_routers_grace_s",
        "with no live router, wait this long for heartbeats before going on (default %(default)s)",
        default=_D.empty_routers_grace_s,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    p = cli.base_parser(
        "rollback",
        "The rollback executor: canary weight 0, wait for every router, quarantine, "
        "rolled_back — each step idempotent and resumable after a kill.",
    )
    cli.add_broker_client_flags(
        p,
        "file holding the rollback credential the executor writes its steps with "
        "(default: the admin token, single-credential mode)",
    )
    p.add_argument(
        "--operator-token-file",
        default=None,
        help="file holding the operator credential a manual POST /v1/rollbacks/{release} "
        "must carry (default: the admin token, single-credential mode)",
    )
    cli.add_release_flag(p, "handle")
    cli.add_flags(p, EXECUTOR_FLAGS)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = cli.parse(parser, argv)
    if args.poll_ms <= 0:
        parser.error(f"--poll-ms must be > 0, got {args.poll_ms}")
    if args.apply_timeout_s <= 0:
        parser.error(f"--apply-timeout-s must be > 0, got {args.apply_timeout_s}")
    if args.apply_retries < 0:
        parser.error(f"--apply-retries must be >= 0, got {args.apply_retries}")
    if args.empty_routers_grace_s < 0:
        parser.error(f"--empty-routers-grace-s must be >= 0, got {args.empty_routers_grace_s}")
    for value, name in (
        (args.poll_ms, "--poll-ms"),
        (args.apply_timeout_s, "--apply-timeout-s"),
        (args.empty_routers_grace_s, "--empty-routers-grace-s"),
    ):
        if value != value or value in (float("inf"), float("-inf")):
            parser.error(f"{name} must be a finite number, got {value}")
    for release in args.release or []:
        if not _RELEASE_RE.fullmatch(release):
            parser.error(
                f"--release {release!r} is not a release name the broker accepts: use "
                "letters, digits, '.', '_' or '-', starting with a letter or digit, at most "
                "128 characters (the broker would refuse every request for it)"
            )
    config = ExecutorConfig(**cli.fields_from_args(args, EXECUTOR_FLAGS))
    admin_token = load_admin_token(args.admin_token_file)
    app = build_app(
        args.broker,
        args.release or ["default"],
        config,
        admin_token=admin_token,
        max_fault_ttl_s=args.max_fault_ttl_s,
        broker_token=token_or_admin("--broker-token-file", args.broker_token_file, admin_token),
        operator_token=token_or_admin(
            "--operator-token-file", args.operator_token_file, admin_token
        ),
    )
    cli.serve(app, args, "rollback")


if __name__ == "__main__":
    cli.entry(main)
