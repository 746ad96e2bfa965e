"""Benchmark: detection at real answer lengths, as a curve of time to trip against the
rate of comparisons the fault acts on (issue #26, "Done when" item 2).

Why a curve. The gate trips on evidence, and the evidence against this fault is the
baseline-canary comparisons of long prompts (the fault acts on prompts of 2048+ tokens,
already shadowed at rate 1). How many of those arrive per second is set by the traffic,
not by the gate: with the game day's 16 closed-loop users and answers as long as real ones
(``max_tokens`` drawn from the Azure conversation trace's ``GeneratedTokens``, median 129,
not the game day's cap of 48) each user sends fewer requests per second, so fewer long
prompts reach the gate. So time to trip is measured at several traffic levels (closed-loop
users), each level its own ``bench/gate_detection.py`` campaign of ``--runs`` faulty runs
(fault -> trip decision, from the injection), and reported against the affected
comparisons per second each level gave. A fit of p95 = a + b / rate over the levels says
at what rate p95 reaches 2 s.

    .venv/bin/python bench/gate_detection_curve.py                 # 16,32,48 users x 72
    .venv/bin/python bench/gate_detection_curve.py --levels 16 --runs 3 --out /tmp/c.json

Writes ``bench/results/gate_detection_curve.json`` (``_results.Run``; ``--out``
elsewhere). Each level starts its own stack (``detection.stack``), on loopback, stopped by
PID; bounded by ``--runs`` and ``--max-total-s`` per level. It never asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gate_detection
from _results import Run
from detection.summary import times

from canary_contract.json import JsonObject

TARGET_P95_S = 2.0


def level_args(args: argparse.Namespace, users: int) -> argparse.Namespace:
    return gate_detection.parse_args(
        [
            *("--users", str(users), "--runs", str(args.runs)),
            *("--healthy-runs", "0", "--open-runs", "0"),
            *("--output-lengths", args.output_lengths, "--trace", str(args.trace)),
            *("--gate-test", args.gate_test, "--seed", str(args.seed + users)),
            *("--max-total-s", str(args.max_total_s)),
        ]
    )


def level_of(users: int, result: JsonObject) -> JsonObject:
    """One traffic level: what the traffic gave and how fast the gate tripped."""
    faulty = result["faulty_runs"]
    runs = faulty["runs"]
    load = result["load"]
    return {
        "users": users,
        "requests": load["requests"],
        "non_200": load["non_200"],
        "requests_per_s": round(load["requests"] / max(result["elapsed_s"], 1e-9), 2),
        "runs": faulty["n"],
        "tripped": faulty["tripped"],
        "trip_tests": faulty["trip_tests"],
        "evidence_buckets": faulty["evidence_buckets"],
        "affected_comparisons_per_s": faulty["affected_comparisons_per_s_before_fault"],
        "affected_comparisons_to_trip": faulty["affected_comparisons_to_trip"],
        "fault_to_trip_decision_s": faulty["fault_to_trip_decision_s"],
        "fault_to_weight0_at_every_router_s": faulty["fault_to_weight0_at_every_router_s"],
        "canary_served_after_fault": faulty["canary_served_after_fault"],
        "per_run": [
            {
                k: r.get(k)
                for k in (
                    "detect_s",
                    "trip_test",
                    "affected_per_s_before_fault",
                    "affected_to_trip",
                    "canary_served_after_fault",
                )
            }
            for r in runs
        ],
        "load": load,
    }


def fit(levels: list[JsonObject]) -> JsonObject:
    """Least squares of p95 = a + b / rate over the levels (rate: the level's median
    affected comparisons per second), and the rate at which p95 = 2 s."""
    pts = [
        (
            float(lv["affected_comparisons_per_s"]["p50"]),
            float(lv["fault_to_trip_decision_s"]["p95"]),
        )
        for lv in levels
        if lv["fault_to_trip_decision_s"]["p95"] is not None
        and lv["affected_comparisons_per_s"]["p50"]
    ]
    if len(pts) < 2:
        return {"note": "fewer than two levels with trips: no fit"}
    xs = [1.0 / r for r, _ in pts]
    ys = [p for _, p in pts]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    reach = b / (TARGET_P95_S - a) if b > 0 and a < TARGET_P95_S else None
    return {
        "model": "p95_s = a + b / affected_comparisons_per_s",
        "a_s": round(a, 3),
        "b_comparisons": round(b, 3),
        "points": [{"affected_per_s": round(r, 3), "p95_s": p} for r, p in pts],
        "rate_for_p95_2s": None if reach is None else round(reach, 2),
        "note": "fitted over the levels measured; a rate outside them is an extrapolation",
    }


async def main_async(args: argparse.Namespace) -> JsonObject:
    levels: list[JsonObject] = []
    for users in args.levels:
        t0 = time.monotonic()
        result = await gate_detection.main_async(level_args(args, users))
        levels.append(level_of(users, result))
        print(
            f"level {users} users: {time.monotonic() - t0:.0f} s, "
            f"p95 {levels[-1]['fault_to_trip_decision_s']['p95']} s",
            file=sys.stderr,
            flush=True,
        )
    return {
        "bench": "gate_detection_curve",
        "fault": "kernel fp8-kv-scale, magnitude 1, prompts of 2048+ tokens (bench/detection)",
        "gate_test": args.gate_test,
        "output_lengths": args.output_lengths,
        "scoring": "early: a comparison is scored once both sides hold 8 positions",
        "levels": levels,
        "p95_fit": fit(levels),
        "all_detect_s": times(
            [float(r["detect_s"]) for lv in levels for r in lv["per_run"] if r["detect_s"]]
        ),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a = p.add_argument
    a(
        "--levels",
        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
        default=[16, 32, 48],
        help="closed-loop users per traffic level (default 16,32,48; 16 is the game day's)",
    )
    a("--runs", type=int, default=72, help="faulty runs per level (default %(default)s)")
    a("--output-lengths", choices=("gameday", "trace"), default="trace")
    a("--trace", type=Path, default=gate_detection.TRACE)
    a("--gate-test", choices=("cusum", "release-eprocess"), default="cusum")
    a("--seed", type=int, default=26)
    a("--max-total-s", type=float, default=3600.0, help="bound on each level")
    a("--out", default=None, help="write the results here instead of bench/results/")
    args = p.parse_args(argv)
    if not args.levels or min(args.levels) < 1 or args.runs < 1:
        p.error("--levels must list user counts >= 1 and --runs must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    run = Run("gate_detection_curve")
    result = asyncio.run(main_async(args))
    run.write(result, Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
