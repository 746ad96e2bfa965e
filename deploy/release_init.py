"""Create the release on the broker of a deployed stack, once: ``release-init`` in
deploy/k8s (a Job), the cluster's counterpart of what ``gameday stack up`` does locally.

    python deploy/release_init.py --broker http://broker:8000 --release default \\
        --stable v1 --canary v2 --canary-weight 5 --admin-token-file /run/token

It waits for the broker to answer (``--wait-s``), registers the stable and canary
versions (with the digest of their manifest, docs/ARCHITECTURE.md §2) and creates the
release. Idempotent: an existing release is left exactly as it is (a release that a game
day tripped and rolled back is not reset here — the experiments start their own fresh
canary), so re-running the Job is harmless. Exit codes: 0 done or already there, 1 the
broker refused (the message says what it answered), 2 bad arguments or no token.

It must never change an existing release, and never talks to anything but the broker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from canarystack.broker.bootstrap import ReleaseSetupError, ensure_release

ACTOR = "release-init"
HTTP_TIMEOUT_S = 5.0
RETRY_S = 1.0


class InitError(RuntimeError):
    """The broker did not answer in time; the message says what it answered last."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="release_init.py", description="Create the release on the broker (idempotent)."
    )
    p.add_argument("--broker", required=True, help="broker base URL, e.g. http://broker:8000")
    p.add_argument("--release", default="default", help="release name (default: default)")
    p.add_argument("--model-name", default="default", help="served model name (default)")
    p.add_argument("--stable", required=True, help="stable (baseline) version, e.g. v1")
    p.add_argument("--canary", required=True, help="canary version, e.g. v2")
    p.add_argument("--canary-weight", type=int, default=5, help="canary percent (default 5)")
    p.add_argument("--engine", default="sim", help="engine named in the manifests (sim)")
    p.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding the admin token (default: env CANARYSTACK_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--wait-s", type=float, default=120.0, help="how long to wait for the broker (120)"
    )
    return p


def manifest(model_name: str, version: str, engine: str) -> dict[str, Any]:
    return {"name": model_name, "version": version, "engine": engine, "args": []}


def _token(path: str | None) -> str:
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"--admin-token-file {path}: cannot read it ({exc.strerror})"
            ) from None
    else:
        token = os.environ.get("CANARYSTACK_ADMIN_TOKEN", "").strip()
    if not token:
        raise ValueError(
            "no admin token: pass --admin-token-file or set CANARYSTACK_ADMIN_TOKEN "
            "(from the stack's Secret)"
        )
    return token


def wait_for_broker(base: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    last = "no answer yet"
    while True:
        try:
            resp = requests.get(f"{base}/health", timeout=HTTP_TIMEOUT_S)
            if resp.status_code == 200:
                return
            last = f"HTTP {resp.status_code}"
        except requests.RequestException as exc:
            last = exc.__class__.__name__
        if time.monotonic() >= deadline:
            raise InitError(f"the broker at {base} did not answer /health in {wait_s:g} s ({last})")
        time.sleep(RETRY_S)


def init_release(
    base: str,
    token: str,
    release: str,
    stable: str,
    canary: str,
    weight: int,
    model_name: str = "default",
    engine: str = "sim",
) -> tuple[bool, dict[str, object]]:
    """(created, release): creates the release unless it exists."""
    return ensure_release(
        base,
        token,
        release=release,
        manifests={v: manifest(model_name, v, engine) for v in (stable, canary)},
        stable=stable,
        canary=canary,
        weight=weight,
        actor=ACTOR,
        reason="release created by deploy/k8s release-init",
        timeout_s=HTTP_TIMEOUT_S,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 <= args.canary_weight <= 100:
        print(f"release_init: --canary-weight must be 0..100, got {args.canary_weight}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        token = _token(args.admin_token_file)
    except ValueError as exc:
        print(f"release_init: {exc}", file=sys.stderr)
        return 2
    base = args.broker.rstrip("/")
    try:
        wait_for_broker(base, args.wait_s)
        created, release = init_release(
            base, token, args.release, args.stable, args.canary, args.canary_weight,
            args.model_name, args.engine,
        )  # fmt: skip
    except (InitError, ReleaseSetupError, requests.RequestException) as exc:
        print(f"release_init: {exc}", file=sys.stderr)
        return 1
    what = "created" if created else "already exists, left as it is"
    print(
        f"release_init: release {release['name']!r} {what}: phase {release.get('phase')}, "
        f"stable {release.get('stable')}, canary {release.get('canary')}, "
        f"weights {release.get('weights')}, revision {release.get('revision')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
