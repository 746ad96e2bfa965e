"""A certification campaign: one experiment run N times (fresh stack, new load seed each)
with ``gameday run --repeat N --certify``, its campaign cell written to
``bench/results/certify_campaign.json`` for the docs to quote.

Must never compute a figure of its own: every number is the campaign report's
(``summary.json``'s ``campaign`` section, ``gameday.report.campaign``).

    .venv/bin/python bench/certify_campaign.py                       # router/faulty-kernel, 59 runs
    .venv/bin/python bench/certify_campaign.py --from-run reports/<run-id>   # an existing campaign
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import _results

from canary_contract.json import JsonObject

NAME = "certify_campaign"
ROOT = _results.ROOT


def run_campaign(experiment: str, repeat: int, out: Path) -> Path:
    """Run the campaign with the gameday CLI; returns its run folder."""
    run_id = f"certify-{Path(experiment).stem}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    cmd = [
        str(ROOT / ".venv" / "bin" / "gameday"),
        "run",
        experiment,
        "--repeat",
        str(repeat),
        "--certify",
        "--out",
        str(out),
        "--run-id",
        run_id,
    ]
    # Exit 1 (a run failed) or 3 (inconclusive) still leaves the campaign's report.
    subprocess.run(cmd, cwd=ROOT, check=False, timeout=repeat * 300)
    return out / run_id


def campaign_figures(run_dir: Path) -> JsonObject:
    """The campaign cells of ``run_dir``'s summary.json, as the report wrote them."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"{path}: not a readable summary.json ({exc}); run the campaign first"
        ) from exc
    campaign = summary.get("campaign")
    if not isinstance(campaign, dict) or not campaign.get("certify"):
        raise SystemExit(
            f"{path}: no certified campaign in it; run gameday run --repeat N --certify"
        )
    info = json.loads((run_dir / "run.json").read_text())
    elapsed = None
    if isinstance(info.get("started_at"), int | float) and isinstance(
        info.get("ended_at"), int | float
    ):
        elapsed = round(info["ended_at"] - info["started_at"], 1)
    cells = []
    for cell in campaign["cells"]:
        cell = {k: v for k, v in cell.items() if k not in ("run_names", "load_seeds")}
        cells.append(cell)
    return {
        "run_id": summary.get("run_id"),
        "verdict": summary.get("verdict"),
        "campaign_wall_s": elapsed,
        "percentile_method": campaign.get("percentile_method"),
        "interval_method": campaign.get("interval_method"),
        "cells": cells,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", default="experiments/router/faulty-kernel.yaml")
    p.add_argument("--repeat", type=int, default=59, help="runs (59: the least that certifies)")
    p.add_argument("--reports", type=Path, default=ROOT / "reports", help="where the run goes")
    p.add_argument("--from-run", type=Path, help="quote an existing campaign's run folder")
    p.add_argument("--out", type=Path, help=f"results file (default bench/results/{NAME}.json)")
    args = p.parse_args()
    if not 1 <= args.repeat <= 1000:
        raise SystemExit("--repeat must be from 1 to 1000")
    run = _results.Run(NAME)
    run_dir = args.from_run or run_campaign(args.experiment, args.repeat, args.reports)
    figures = campaign_figures(run_dir)
    if args.from_run:
        # The figures come from a campaign run before this command: say which, and the
        # commit its checkout is at (quote it before that checkout moves on).
        figures["from_run"] = str(args.from_run)
        figures["campaign_commit"] = _results._commit(args.from_run)
    run.write(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
