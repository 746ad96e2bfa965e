"""Benchmark: how long a router keeps its canary after the broker stops answering, and
whether it flaps when the broker comes back (#27, finding 6).

Starts a model server, a broker and a router with their default timings (fail-safe bound
10 s, long polls of at most half that), creates a release at 5 % canary, then per trial:
waits a random part of a long poll, SIGSTOPs the broker by its PID for ``--stop-s``,
polls the router's ``/health`` every 20 ms, SIGCONTs it, and watches ``--after-s`` more.
Prints one JSON object:

- ``failsafe_after_stop_s``: from SIGSTOP to the router at 0 % (``config.source`` is
  ``failsafe``), per trial and the max; at most the bound, since the broker's last answer
  came at or before the SIGSTOP;
- ``router_silent_s``: the router's own ``failing_s`` when it went fail-safe (time since
  the broker's last answer), per trial;
- ``back_after_cont_s``: from SIGCONT to the router back on the broker's config;
- ``failsafe_entries``: fail-safe entries seen per trial (1: no flapping).

    .venv/bin/python bench/broker_failsafe.py --trials 3 --stop-s 20

Loopback only; every process it starts is stopped by its PID. It never asserts on timings.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from _procs import create_release, start, stop, stop_and_watch, stop_figures, stop_trial_args
from _results import Run

POLL_S = 0.02


def _config(router_url: str) -> dict[str, Any]:
    return dict(requests.get(router_url + "/health", timeout=2).json()["config"])


def _failsafe_logs(log: Path) -> list[float]:
    out = []
    for line in log.read_text().splitlines():
        if '"config_failsafe"' in line:
            out.append(float(json.loads(line)["failing_s"]))
    return out


def trial(
    broker_pid: int, router_url: str, router_log: Path, stop_s: float, after_s: float
) -> dict[str, Any]:
    """One SIGSTOP/SIGCONT; the figures of it."""
    before = len(_failsafe_logs(router_log))
    time.sleep(random.uniform(0.0, 5.0))  # anywhere in a long poll
    figures = stop_and_watch(
        broker_pid, lambda: _config(router_url)["source"] == "failsafe", stop_s, after_s, POLL_S
    )
    return {**figures, "router_silent_s": _failsafe_logs(router_log)[before:]}


def main() -> None:
    args = stop_trial_args(__doc__.split("\n\n")[0], trials=3, after_s=15.0)
    run = Run("broker_failsafe")
    tmp = Path(tempfile.mkdtemp(prefix="bench-failsafe-"))
    procs = []
    try:
        model, model_url = start(tmp, "model", "canarystack.model", ["--version", "v1"])
        procs.append(model)
        broker, broker_url = start(
            tmp, "broker", "canarystack.broker", ["--state-dir", str(tmp / "broker")]
        )
        procs.append(broker)
        created = create_release(broker_url)
        router, router_url = start(
            tmp, "router", "canarystack.router",
            ["--router-id", "router-0", "--state-dir", str(tmp / "router"), "--baseline",
             model_url, "--canary", model_url, "--broker", broker_url, "--no-shadow"],
        )  # fmt: skip
        procs.append(router)
        router_log = tmp / "router.log"
        deadline = time.monotonic() + 20
        while _config(router_url).get("revision") != created["revision"]:
            if time.monotonic() > deadline:
                raise SystemExit("the router never applied the release")
            time.sleep(0.1)
        trials = [
            trial(broker.pid, router_url, router_log, args.stop_s, args.after_s)
            for _ in range(args.trials)
        ]
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {"failsafe_bound_s": 10.0, "stop_s": args.stop_s, **stop_figures(trials)}
    print(json.dumps(figures, indent=1))
    run.write(figures, args.out)


if __name__ == "__main__":
    main()
