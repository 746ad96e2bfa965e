"""Benchmark: how long a router keeps its canary after the gate stops answering, and how
long it holds the canary off after the gate comes back (#27, finding 4).

Starts two model servers (baseline, canary), a broker, a gate and a router with their
default timings (the router's dead-man switch ``--gate-deadman-s`` 10 s, its recovery
hold 2 s), creates a release at 5 % canary and keeps a few requests a second flowing (so
the router has samples to push). Per trial: SIGSTOPs the gate by its PID for ``--stop-s``,
polls the router's ``/health`` every 20 ms, SIGCONTs it, and watches ``--after-s`` more.
Prints one JSON object:

- ``failsafe_after_stop_s``: from SIGSTOP to the router's ``gate_failsafe`` (canary 0 %,
  ``/health`` degraded), per trial and the max;
- ``back_after_cont_s``: from SIGCONT to the router's canary back (``gate_failsafe`` null);
- ``failsafe_entries``: fail-safe entries seen per trial (1: no flapping).

    .venv/bin/python bench/gate_deadman.py --trials 2 --stop-s 20

Loopback only; every process it starts is stopped by its PID. It never asserts on timings.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import requests
from _procs import create_release, start, stop, stop_and_watch, stop_figures, stop_trial_args
from _results import Run

POLL_S = 0.02
REQUESTS_PER_S = 5.0


def _fail_safe(router_url: str) -> bool:
    return requests.get(router_url + "/health", timeout=2).json().get("gate_failsafe") is not None


def _traffic(router_url: str, done: threading.Event) -> None:
    """A few completions a second, so the router always has samples for the gate."""
    body = {"model": "default", "prompt": "the gate must see this", "max_tokens": 4}
    while not done.wait(1.0 / REQUESTS_PER_S):
        try:
            requests.post(router_url + "/v1/completions", json=body, timeout=10)
        except requests.RequestException:
            pass


def main() -> None:
    args = stop_trial_args(__doc__.split("\n\n")[0], trials=2, after_s=8.0)
    run = Run("gate_deadman")
    tmp = Path(tempfile.mkdtemp(prefix="bench-deadman-"))
    procs, done = [], threading.Event()
    try:
        base, base_url = start(tmp, "baseline", "canarystack.model", ["--version", "v1"])
        canary, canary_url = start(tmp, "canary", "canarystack.model", ["--version", "v2"])
        broker, broker_url = start(
            tmp, "broker", "canarystack.broker", ["--state-dir", str(tmp / "broker")]
        )
        procs += [base, canary, broker]
        create_release(broker_url)
        gate, gate_url = start(tmp, "gate", "canarystack.gate", ["--broker", broker_url])
        procs.append(gate)
        router, router_url = start(
            tmp, "router", "canarystack.router",
            ["--router-id", "router-0", "--state-dir", str(tmp / "router"), "--baseline",
             base_url, "--canary", canary_url, "--broker", broker_url, "--gate", gate_url],
        )  # fmt: skip
        procs.append(router)
        pusher = threading.Thread(target=_traffic, args=(router_url, done), daemon=True)
        pusher.start()
        time.sleep(3.0)  # the first samples reach the gate
        trials = [
            stop_and_watch(gate.pid, lambda: _fail_safe(router_url), args.stop_s, args.after_s)
            for _ in range(args.trials)
        ]
    finally:
        done.set()
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {
        "deadman_s": 10.0,
        "recovery_hold_s": 2.0,
        "stop_s": args.stop_s,
        **stop_figures(trials),
    }
    print(json.dumps(figures, indent=1))
    run.write(figures, args.out)


if __name__ == "__main__":
    main()
