"""``python -m canarystack.gate --broker URL [--release NAME ...] [test parameters]``.

Every threshold of the sequential tests is a flag with its default in ``--help``; an
absurd tolerance (``--drift-kl-tolerance 50``) makes the drift test blind on purpose.

This module must never start serving with a parameter the tests cannot honour: bad
values end the process with a message naming the flag. Nor without its credentials: without
the trip credential (``--broker-token-file``) the gate could not write a trip, without the
samples credential (``--samples-token-file``) no router could send it a sample, so it
refuses to start (exit 2) rather than look healthy. Both fall back to the admin token
(single-credential mode); ``--admin-token-file`` itself is the gate's fault credential.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from canarystack.common.auth import ENV_VAR, describe_admin_flag, load_admin_token, token_or_admin
from canarystack.common.buckets import parse_edges
from canarystack.common.cli import base_parser, entry, parse, serve
from canarystack.gate.server import build_app
from canarystack.gate.state import (
    DEFAULT_BUDGET_SAMPLE_RATE_HZ,
    DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
    GateConfig,
)

_D = GateConfig()

# GateConfig field -> the flag that sets it (for error messages).
FLAG_OF = {
    "kl_tolerance": "--drift-kl-tolerance",
    "top1_tolerance": "--drift-top1-tolerance",
    "kl_clip": "--drift-kl-clip",
    "drift_threshold": "--drift-threshold",
    "drift_bet": "--drift-bet",
    "noise_window": "--noise-window",
    "noise_min_samples": "--noise-min-samples",
    "latency_ratio": "--latency-ratio",
    "latency_slack_s": "--latency-slack-ms",
    "latency_threshold": "--latency-threshold",
    "latency_bet": "--latency-bet",
    "latency_window_s": "--latency-window-s",
    "latency_min_reference": "--latency-min-reference",
    "latency_reference_n": "--latency-reference-n",
    "error_tolerance": "--error-tolerance",
    "errors_threshold": "--errors-threshold",
    "errors_bet": "--errors-bet",
    "error_window_s": "--error-window-s",
    "error_ucb_delta": "--error-ucb-delta",
    "no_data_timeout_s": "--no-data-timeout-s",
    "false_trips_per_release_hour": "--false-trips-per-release-hour",
    "budget_sample_rate_hz": "--budget-sample-rate-hz",
}


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(
        "gate",
        "The canary gate: sequential tests (e-CUSUM) on the routers' shadow comparisons "
        "and outcomes, per prompt-length bucket; trips the release in the broker.",
    )
    p.add_argument("--broker", required=True, help="broker URL, e.g. http://127.0.0.1:18100")
    p.add_argument(
        "--broker-token-file",
        default=None,
        help="file holding the trip credential the gate writes trips with (default: the "
        "admin token, single-credential mode)",
    )
    p.add_argument(
        "--samples-token-file",
        default=None,
        help="file holding the samples credential routers must send on POST /v1/samples "
        "(default: the admin token, single-credential mode)",
    )
    describe_admin_flag(p)
    p.add_argument(
        "--release",
        action="append",
        default=None,
        help="release to watch (repeat for several; default: default)",
    )
    p.add_argument(
        "--bucket-edges",
        default=",".join(str(e) for e in _D.edges),
        help="prompt-length bucket edges, the routers' (default %(default)s)",
    )
    p.add_argument(
        "--watch-timeout-s",
        type=float,
        default=30.0,
        help="long-poll timeout of the broker watch (default %(default)s)",
    )
    bud = p.add_argument_group(
        "false-alarm budget (sets the alarm level A of every test; see canarystack.gate.config)"
    )
    bud.add_argument(
        "--false-trips-per-release-hour",
        type=float,
        default=DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
        help="at most this many false trips per release-hour, across all tests, buckets and "
        "tails, for streams at their null mean (union bound: each of the K detectors gets "
        "budget/K, so A = K x rate x 3600 / budget). The default is what A = 1000 with the "
        "default 28 detectors at 15 samples/s implies (default %(default)s)",
    )
    bud.add_argument(
        "--budget-sample-rate-hz",
        type=float,
        default=DEFAULT_BUDGET_SAMPLE_RATE_HZ,
        help="samples per second the budget assumes each detector sees at most; /v1/gate "
        "shows the observed rate (default %(default)s)",
    )
    d = p.add_argument_group("drift test (KL and top-1 disagreement vs the noise floor)")
    d.add_argument(
        "--drift-kl-tolerance",
        type=float,
        default=_D.kl_tolerance,
        help="acceptable mean KL (nats) above the baseline-baseline noise floor "
        "(default %(default)s)",
    )
    d.add_argument(
        "--drift-top1-tolerance",
        type=float,
        default=_D.top1_tolerance,
        help="acceptable top-1 disagreement share above the noise floor (default %(default)s)",
    )
    d.add_argument(
        "--drift-kl-clip",
        type=float,
        default=_D.kl_clip,
        help="cap on one comparison's KL, so one outlier moves the test little "
        "(default %(default)s)",
    )
    d.add_argument(
        "--drift-threshold",
        type=float,
        default=None,
        help="alarm level A of the drift tests: average run length to a false alarm >= A "
        "comparisons (default: from --false-trips-per-release-hour)",
    )
    d.add_argument(
        "--drift-bet",
        type=float,
        default=_D.drift_bet,
        help="bet fraction f in (0,1) of the drift tests (default %(default)s)",
    )
    d.add_argument(
        "--no-tail-pooling",
        action="store_true",
        help="test drift per bucket only (default: also per tail of buckets, e.g. 2k+)",
    )
    d.add_argument(
        "--noise-window",
        type=int,
        default=_D.noise_window,
        help="baseline-baseline comparisons kept for the noise floor (default %(default)s)",
    )
    d.add_argument(
        "--noise-min-samples",
        type=int,
        default=_D.noise_min_samples,
        help="fewer baseline-baseline comparisons than this in a scope: use the pooled "
        "floor, then 0 (default %(default)s)",
    )
    lat = p.add_argument_group("latency test (canary vs baseline TTFT, same bucket)")
    lat.add_argument(
        "--latency-ratio",
        type=float,
        default=_D.latency_ratio,
        help="a canary TTFT above ratio x baseline (+ slack) counts as slow; the null is "
        "'median canary/baseline ratio <= this' (default %(default)s)",
    )
    lat.add_argument(
        "--latency-slack-ms",
        type=float,
        default=_D.latency_slack_s * 1000,
        help="absolute slack added to ratio x baseline (default %(default)s)",
    )
    lat.add_argument(
        "--latency-threshold",
        type=float,
        default=None,
        help="alarm level A of the latency test (default: from --false-trips-per-release-hour)",
    )
    lat.add_argument(
        "--latency-bet", type=float, default=_D.latency_bet, help="(default %(default)s)"
    )
    lat.add_argument(
        "--latency-window-s",
        type=float,
        default=_D.latency_window_s,
        help="baseline TTFTs older than this are not a reference (default %(default)s)",
    )
    lat.add_argument(
        "--latency-reference-n",
        type=int,
        default=_D.latency_reference_n,
        help="the most recent N baseline TTFTs (within the window) are the reference "
        "(default %(default)s)",
    )
    lat.add_argument(
        "--latency-min-reference",
        type=int,
        default=_D.latency_min_reference,
        help="fewer baseline TTFTs than this in the window: skip (default %(default)s)",
    )
    err = p.add_argument_group("errors test (canary vs baseline error rate, same bucket)")
    err.add_argument(
        "--error-tolerance",
        type=float,
        default=_D.error_tolerance,
        help="acceptable canary error rate above the baseline's upper bound (default %(default)s)",
    )
    err.add_argument(
        "--errors-threshold",
        type=float,
        default=None,
        help="alarm level A of the errors test (default: from --false-trips-per-release-hour)",
    )
    err.add_argument(
        "--errors-bet", type=float, default=_D.errors_bet, help="(default %(default)s)"
    )
    err.add_argument(
        "--error-window-s",
        type=float,
        default=_D.error_window_s,
        help="baseline outcomes of the last N seconds give its error rate (default %(default)s)",
    )
    err.add_argument(
        "--error-ucb-delta",
        type=float,
        default=_D.error_ucb_delta,
        help="the baseline rate's upper bound has level 1 - delta (default %(default)s)",
    )
    nd = p.add_argument_group("no data")
    nd.add_argument(
        "--no-data-timeout-s",
        type=float,
        default=_D.no_data_timeout_s,
        help="canary weight > 0 and no canary sample this long: state inconclusive "
        "(default %(default)s)",
    )
    nd.add_argument(
        "--trip-on-no-data",
        action="store_true",
        help="trip (test no_data) instead of only reporting inconclusive",
    )
    return p


def config_from_args(args: argparse.Namespace) -> GateConfig:
    """The gate's configuration; raises ValueError naming the bad flag."""
    try:
        edges = parse_edges(args.bucket_edges)
    except ValueError as exc:
        raise ValueError(f"--bucket-edges: {exc}") from None
    try:
        return GateConfig.from_budget(
            args.false_trips_per_release_hour,
            args.budget_sample_rate_hz,
            edges=edges,
            pool_tails=not args.no_tail_pooling,
            kl_tolerance=args.drift_kl_tolerance,
            top1_tolerance=args.drift_top1_tolerance,
            kl_clip=args.drift_kl_clip,
            drift_threshold=args.drift_threshold,
            drift_bet=args.drift_bet,
            noise_window=args.noise_window,
            noise_min_samples=args.noise_min_samples,
            latency_ratio=args.latency_ratio,
            latency_slack_s=args.latency_slack_ms / 1000.0,
            latency_threshold=args.latency_threshold,
            latency_bet=args.latency_bet,
            latency_window_s=args.latency_window_s,
            latency_min_reference=args.latency_min_reference,
            latency_reference_n=args.latency_reference_n,
            error_tolerance=args.error_tolerance,
            errors_threshold=args.errors_threshold,
            errors_bet=args.errors_bet,
            error_window_s=args.error_window_s,
            error_ucb_delta=args.error_ucb_delta,
            no_data_timeout_s=args.no_data_timeout_s,
            trip_on_no_data=args.trip_on_no_data,
        )
    except ValueError as exc:
        # GateConfig names its field; the user typed the flag.
        message = str(exc)
        field = message.split(" ", 1)[0]
        flag = FLAG_OF.get(field, field)
        raise ValueError(flag + message[len(field) :]) from None


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    releases = args.release or ["default"]
    admin_token = load_admin_token(args.admin_token_file)
    broker_token = token_or_admin("--broker-token-file", args.broker_token_file, admin_token)
    samples_token = token_or_admin("--samples-token-file", args.samples_token_file, admin_token)
    if broker_token is None:
        # Without it every trip write is refused: a gate that can never trip anything
        # must not start and look healthy.
        parser.error(
            "no trip credential: the gate writes its trips to the broker with it. Give "
            "--broker-token-file (the stack's credentials/trip), or in single-credential "
            f"mode {ENV_VAR} / --admin-token-file."
        )
    if samples_token is None:
        parser.error(
            "no samples credential: routers send their samples with it and the gate would "
            "refuse every batch. Give --samples-token-file (the stack's credentials/samples), "
            f"or in single-credential mode {ENV_VAR} / --admin-token-file."
        )
    app = build_app(
        config,
        args.broker,
        releases,
        admin_token=admin_token,
        broker_token=broker_token,
        samples_token=samples_token,
        max_fault_ttl_s=args.max_fault_ttl_s,
        watch_timeout_s=args.watch_timeout_s,
    )
    serve(app, args, "gate")


if __name__ == "__main__":
    entry(main)
