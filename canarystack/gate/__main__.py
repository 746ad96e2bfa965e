"""``python -m canarystack.gate --broker URL [--release NAME ...] [test parameters]``.

This module must never start serving with a parameter the tests cannot honour (bad
values end the process with a message naming the flag), nor without its credentials.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from canarystack.common.auth import ENV_VAR, load_admin_token, token_or_admin
from canarystack.common.buckets import parse_edges
from canarystack.common.cli import (
    Flag,
    add_broker_client_flags,
    add_flags,
    add_release_flag,
    base_parser,
    entry,
    fields_from_args,
    parse,
    serve,
)
from canarystack.gate.config import GATE_TESTS
from canarystack.gate.server import build_app
from canarystack.gate.state import (
    DEFAULT_BUDGET_SAMPLE_RATE_HZ,
    DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
    GateConfig,
)

_D = GateConfig()


def _test_name(text: str) -> str:
    if text not in GATE_TESTS:
        raise argparse.ArgumentTypeError(
            f"unknown test {text!r}: choose one of {', '.join(GATE_TESTS)}"
        )
    return text


_RELEASE = (
    Flag(
        "--test",
        "test",
        "cusum: one restarting e-CUSUM per detector, thresholds from the budget per "
        "release-hour (the default, until the release test's validation campaign has run); "
        "release-eprocess: one anytime-valid test per release, P(any false trip during the "
        "release) <= alpha + floor delta (default %(default)s)",
        type=_test_name,
        default=_D.test,
    ),
    Flag(
        "--alpha",
        "alpha",
        "release-eprocess: the release trips when the weighted average of its detectors' "
        "e-processes reaches 1/alpha (default %(default)s)",
        default=_D.alpha,
    ),
    Flag(
        "--floor-delta",
        "floor_delta",
        "release-eprocess: the noise floors' confidence sequences all cover with "
        "probability >= 1 - delta, added to alpha (default %(default)s)",
        default=_D.floor_delta,
    ),
    Flag(
        "--floor-kl-clip",
        "floor_kl_clip",
        "release-eprocess: a baseline-baseline KL above this counts as this in the floor; "
        "also the floor while a scope has too few comparisons (default %(default)s)",
        default=_D.floor_kl_clip,
    ),
    Flag(
        "--floor-top1-clip",
        "floor_top1_clip",
        "release-eprocess: the same for the top-1 disagreement floor (default %(default)s)",
        default=_D.floor_top1_clip,
    ),
    Flag(
        "--floor-min-samples",
        "floor_min_samples",
        "release-eprocess: baseline-baseline comparisons a scope needs before its floor is "
        "frozen; fewer: the clip (default %(default)s)",
        type=int,
        default=_D.floor_min_samples,
    ),
    Flag(
        "--focus-weight",
        "focus_weight",
        "release-eprocess: weight of the long-prompt KL detector in the release's average; "
        "the rest is shared by the other detectors (default %(default)s)",
        default=_D.focus_weight,
    ),
    Flag(
        "--invalid-weight",
        "invalid_weight",
        "release-eprocess: an invalid canary answer counts as this x the KL null mean "
        "(default %(default)s)",
        default=_D.invalid_weight,
    ),
    Flag(
        "--session-window-s",
        "session_window_s",
        "release-eprocess: at most one comparison per session key (else trace id) every "
        "this many seconds enters the test (default %(default)s)",
        default=_D.session_window_s,
    ),
)

_BUDGET = (
    Flag(
        "--false-trips-per-release-hour",
        "false_trips_per_release_hour",
        "at most this many false trips per release-hour, across all tests, buckets and "
        "tails, for streams at their null mean (union bound: each of the K detectors gets "
        "budget/K, so A = K x rate x 3600 / budget). The default is what A = 1000 with the "
        "default 28 detectors at 15 samples/s implies (default %(default)s)",
        default=DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
    ),
    Flag(
        "--budget-sample-rate-hz",
        "budget_sample_rate_hz",
        "samples per second the budget assumes each detector sees at most; /v1/gate "
        "shows the observed rate (default %(default)s)",
        default=DEFAULT_BUDGET_SAMPLE_RATE_HZ,
    ),
)
_DRIFT = (
    Flag(
        "--drift-kl-tolerance",
        "kl_tolerance",
        "acceptable mean KL (nats) above the baseline-baseline noise floor (default %(default)s)",
        default=_D.kl_tolerance,
    ),
    Flag(
        "--drift-top1-tolerance",
        "top1_tolerance",
        "acceptable top-1 disagreement share above the noise floor (default %(default)s)",
        default=_D.top1_tolerance,
    ),
    Flag(
        "--drift-kl-clip",
        "kl_clip",
        "cap on one comparison's KL, so one outlier moves the test little (default %(default)s)",
        default=_D.kl_clip,
    ),
    Flag(
        "--drift-threshold",
        "drift_threshold",
        "alarm level A of the drift tests: average run length to a false alarm >= A "
        "comparisons (default: from --false-trips-per-release-hour)",
    ),
    Flag(
        "--drift-bet",
        "drift_bet",
        "bet fraction f in (0,1) of the drift tests (default %(default)s)",
        default=_D.drift_bet,
    ),
    Flag(
        "--no-tail-pooling",
        "pool_tails",
        "test drift per bucket only (default: also per tail of buckets, e.g. 2k+)",
        type=None,
        invert=True,
    ),
    Flag(
        "--noise-window",
        "noise_window",
        "baseline-baseline comparisons kept for the noise floor (default %(default)s)",
        type=int,
        default=_D.noise_window,
    ),
    Flag(
        "--noise-min-samples",
        "noise_min_samples",
        "fewer baseline-baseline comparisons than this in a scope: use the pooled "
        "floor, then 0 (default %(default)s)",
        type=int,
        default=_D.noise_min_samples,
    ),
)


def _alarm_flags(test: str) -> tuple[Flag, Flag]:
    """``--<test>-threshold`` and ``--<test>-bet`` of the latency and the errors test."""
    return (
        Flag(
            f"--{test}-threshold",
            f"{test}_threshold",
            f"alarm level A of the {test} test (default: from --false-trips-per-release-hour)",
        ),
        Flag(
            f"--{test}-bet",
            f"{test}_bet",
            "(default %(default)s)",
            default=getattr(_D, f"{test}_bet"),
        ),
    )


_LATENCY = (
    Flag(
        "--latency-ratio",
        "latency_ratio",
        "a canary TTFT above ratio x baseline (+ slack) counts as slow; the null is "
        "'median canary/baseline ratio <= this' (default %(default)s)",
        default=_D.latency_ratio,
    ),
    Flag(
        "--latency-slack-ms",
        "latency_slack_s",
        "absolute slack added to ratio x baseline (default %(default)s)",
        default=_D.latency_slack_s * 1000,
        scale=1000.0,
    ),
    *_alarm_flags("latency"),
    Flag(
        "--latency-window-s",
        "latency_window_s",
        "baseline TTFTs older than this are not a reference (default %(default)s)",
        default=_D.latency_window_s,
    ),
    Flag(
        "--latency-reference-n",
        "latency_reference_n",
        "the most recent N baseline TTFTs (within the window) are the reference "
        "(default %(default)s)",
        type=int,
        default=_D.latency_reference_n,
    ),
    Flag(
        "--latency-min-reference",
        "latency_min_reference",
        "fewer baseline TTFTs than this in the window: skip (default %(default)s)",
        type=int,
        default=_D.latency_min_reference,
    ),
)
_ERRORS = (
    Flag(
        "--error-tolerance",
        "error_tolerance",
        "acceptable canary error rate above the baseline's upper bound (default %(default)s)",
        default=_D.error_tolerance,
    ),
    *_alarm_flags("errors"),
    Flag(
        "--error-window-s",
        "error_window_s",
        "baseline outcomes of the last N seconds give its error rate (default %(default)s)",
        default=_D.error_window_s,
    ),
    Flag(
        "--error-ucb-delta",
        "error_ucb_delta",
        "the baseline rate's upper bound has level 1 - delta (default %(default)s)",
        default=_D.error_ucb_delta,
    ),
    Flag(
        "--error-surge-s",
        "error_surge_s",
        "canary outcomes are not tested for errors while the baseline's error rate over "
        "the last N seconds is surely above its window's bound: a shared incident the "
        "window has not caught up with (0: always tested; default %(default)s)",
        default=_D.error_surge_s,
    ),
)
_NO_DATA = (
    Flag(
        "--no-data-timeout-s",
        "no_data_timeout_s",
        "canary weight > 0 and no canary sample this long: state inconclusive "
        "(default %(default)s)",
        default=_D.no_data_timeout_s,
    ),
    Flag(
        "--trip-on-no-data",
        "trip_on_no_data",
        "trip (test no_data) instead of only reporting inconclusive",
        type=None,
    ),
    Flag(
        "--blind-failsafe-s",
        "blind_failsafe_s",
        "gate blind: no canary sample this long (and at least the no-data timeout) while the "
        "baseline traffic seen meanwhile should have brought 5 or more -> trip (test "
        "no_data, reason gate_blind), canary to 0%% (default %(default)s)",
        default=_D.blind_failsafe_s,
    ),
)
# The test parameters in --help order: each group's title, then its flags.
TEST_FLAGS = (
    (
        "false-alarm budget (sets the alarm level A of every test; see canarystack.gate.config)",
        _BUDGET,
    ),
    ("drift test (KL and top-1 disagreement vs the noise floor)", _DRIFT),
    ("latency test (canary vs baseline TTFT, same bucket)", _LATENCY),
    ("errors test (canary vs baseline error rate, same bucket)", _ERRORS),
    ("no data", _NO_DATA),
    (
        "the test (release-eprocess: one anytime-valid test per release; see "
        "canarystack.gate.release_test)",
        _RELEASE,
    ),
)
_ALL_FLAGS = tuple(flag for _, flags in TEST_FLAGS for flag in flags)
# GateConfig field -> the flag that sets it (for error messages).
FLAG_OF = {flag.field: flag.flag for flag in _ALL_FLAGS if flag.type is not None}


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(
        "gate",
        "The canary gate: sequential tests (e-CUSUM, or with --test release-eprocess one "
        "anytime-valid test per release) on the routers' shadow comparisons and outcomes, "
        "per prompt-length bucket; trips the release in the broker.",
    )
    add_broker_client_flags(
        p,
        "file holding the trip credential the gate writes trips with (default: the "
        "admin token, single-credential mode)",
    )
    p.add_argument(
        "--samples-token-file",
        default=None,
        help="file holding the samples credential routers must send on POST /v1/samples "
        "(default: the admin token, single-credential mode)",
    )
    add_release_flag(p, "watch")
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
    for title, flags in TEST_FLAGS:
        add_flags(p.add_argument_group(title), flags)
    return p


def config_from_args(args: argparse.Namespace) -> GateConfig:
    """The gate's configuration; raises ValueError naming the bad flag."""
    try:
        edges = parse_edges(args.bucket_edges)
    except ValueError as exc:
        raise ValueError(f"--bucket-edges: {exc}") from None
    try:
        return GateConfig.from_budget(edges=edges, **fields_from_args(args, _ALL_FLAGS))
    except ValueError as exc:
        # GateConfig names its field; the user typed the flag.
        message = str(exc)
        field = message.split(" ", 1)[0]
        flag = FLAG_OF.get(field, field)
        raise ValueError(flag + message[len(field) :]) from None


def main(argv: Sequence[str] | None = None) -> None:
    """Every threshold of the sequential tests is a flag with its default in ``--help``
    (an absurd tolerance, ``--drift-kl-tolerance 50``, makes the drift test blind on
    purpose). Without the trip credential (``--broker-token-file``) the gate could not
    write a trip, without the samples credential (``--samples-token-file``) no router
    could send it a sample, so it refuses to start (exit 2) rather than look healthy. Both
    fall back to the admin token (single-credential mode); ``--admin-token-file`` itself
    is the gate's fault credential."""
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
