"""Benchmark: how fast the stack takes a faulty-kernel canary off every router under
game-day traffic, and how often it trips on a healthy one under each condition the game
day puts it through (issue #14 item 7).

The stack (``detection.stack``): a broker, 2 baseline + 1 canary simulated model servers
with the calibrated batch noise, 2 routers on one port, the gate and the rollback executor,
each its own process, stopped by PID. The traffic (``detection.traffic``): the game day's
Locust load request for request: 16 closed-loop users, the synthetic prompt mix, streamed
completions at the server's default temperature (1.0), max_tokens capped at 48.

Before the first run the stack warms up until the gate reports its noise floor measured
(``GET /v1/gate/default``, at most ``--stack-warmup-s``), so no run tests a faulty kernel
against a floor of 0; each faulty run records the floor the gate had at the fault.

- ``--runs`` faulty-kernel runs (``detection.runs``): fault → trip decision, → weight 0 at
  every router, → ``rolled_back``; canary-served requests after the fault.
- ``--healthy-runs`` healthy runs PER CONDITION (``detection.conditions``: none, router /
  broker / rollback latency, router / broker / rollback SIGKILL, benign noise, small
  acceptable drift), interleaved; any trip is a false trip, bounded per condition
  (Clopper-Pearson, 95 %).
- ``--open-runs`` uncut faulty streams with the gate blind, replayed by the reference rules
  (``detection.rules``) and by our gate's own code offline.

Writes ``bench/results/gate_detection.json`` (``_results.Run``; ``--out`` elsewhere),
quoted into docs/benchmarks.md by ``bench/quote.py``. Loopback only; bounded by the run
counts, each run's time limits and ``--max-total-s``; it never asserts on timings.

    .venv/bin/python bench/gate_detection.py                      # 59 + 59 x 9 + 3 open
    .venv/bin/python bench/gate_detection.py --runs 1 --healthy-runs 1 --open-runs 0 \\
        --out /tmp/gate_detection-smoke.json                       # a smoke run
    .venv/bin/python bench/gate_detection.py --runs 0 --open-runs 0 --conditions \\
        router_kill,broker_kill --seed 2 --add-to bench/results/gate_detection.json
                                                # one part of the campaign, added
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _procs import ROOT
from _results import Run

sys.path.insert(0, str(ROOT))

from detection import summary
from detection.conditions import CONDITIONS
from detection.runs import Bench, wait_until
from detection.stack import Procs, start_stack
from detection.traffic import GAMEDAY_USERS, Traffic

from canary_contract.json import JsonObject

# The Azure LLM inference trace (conversation) beside the repository (../shared/traces).
TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
)

BLIND_GATE = (
    *("--drift-kl-tolerance", "1000", "--drift-top1-tolerance", "1000"),
    *("--latency-ratio", "1000", "--error-tolerance", "1"),
)


def log(kind: str, run: JsonObject) -> None:
    print(json.dumps({kind: run}), file=sys.stderr, flush=True)


async def main_async(args: argparse.Namespace) -> JsonObject:
    t_begin = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    procs = Procs(tmp)
    stop = asyncio.Event()
    stack = None
    try:
        async with aiohttp.ClientSession() as session:
            try:
                gate_args = ("--test", args.gate_test)
                stack = await start_stack(tmp, session, args.canary_weight, procs, gate_args)
                traffic = Traffic(
                    stack.router_url, users=args.users, seed=args.seed, **summary.lengths_of(args)
                )
                load_task = asyncio.create_task(traffic.run(stop))
                bench = Bench(args, stack, session, lambda: traffic.records)
                floor = await wait_until(bench.floor_measured, args.stack_warmup_s)
                log(
                    "stack_warmup",
                    {"s": round(time.monotonic() - t_begin, 1), "noise_floor": floor},
                )

                def time_left() -> bool:
                    return time.monotonic() - t_begin < args.max_total_s

                faulty: list[JsonObject] = []
                healthy: list[JsonObject] = []
                open_runs: list[JsonObject] = []
                for i in range(args.runs):
                    if time_left():
                        faulty.append(await bench.faulty_run(i))
                        log("faulty_run", faulty[-1])
                for i in range(args.healthy_runs):
                    for condition in args.conditions:
                        if time_left():
                            healthy.append(await bench.healthy_run(i, condition))
                            log("healthy_run", healthy[-1])
                if args.open_runs and time_left():
                    broker_url = procs.url("broker")
                    await procs.restart("gate", "--broker", broker_url, *gate_args, *BLIND_GATE)
                    for i in range(args.open_runs):
                        if time_left():
                            open_runs.append(await bench.open_run(i))
                            log("open_run", open_runs[-1])
                stop.set()
                await asyncio.wait_for(load_task, 90)
                if args.dump_streams:
                    with open(args.dump_streams, "w") as fh:
                        for t, b in stack.tap.batches:
                            fh.write(json.dumps({"arrival": t, "batch": b}) + "\n")
                elapsed = time.monotonic() - t_begin
                load = summary.load_of(traffic, args.canary_weight)
                return summary.report(args, faulty, healthy, open_runs, load, elapsed)
            finally:
                stop.set()
                if stack is not None:  # the tap before the session it forwards over
                    await stack.close()
    finally:
        procs.stop_all()


def conditions_arg(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONDITIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--conditions {text!r}: unknown {', '.join(unknown) or '(none given)'}; "
            f"pick from {','.join(CONDITIONS)}"
        )
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a = p.add_argument
    a("--runs", type=int, default=59, help="faulty-kernel runs (default %(default)s)")
    a(
        "--healthy-runs",
        type=int,
        default=59,
        help="healthy runs per condition (default %(default)s)",
    )
    a(
        "--conditions",
        type=conditions_arg,
        default=list(CONDITIONS),
        help=f"healthy conditions, comma-separated (default all: {','.join(CONDITIONS)})",
    )
    a("--healthy-s", type=float, default=20.0, help="a healthy run's condition lasts this long")
    a(
        "--warmup-s",
        type=float,
        default=8.0,
        help="traffic on a new canary before the fault/condition",
    )
    a(
        "--stack-warmup-s",
        type=float,
        default=60.0,
        help="at most this long for the gate's first noise floor",
    )
    a("--max-detect-s", type=float, default=30.0, help="a faulty run gives up after this")
    a(
        "--users",
        type=int,
        default=GAMEDAY_USERS,
        help="closed-loop users (the game day's %(default)s)",
    )
    a("--canary-weight", type=float, default=5.0, help="canary weight, percent")
    a(
        "--min-comparisons",
        type=int,
        default=30,
        help="a healthy run counts as evidence only with this many baseline-canary "
        "comparisons (the gate's own minimum, 30)",
    )
    a("--open-runs", type=int, default=3, help="uncut faulty streams (blind gate)")
    a("--open-warmup-s", type=float, default=35.0)
    a("--open-window-s", type=float, default=45.0)
    a("--flagger-interval-s", type=float, default=10.0)
    a("--flagger-threshold", type=int, default=3)
    a("--seed", type=int, default=1, help="seed of the prompt mix")
    a(
        "--output-lengths",
        choices=("gameday", "trace"),
        default="gameday",
        help="gameday: max_tokens from the mix capped at the game day's 48; trace: max_tokens "
        "drawn per request from --trace's GeneratedTokens (real answer lengths)",
    )
    a(
        "--trace",
        type=Path,
        default=TRACE,
        help="an Azure LLM inference trace CSV for --output-lengths trace (default %(default)s)",
    )
    a(
        "--gate-test",
        choices=("cusum", "release-eprocess"),
        default="cusum",
        help="the gate's --test (default %(default)s, the gate's own default)",
    )
    a("--max-total-s", type=float, default=8 * 3600.0, help="bound on the whole bench")
    a("--out", default=None, help="write the results here instead of bench/results/")
    a(
        "--add-to",
        default=None,
        metavar="RESULTS_JSON",
        help="run one part of a campaign: add this run's runs to that results file's (same "
        "settings; every figure recomputed from the pooled runs) and write it back there "
        "(or to --out)",
    )
    a("--dump-streams", default=None, help="write every recorded sample batch here (JSON lines)")
    args = p.parse_args(argv)
    if args.add_to:
        args.campaign = read_campaign(p, args)
    if min(args.runs, args.healthy_runs, args.open_runs) < 0:
        p.error("--runs, --healthy-runs and --open-runs must be >= 0")
    if args.users < 1 or not 0 <= args.canary_weight <= 100:
        p.error("--users must be >= 1 and --canary-weight from 0 to 100")
    if min(args.healthy_s, args.warmup_s, args.max_detect_s, args.max_total_s) <= 0:
        p.error("--healthy-s, --warmup-s, --max-detect-s and --max-total-s must be > 0")
    return args


def read_campaign(p: argparse.ArgumentParser, args: argparse.Namespace) -> JsonObject:
    """The results file --add-to names, refused before anything starts when it is not a
    gate_detection campaign or its settings differ from this part's."""
    path = Path(args.add_to)
    try:
        doc: JsonObject = json.loads(path.read_text())
        settings = summary.settings_of(doc["results"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        p.error(f"--add-to {path}: not a readable gate_detection results file ({exc})")
    if doc.get("benchmark") != "gate_detection":
        p.error(f"--add-to {path}: a {doc.get('benchmark')!r} results file, not gate_detection")
    differ = summary.settings_differ(settings, summary.settings_for(args))
    if differ:
        p.error(
            f"--add-to {path}: this part would run under other settings than that campaign "
            f"({'; '.join(differ)}); give the campaign's options"
        )
    return doc


def main() -> None:
    args = parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    run = Run("gate_detection")
    result = asyncio.run(main_async(args))
    if args.add_to:
        result = summary.merge(args.campaign, run.document(result), args)
    else:
        result["parts"] = [summary.part_of(run.document(result))]
    out = args.out or args.add_to
    run.write(result, Path(out) if out else None)


if __name__ == "__main__":
    main()
