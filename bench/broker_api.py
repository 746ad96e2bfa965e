"""Benchmark: what a broker write costs, and how fast a watch hears about it.

Starts one ``python -m canarystack.broker`` on a fresh state folder (stopped by its PID at
the end) and prints one JSON object:

- ``patch_ms``: sequential compare-and-set PATCHes over HTTP (each one a SQLite
  transaction committed with ``synchronous=FULL`` before the 200), p50/p99;
- ``watch_wake_ms``: from sending a PATCH to a waiting long-poll's answer arriving, p50/p99;
- ``commit_ms``: the same PATCH transaction on the store alone, with FULL and with
  NORMAL, to show what the fsync costs on this disk.

    .venv/bin/python bench/broker_api.py --patches 1000 --watches 100

Bounded by the counts given; loopback only. This script must never assert on timings.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from _procs import ADMIN, ROOT, command, launch, stop, wait_port
from _results import Run, percentile

from canary_contract.json import JsonObject

sys.path.insert(0, str(ROOT))

from canarystack.broker import manifest_digest
from canarystack.broker.store import ReleasePatch, Store


def pct(values: list[float], q: float) -> float:
    """THE benchmark percentile (``_results.percentile``) of seconds, in ms."""
    v = percentile(values, q)
    return round((v or 0.0) * 1e3, 3)


def store_commits(folder: Path, synchronous: str, n: int) -> dict[str, float]:
    folder.mkdir(parents=True)
    store = Store.open(folder)
    store._conn.execute(f"PRAGMA synchronous={synchronous}")  # bench only: compare settings
    for v in ("v1", "v2"):
        store.register_version(v, manifest_digest(v), v, 0)
    store.create_release("r", "v1", "v2", 0, "bench", "", 0)
    took = []
    for i in range(n):
        started = time.perf_counter()
        store.patch_release("r", ReleasePatch(i + 1, canary_weight=i % 100 + 1), "b", "", 0)
        took.append(time.perf_counter() - started)
    store.close()
    return {"p50": pct(took, 0.5), "p99": pct(took, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--patches", type=int, default=1000)
    ap.add_argument("--watches", type=int, default=100)
    args = ap.parse_args()
    run = Run("broker_api")
    work = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    ready, log = work / "ready.json", work / "broker.log"
    broker_args = ["--state-dir", str(work / "state"), "--log-level", "warning"]
    proc = launch("canarystack.broker", broker_args, ready=ready, log=log)
    try:
        port = wait_port(proc, ready, log, "the broker")
        url = f"http://127.0.0.1:{port}"
        http = requests.Session()
        for v in ("v1", "v2"):
            body = {"version": v, "manifest": v, "digest": manifest_digest(v)}
            http.post(url + "/v1/versions", json=body, headers=ADMIN).raise_for_status()
        release = {"name": "r", "stable": "v1", "canary": "v2", "weights": {"canary": 0}}
        http.post(url + "/v1/releases", json=release, headers=ADMIN).raise_for_status()
        revision, weight = 1, 0

        def patch() -> None:
            nonlocal revision, weight
            weight = weight % 100 + 1  # always a change, never a no-op
            body = {"expected_revision": revision, "weights": {"canary": weight}}
            r = http.patch(url + "/v1/releases/r", json=body, headers=ADMIN)
            r.raise_for_status()
            revision = r.json()["revision"]

        patch_s = []
        for _ in range(args.patches):
            started = time.perf_counter()
            patch()
            patch_s.append(time.perf_counter() - started)

        wake_s = []
        for _ in range(args.watches):
            got: JsonObject = {}

            def watch(after: int = revision, out: JsonObject = got) -> None:
                params = {"after": after, "timeout_s": 10}
                requests.get(url + "/v1/releases/r", params=params, timeout=20)
                out["t"] = time.perf_counter()

            thread = threading.Thread(target=watch)
            thread.start()
            while http.get(url + "/health").json()["watchers"] < 1:
                time.sleep(0.002)
            started = time.perf_counter()
            patch()
            thread.join(timeout=20)
            wake_s.append(got["t"] - started)
    finally:
        stop(proc, grace_s=10)
    result = {
        "patches": args.patches,
        "watches": args.watches,
        "patch_ms": {"p50": pct(patch_s, 0.5), "p99": pct(patch_s, 0.99)},
        "watch_wake_ms": {"p50": pct(wake_s, 0.5), "p99": pct(wake_s, 0.99)},
        "commit_ms": {
            "full": store_commits(work / "full", "FULL", args.patches),
            "normal": store_commits(work / "normal", "NORMAL", args.patches),
        },
        "state_dir": str(work),
        "broker_command": " ".join(command("canarystack.broker", broker_args, ready=ready)),
    }
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    run.write(result)


if __name__ == "__main__":
    main()
