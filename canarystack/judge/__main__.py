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
from canarystack.common.cli import (
    Flag,
    add_flags,
    base_parser,
    entry,
    fields_from_args,
    parse,
    serve,
)
from canarystack.gate.__main__ import TEST_FLAGS, config_from_args
from canarystack.judge.server import build_app
from canarystack.judge.settings import (
    DEFAULT_SAMPLE_RATES,
    JudgeSettings,
    parse_rates,
    parse_release,
)

_D = JudgeSettings(edges=(512,), rates={}, releases=(parse_release("d=http://h,http://h"),))
# The judge's bounds: each flag sets the JudgeSettings field of its name.
JUDGE_FLAGS = (
    Flag("--noise-fraction", "noise_fraction", "judged requests that also get a second "
         "baseline answer, the noise floor (default %(default)s)", default=_D.noise_fraction),
    Flag("--max-per-s", "max_per_s", "comparisons started per second at most; more are "
         "dropped and counted (default %(default)s)", default=_D.max_per_s),
    Flag("--queue-size", "queue_size", "judged requests waiting at most; more are dropped "
         "and counted (default %(default)s)", type=int, default=_D.queue_size),
    Flag("--workers", "workers", "comparisons in flight at once (default %(default)s)",
         type=int, default=_D.workers),
    Flag("--queue-deadline-s", "queue_deadline_s", "a request that waited longer is "
         "dropped as stale (default %(default)s)", default=_D.queue_deadline_s),
    Flag("--side-timeout-s", "side_timeout_s", "deadline of each engine answer (default "
         "%(default)s)", default=_D.side_timeout_s),
    Flag("--max-tokens", "max_tokens", "tokens generated per side (default %(default)s)",
         type=int, default=_D.max_tokens),
    Flag("--topk", "topk", "top-k logprobs compared (default %(default)s)", type=int,
         default=_D.topk),
    Flag("--min-comparisons", "min_comparisons", "baseline-canary comparisons before a "
         "verdict can be pass (default %(default)s)", type=int, default=_D.min_comparisons),
    Flag("--max-body-bytes", "max_body_bytes", "largest mirrored body read; larger ones "
         "get 413 (default %(default)s)", type=int, default=_D.max_body_bytes),
    Flag("--scoring", "scoring", "auto: completions scored teacher-forced (every side "
         "scores the baseline's answer, echo with logprobs) while the engines support it, "
         "else free-running, said in the verdict; teacher-forced: no drift comparison "
         "without it; free: free-running comparisons only (default %(default)s)",
         type=str, default=_D.scoring),
)  # fmt: skip


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
    add_flags(j, JUDGE_FLAGS)
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
            **fields_from_args(args, JUDGE_FLAGS),
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
