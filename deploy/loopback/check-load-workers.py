"""Exit 0 when every experiment of a run folder that ran a load got records from each of
its Locust worker pods (result.json evidence.load_workers) through a master that ran as a
pod (load.json master_pod); say which did not otherwise.

    .venv/bin/python deploy/loopback/check-load-workers.py reports/latest [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    problems, seen = [], 0
    for path in sorted(args.run_dir.rglob("result.json")):
        doc = json.loads(path.read_text())
        if doc.get("verdict") == "not_applicable":
            continue
        seen += 1
        by_worker = (doc.get("evidence") or {}).get("load_workers") or {}
        counts = sorted(int(n) for n in by_worker.values())
        try:
            master = json.loads((path.parent / "load.json").read_text()).get("master_pod")
        except (OSError, ValueError):
            master = None
        print(f"{doc.get('experiment')}: records by worker {counts}, master pod {master}")
        if not master:
            problems.append(f"{doc.get('experiment')}: its Locust master did not run as a pod")
        if len(counts) < args.workers or min(counts, default=0) <= 0:
            problems.append(
                f"{doc.get('experiment')}: records from {len(counts)} worker(s) {counts}, "
                f"expected {args.workers} with records each"
            )
    if not seen:
        problems.append(f"no experiment result under {args.run_dir}")
    for p in problems:
        print(f"check-load-workers: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
