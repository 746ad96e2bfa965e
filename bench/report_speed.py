"""Benchmark: seconds to build a report from 1,000,000 request records (DESIGN.md §4: ≤ 20 s).

Writes a synthetic run folder that follows the contracts (``gameday.report.synthetic``: a
game day of ``--experiments`` experiments sharing ``--records`` load records, plus oracle
pairs, fault ledgers, broker timelines and journals), then times ``build_report`` on it
in a fresh process (so matplotlib and pandas imports count, as they do for
``gameday report``) and prints one JSON object: the seconds of each phase of the build,
the total, and the wall time of the whole command.

    .venv/bin/python bench/report_speed.py                       # 10 experiments, 1M records
    .venv/bin/python bench/report_speed.py --experiments 1       # one experiment, 1M records

Generating the data is not part of the figure. The folder is removed at the end unless
``--keep``. This script must never assert on timings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import Run  # noqa: E402

from gameday.report.synthetic import Scenario, game_day, write_run  # noqa: E402

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from gameday.report import build_report
summary = build_report(sys.argv[1])
elapsed_s = time.perf_counter() - t0
print(json.dumps({"import_s": elapsed_s - summary.timings_s["total"],
                  "timings_s": summary.timings_s, "verdict": summary.verdict}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="load records in total")
    parser.add_argument(
        "--experiments",
        type=int,
        default=10,
        choices=range(1, 11),
        metavar="1..10",
        help="experiments sharing the records",
    )
    parser.add_argument(
        "--oracle-share", type=float, default=0.05, help="oracle pairs per load record"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run folder")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    bench_run = Run("report_speed")

    scenarios: list[Scenario] = game_day()[: args.experiments]
    work = Path(tempfile.mkdtemp(prefix="report-speed-"))
    try:
        t = time.perf_counter()
        run = write_run(
            work / "run",
            scenarios,
            requests_per_experiment=args.records // len(scenarios),
            oracle_share=args.oracle_share,
        )
        generate_s = time.perf_counter() - t
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(run)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=args.timeout_s,
        )
        command_s = time.perf_counter() - t
        if proc.returncode != 0:
            sys.exit(f"build_report failed:\n{proc.stderr[-4000:]}")
        child = json.loads(proc.stdout.strip().splitlines()[-1])
        timings = child["timings_s"]
        figures = {
            "records": (args.records // len(scenarios)) * len(scenarios),
            "oracle_records": max(int(args.records // len(scenarios) * args.oracle_share), 1)
            * len(scenarios),
            "experiments": len(scenarios),
            "generate_s": round(generate_s, 2),
            "phases_s": {k: round(v, 3) for k, v in timings.items() if k != "total"},
            "build_report_s": round(timings["total"], 2),
            "imports_s": round(child["import_s"], 2),
            "command_wall_s": round(command_s, 2),
            "target_s": 20.0,
            "verdict": child["verdict"],
            "run_dir": str(run) if args.keep else None,
        }
        print(json.dumps(figures, indent=2))
        bench_run.write(figures)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
