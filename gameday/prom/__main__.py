"""``python -m gameday.prom up|down|config``: a Prometheus for a target, from the shell."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gameday.prom import (
    PrometheusError,
    check_config,
    render_config,
    scrape_jobs,
    start_for_target,
    stop_in,
    wait_for_targets,
)
from gameday.targets import TargetError, load_target

DESCRIPTION = "A Prometheus (Debian's) scraping a target's components, stopped by its PID."


def main(argv: Sequence[str] | None = None) -> int:
    """The shell entry::

        python -m gameday.prom up --target targets/local.yaml --dir .prometheus [--port P]
            starts Debian's prometheus scraping every component of the target (1 s), waits
            until every target is up, prints {"url", "pid", "workdir"} as JSON; the PID is
            recorded in DIR/prometheus.json
        python -m gameday.prom down --dir .prometheus
            stops it by that PID (exit 0 also when none was running)
        python -m gameday.prom config --target FILE
            prints the scrape config it would run (checked by promtool)

    Exit 2 with one line on stderr saying what was wrong for a bad target, a missing
    binary, or a Prometheus that did not start.
    """
    p = argparse.ArgumentParser(prog="python -m gameday.prom", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a Prometheus scraping the target")
    up.add_argument("--target", default=None, help="target file (default: the local stack)")
    up.add_argument("--dir", type=Path, required=True, help="its config, TSDB, log and PID")
    up.add_argument("--port", type=int, default=None, help="127.0.0.1 port (default: free)")
    up.add_argument("--scrape-interval-s", type=float, default=1.0)
    up.add_argument("--wait-s", type=float, default=30.0, help="for every target to be up")
    down = sub.add_parser("down", help="stop the Prometheus recorded in --dir")
    down.add_argument("--dir", type=Path, required=True)
    cfg = sub.add_parser("config", help="print the scrape config for the target")
    cfg.add_argument("--target", default=None)
    args = p.parse_args(argv)
    try:
        if args.cmd == "down":
            stopped = stop_in(args.dir)
            print("stopped" if stopped else f"no Prometheus was running for {args.dir}")
            return 0
        target = load_target(args.target)
        if args.cmd == "config":
            text = render_config(scrape_jobs(target))
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "prometheus.yml"
                path.write_text(text)
                check_config(path)
            print(text, end="")
            return 0
        if args.port is not None and not 0 < args.port < 65536:
            raise PrometheusError(f"--port must be 1..65535, got {args.port}")
        proc = start_for_target(target, args.dir, args.scrape_interval_s, port=args.port)
        try:
            wait_for_targets(proc.url, timeout_s=args.wait_s)
        except PrometheusError:
            proc.stop()
            raise
        print(json.dumps({"url": proc.url, "pid": proc.pid, "workdir": str(proc.workdir)}))
        return 0
    except (PrometheusError, TargetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
