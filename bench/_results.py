"""How every benchmark writes what it measured: ``bench/results/<name>.json``.

One file per benchmark, rewritten by each run, holding the figures *and* what they came
from: the exact command, the machine (CPU, cores, Python, the 1-minute load average at the
start and at the end — other work on the machine only makes figures worse, and the load
says how much there was), the git commit, the start time and the wall time, and the one
percentile definition all benchmarks use (``percentile`` below). The documentation quotes
figures from these files (``bench/quote.py``), never by hand.

Like ``_procs``, this module must never import the system under test (it imports the
harness's report statistics, which import no part of the stack).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from canary_contract.json import JsonObject
from gameday.report.campaign import percentile as campaign_percentile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

PERCENTILE = (
    "numpy 'linear' (Hyndman-Fan type 7: the (n-1)q-th order statistic, interpolated), "
    "the same definition the campaign report uses (gameday.report.campaign.percentile)"
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (q in [0, 1]) of ``values`` by numpy's default 'linear' rule; None
    when there are no values; NaN refused. THE percentile of every benchmark: the
    campaign report's own function (``gameday.report.campaign.percentile``), so a
    benchmark and a game-day campaign can never define it differently."""
    return campaign_percentile(values, q)


def machine() -> JsonObject:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _commit(where: Path = ROOT) -> str | None:
    """The short commit of the checkout ``where`` is in (None outside one)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


class Run:
    """One benchmark run: ``Run("router_overhead")`` at the start, ``.write(figures)`` at
    the end (to ``--out`` or ``bench/results/<name>.json``)."""

    def __init__(self, name: str, argv: Sequence[str] | None = None) -> None:
        self.name = name
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.t0 = time.monotonic()
        self.load_start = os.getloadavg()[0]
        self.commit = _commit()  # what ran: the checkout may move on during a long run

    def document(self, figures: JsonObject) -> JsonObject:
        at_end = _commit()
        moved = {"commit_at_end": at_end} if at_end != self.commit else {}
        return {
            "benchmark": self.name,
            "command": " ".join([".venv/bin/python", f"bench/{self.name}.py", *self.argv]),
            "commit": self.commit,
            **moved,
            "machine": machine(),
            "started": self.started,
            "wall_s": round(time.monotonic() - self.t0, 1),
            "load_1m": {"start": round(self.load_start, 2), "end": round(os.getloadavg()[0], 2)},
            "percentile": PERCENTILE,
            "results": figures,
        }

    def write(self, figures: JsonObject, out: Path | None = None) -> Path:
        path = out or RESULTS / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = self.document(figures)
        path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        print(f"wrote {path}", file=sys.stderr)
        return path
