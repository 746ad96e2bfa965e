"""The settings of a short game day on a local stack, for the tests that run one, and
``gameday run`` started as a subprocess the way those tests start it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Collection, Mapping

from tests.run_support import REPO

SHORT_RUN = {
    "GAMEDAY_WARMUP_S": "6",
    # 10 users give the gate its noise floor later than a game day's 16: a longer wait.
    "GAMEDAY_NOISE_WAIT_S": "45",
    "GAMEDAY_LOAD_USERS": "10",
    "GAMEDAY_LOAD_STOP_TIMEOUT_S": "5",
    # The tests check the pipeline, not the figures (2 busy cores): a generous latency SLO.
    "GAMEDAY_SLO_TTFT_P99_S": "10",
}


def gameday_run_argv(*args: str) -> list[str]:
    """The command line of ``gameday run ARGS`` with this interpreter."""
    return [sys.executable, "-c", "from gameday.cli import main; main()", "run", *args]


def gameday_run(
    *args: str,
    env: Mapping[str, str],
    timeout_s: float = 240,
    unset: Collection[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``gameday run ARGS`` from the repository, to its end: this process's environment
    less the variables in ``unset``, with ``env`` over it and a wide terminal (COLUMNS=200,
    so that no sentence the tests look for is wrapped); its output captured as text."""
    base = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        gameday_run_argv(*args),
        cwd=REPO,
        env={**base, **env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
