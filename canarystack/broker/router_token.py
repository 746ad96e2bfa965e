"""``python -m canarystack.broker.router_token --credentials-dir DIR ROUTER_ID``: print the
heartbeat credential bound to one router (give it to that router's ``--broker-token-file``).

The broker accepts it for heartbeats as ``ROUTER_ID`` only; minting one needs the shared
``heartbeat`` token of ``DIR``, which then stays with the broker and the operator. This
module must never print the shared token itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from canarystack.broker.capabilities import HEARTBEAT, router_token
from canarystack.common.auth import TokenFileError, load_token_file


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m canarystack.broker.router_token", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--credentials-dir", required=True, help="the broker's --credentials-dir")
    p.add_argument("router_id", help="the router's --router-id")
    args = p.parse_args(argv)
    if not 0 < len(args.router_id) <= 200:
        p.error(f"router_id must be 1 to 200 characters, got {len(args.router_id)}")
    try:
        secret = load_token_file("--credentials-dir", str(Path(args.credentials_dir) / HEARTBEAT))
    except TokenFileError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(router_token(secret, args.router_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
