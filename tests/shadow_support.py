"""A router that measures the noise floor: its baseline replicas are compared with each
other on every sampled request (``--shadow-noise-fraction 1``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.procs import Proc, Spawner
from tests.router_support import start_router


def noise_router(
    spawn: Spawner,
    state_dir: Path,
    baseline: list[str],
    *extra: str,
    rates: str = "0-512=1",
    canary: list[str] | None = None,
    **router_kw: Any,
) -> Proc:
    """``start_router`` over ``baseline`` (at least two replicas) with the shadow rates
    ``rates`` and every sample also baseline-vs-baseline; ``extra`` router flags after."""
    return start_router(
        spawn,
        state_dir,
        baseline,
        canary,
        "--shadow-rates",
        rates,
        "--shadow-noise-fraction",
        "1",
        *extra,
        **router_kw,
    )
