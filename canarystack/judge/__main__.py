"""``python -m canarystack.judge --release NAME=BASELINE_URL,CANARY_URL [...]``.

The gate's test flags (``python -m canarystack.gate --help``: ``--test``, tolerances,
thresholds, ``--bucket-edges``) mean the same here; the judge's own flags bound its work.

This module must never start serving with a parameter it cannot honour: a bad value ends
the process with a message naming the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from canarystack.common.auth import load_admin_token
from canarystack.common.buckets import parse_edges
from canarystack.common.cli import add_flags, base_parser, entry, parse, serve
from canarystack.gate.__main__ import TEST_FLAGS, config_from_args
from canarystack.judge.server import build_app
from canarystack.judge.settings import (
    DEFAULT_SAMPLE_RATES,
    JudgeSettings,
    parse_rates,
    parse_release,
)

_D = JudgeSettings(edges=(512,), rates={}, releases=(parse_release("d=http://h,http://h"),))


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(
        "judge",
        "The drift judge: mirrored requests in, the same prompt to baseline and canary with "
        "logprobs, the gate's statistics per release; verdicts for Argo Rollouts (web "
        "metric), Flagger (webhook) and Prometheus.",
    )
    p.add_argument(
        "--release",
        action="append",
        required=True,
        help="NAME=BASELINE_URL,CANARY_URL: a judged release and its engines' base URLs "
        "(repeat for several; a mirrored request names its release in x-judge-release, "
        "else it is the first's)",
    )
    p.add_argument(
        "--bucket-edges",
        default="512,1024,2048,4096",
        help="prompt-length bucket edges in tokens (default %(default)s)",
    )
    j = p.add_argument_group("the judge's sampling and bounds")
    j.add_argument(
        "--sample-rates",
        default=DEFAULT_SAMPLE_RATES,
        help="share of mirrored requests judged per bucket, BUCKET=RATE,... (default %(default)s)",
    )
    j.add_argument(
        "--noise-fraction",
        type=float,
        default=_D.noise_fraction,
        help="judged requests that also get a second baseline answer, the noise "
        "floor (default %(default)s)",
    )
    j.add_argument(
        "--max-per-s",
        type=float,
        default=_D.max_per_s,
        help="comparisons started per second at most; more are dropped and "
        "counted (default %(default)s)",
    )
    j.add_argument(
        "--queue-size",
        type=int,
        default=_D.queue_size,
        help="judged requests waiting at most; more are dropped and counted (default %(default)s)",
    )
    j.add_argument(
        "--workers",
        type=int,
        default=_D.workers,
        help="comparisons in flight at once (default %(default)s)",
    )
    j.add_argument(
        "--queue-deadline-s",
        type=float,
        default=_D.queue_deadline_s,
        help="a request that waited longer is dropped as stale (default %(default)s)",
    )
    j.add_argument(
        "--side-timeout-s",
        type=float,
        default=_D.side_timeout_s,
        help="deadline of each engine answer (default %(default)s)",
    )
    j.add_argument(
        "--max-tokens",
        type=int,
        default=_D.max_tokens,
        help="tokens generated per side (default %(default)s)",
    )
    j.add_argument(
        "--topk", type=int, default=_D.topk, help="top-k logprobs compared (default %(default)s)"
    )
    j.add_argument(
        "--min-comparisons",
        type=int,
        default=_D.min_comparisons,
        help="baseline-canary comparisons before a verdict can be pass (default %(default)s)",
    )
    j.add_argument(
        "--max-body-bytes",
        type=int,
        default=_D.max_body_bytes,
        help="largest mirrored body read; larger ones get 413 (default %(default)s)",
    )
    for title, flags in TEST_FLAGS:
        add_flags(p.add_argument_group(title), flags)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    try:
        config = config_from_args(args)
        edges = parse_edges(args.bucket_edges)
        settings = JudgeSettings(
            edges=edges,
            rates=parse_rates(args.sample_rates, edges),
            releases=tuple(parse_release(spec) for spec in args.release),
            noise_fraction=args.noise_fraction,
            max_per_s=args.max_per_s,
            queue_size=args.queue_size,
            workers=args.workers,
            queue_deadline_s=args.queue_deadline_s,
            side_timeout_s=args.side_timeout_s,
            max_tokens=args.max_tokens,
            topk=args.topk,
            min_comparisons=args.min_comparisons,
            max_body_bytes=args.max_body_bytes,
        )
    except ValueError as exc:
        parser.error(str(exc))
    app = build_app(
        config,
        settings,
        admin_token=load_admin_token(args.admin_token_file),
        max_fault_ttl_s=args.max_fault_ttl_s,
    )
    serve(app, args, "judge")


if __name__ == "__main__":
    entry(main)
