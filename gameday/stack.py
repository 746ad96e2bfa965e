"""``gameday stack ...``: the local reference stack, driven as a separate program.

The harness does not import ``canarystack``: it runs ``python -m canarystack.cluster`` as a
process (as it would run ``kubectl``) and reads what that writes (``stack.json``, JSON
status). ``stack_up``/``stack_status``/``stack_down`` are the same for code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import click

from canary_contract.stack import StackStatus
from gameday.errors import GamedayError

CLUSTER = [sys.executable, "-m", "canarystack.cluster"]


class StackCommandError(GamedayError, RuntimeError):
    pass


def _run(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    # Own session: a Ctrl-C on the terminal must not kill `up` half-way; the caller decides.
    return subprocess.run(
        [*CLUSTER, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        start_new_session=True,
    )


def stack_status(state_dir: Path) -> StackStatus | None:
    """The stack's status JSON, or None when no stack was ever started there."""
    if not (state_dir / "stack.json").exists():
        return None
    res = _run(["status", "--state-dir", str(state_dir), "--json"], timeout_s=30)
    if res.returncode not in (0, 3):
        raise StackCommandError(res.stderr.strip() or res.stdout.strip())
    return cast(StackStatus, dict(json.loads(res.stdout)))


def stack_up(state_dir: Path, extra: Sequence[str] = (), timeout_s: float = 900) -> StackStatus:
    """``gameday stack up`` (a bound of ``timeout_s``; the stack's own health wait, its
    config's ``health_timeout_s``, is what decides: 60 s, a vLLM stack's 420 s)."""
    res = _run(["up", "--state-dir", str(state_dir), "--json", *extra], timeout_s=timeout_s)
    if res.returncode != 0:
        raise StackCommandError(
            f"`gameday stack up` failed (exit {res.returncode}):\n"
            f"{(res.stderr or res.stdout).strip()}"
        )
    return cast(StackStatus, dict(json.loads(res.stdout)))


def stack_down(state_dir: Path, timeout_s: float = 60) -> None:
    res = _run(["down", "--state-dir", str(state_dir)], timeout_s=timeout_s)
    if res.returncode != 0:
        raise StackCommandError(res.stderr.strip() or res.stdout.strip())


@click.command(
    "stack",
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def stack_cmd(args: tuple[str, ...]) -> None:
    """The local stack: up | status | down | logs | timeline (see `gameday stack --help`)."""
    proc = subprocess.run([*CLUSTER, *args])
    sys.exit(proc.returncode)
