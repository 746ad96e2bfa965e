"""The gate's configuration: every threshold (each one a CLI flag, ``__main__``) and the
false-alarm budget the thresholds come from or imply (``GateConfig.budget_json``).

This module must never do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypeAlias, TypedDict

from canarystack.common.buckets import DEFAULT_EDGES, bucket_labels
from canarystack.gate.release_weights import (
    DEFAULT_FOCUS_WEIGHT,
    ReleaseBudget,
    release_budget_json,
)
from canarystack.gate.sessions import DEFAULT_SESSION_WINDOW_S

SECONDS_PER_HOUR = 3600.0
# The gate's tests (``--test``): ``cusum``, the default, one restarting e-CUSUM per
# detector under a union-bound budget per release-hour; ``release-eprocess``, one
# anytime-valid test per release (``canarystack.gate.release_test``), selectable until its
# validation campaign (issue #26) has run on the nine healthy conditions.
CUSUM = "cusum"
RELEASE_EPROCESS = "release-eprocess"
GATE_TESTS = (CUSUM, RELEASE_EPROCESS)
# The sample rate the budget assumes for every detector: a game day's open loop sends
# 15 requests/s (bench/gate_detection.py), and no detector sees more than one sample per
# request (one comparison per shadow copy, one outcome per request).
DEFAULT_BUDGET_SAMPLE_RATE_HZ = 15.0


def detector_counts(edges: Sequence[int], pool_tails: bool) -> dict[str, int]:
    """How many detectors of each test a release runs (``ReleaseGate.detectors``)."""
    n = len(bucket_labels(edges))
    # Buckets, then the tails that pool more than one bucket, then "all" (tested only
    # when tails are pooled).
    drift_scopes = n + (max(0, n - 2) + 1 if pool_tails else 0)
    return {"drift_kl": drift_scopes, "drift_top1": drift_scopes, "latency": n, "errors": n}


def threshold_for_budget(
    false_trips_per_release_hour: float, detectors: int, rate_hz: float
) -> float:
    """The per-detector threshold A for a budget split evenly over ``detectors``:
    each detector may false-alarm ``budget / K`` times per release-hour, i.e. with
    probability at most ``rate_hz * 3600 / A`` per hour (Doob), so ``A = K r 3600 / budget``.
    Raises ValueError when that is not > 1 (the budget allows more false trips than samples)."""
    if not (math.isfinite(false_trips_per_release_hour) and false_trips_per_release_hour > 0):
        raise ValueError(
            "false_trips_per_release_hour must be > 0 and finite, got "
            f"{false_trips_per_release_hour!r}"
        )
    if not (math.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"budget_sample_rate_hz must be > 0 and finite, got {rate_hz!r}")
    if detectors < 1:
        raise ValueError(f"detectors must be >= 1, got {detectors}")
    a = detectors * rate_hz * SECONDS_PER_HOUR / false_trips_per_release_hour
    if not a > 1:
        raise ValueError(
            f"false_trips_per_release_hour {false_trips_per_release_hour:g} gives a "
            f"per-detector threshold of {a:g} (must be > 1): it allows more false trips than "
            f"{detectors} detectors see samples at {rate_hz:g}/s; choose a smaller budget."
        )
    return a


def implied_budget(thresholds: Iterable[tuple[int, float]], rate_hz: float) -> float:
    """False trips per release-hour the thresholds guarantee at most (union bound):
    ``sum over (count, A) of count * rate_hz * 3600 / A``."""
    return math.fsum(n * rate_hz * SECONDS_PER_HOUR / a for n, a in thresholds)


# Today's thresholds (A = 1000 for every test) with the default buckets and tails
# (K = 28 detectors) at 15 samples/s each: 28 * 15 * 3600 / 1000 = 1512 false trips per
# release-hour in the worst case (every stream exactly at its null mean). That bound says
# nothing about one release (it is > 1); the margin of a healthy canary comes from its
# streams sitting far below the null mean, which bench/gate_false_alarms.py measures. The
# default keeps today's thresholds (the game days' 5 s detection SLO was set with them);
# a budget of 1e-3 would need A ~ 1.5e9 and ~3x the samples to trip (log A grows 3.07x).
DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR = 1512.0


class CusumTestBudget(TypedDict):
    detectors: int
    threshold: float
    false_trips_per_release_hour: float


class CusumBudget(TypedDict):
    """The e-CUSUM's false-alarm budget (``GateConfig.cusum_budget``); the observed rate
    and whether it keeps within the assumed one once a gate adds them
    (``views.budget_json``)."""

    false_trips_per_release_hour: float
    requested_false_trips_per_release_hour: float | None
    merge: str
    detectors: int
    per_detector_threshold: float | None
    per_detector_false_trips_per_release_hour: float
    sample_rate_hz_assumed: float
    per_test: dict[str, CusumTestBudget]
    guarantee: str
    observed_max_sample_rate_hz: NotRequired[float | None]
    within_assumed_rate: NotRequired[bool | None]


# ``/v1/gate``'s ``false_alarm_budget``: the one of the configured test.
FalseAlarmBudget: TypeAlias = ReleaseBudget | CusumBudget


@dataclass(frozen=True)
class GateConfig:
    """Every threshold of the gate (each one is a CLI flag; see ``__main__``)."""

    edges: tuple[int, ...] = DEFAULT_EDGES
    pool_tails: bool = True
    # drift
    kl_tolerance: float = 0.02
    top1_tolerance: float = 0.3
    kl_clip: float = 1.0
    drift_threshold: float = 1000.0
    drift_bet: float = 0.8
    noise_window: int = 500
    noise_min_samples: int = 20
    # latency
    latency_ratio: float = 1.5
    latency_slack_s: float = 0.025
    latency_threshold: float = 1000.0
    latency_bet: float = 0.8
    latency_window_s: float = 10.0
    latency_reference_n: int = 20
    latency_min_reference: int = 5
    # errors
    error_tolerance: float = 0.05
    errors_threshold: float = 1000.0
    errors_bet: float = 0.8
    error_window_s: float = 10.0
    error_ucb_delta: float = 0.01
    # A shared error surge (a dependency both variants use fails): while the baseline's
    # error rate over the last error_surge_s is surely above its window's upper bound
    # (Clopper-Pearson, both at error_ucb_delta), the window lags behind the incident and
    # canary outcomes are not tested for errors (0: always tested).
    error_surge_s: float = 2.0
    # no data
    no_data_timeout_s: float = 30.0
    trip_on_no_data: bool = False
    # The gate-blind fail-safe (#27 finding 2): no canary sample for this long while the
    # baseline traffic seen meanwhile says the canary took its share -> trip, canary to 0 %.
    # Twice the no-data timeout: a short gap (a router restart, a slow batch) is only
    # inconclusive; a lasting one never leaves the canary unguarded.
    blind_failsafe_s: float = 60.0
    # false-alarm budget: the rate the budget assumes, and the budget the thresholds were
    # derived from (None when they were set one by one; ``budget_json`` then shows the
    # budget they imply)
    budget_sample_rate_hz: float = DEFAULT_BUDGET_SAMPLE_RATE_HZ
    false_trips_per_release_hour: float | None = None
    # the test, and the parameters of release-eprocess (unused by cusum): the per-release
    # false-trip level, the floors' confidence level and clips, the weight of the
    # long-prompt KL detector, an invalid canary answer's weight, the dependence rule
    test: str = CUSUM
    alpha: float = 1e-3
    floor_delta: float = 1e-4
    floor_kl_clip: float = 0.02
    floor_top1_clip: float = 0.25
    floor_min_samples: int = 100
    focus_weight: float = DEFAULT_FOCUS_WEIGHT
    invalid_weight: float = 3.0
    session_window_s: float = DEFAULT_SESSION_WINDOW_S

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("test", self.test in GATE_TESTS, "one of " + ", ".join(GATE_TESTS)),
            ("alpha", 0 < self.alpha < 1, "in (0, 1)"),
            ("floor_delta", 0 < self.floor_delta < 1, "in (0, 1)"),
            ("floor_kl_clip", 0 < self.floor_kl_clip < math.inf, "> 0 and finite"),
            ("floor_top1_clip", 0 < self.floor_top1_clip <= 1, "in (0, 1]"),
            ("floor_min_samples", self.floor_min_samples >= 1, ">= 1"),
            ("focus_weight", 0 < self.focus_weight < 1, "in (0, 1)"),
            ("invalid_weight", 1 <= self.invalid_weight < math.inf, ">= 1 and finite"),
            ("session_window_s", 0 <= self.session_window_s < math.inf, ">= 0 and finite"),
            ("kl_tolerance", self.kl_tolerance > 0, "> 0"),
            ("top1_tolerance", self.top1_tolerance > 0, "> 0"),
            ("kl_clip", self.kl_clip > 0, "> 0"),
            ("drift_threshold", self.drift_threshold > 1, "> 1"),
            ("latency_threshold", self.latency_threshold > 1, "> 1"),
            ("errors_threshold", self.errors_threshold > 1, "> 1"),
            ("drift_bet", 0 < self.drift_bet < 1, "in (0, 1)"),
            ("latency_bet", 0 < self.latency_bet < 1, "in (0, 1)"),
            ("errors_bet", 0 < self.errors_bet < 1, "in (0, 1)"),
            ("latency_ratio", self.latency_ratio > 0, "> 0"),
            ("latency_slack_s", self.latency_slack_s >= 0, ">= 0"),
            ("latency_window_s", self.latency_window_s > 0, "> 0"),
            ("latency_min_reference", self.latency_min_reference >= 1, ">= 1"),
            ("latency_reference_n", self.latency_reference_n >= 1, ">= 1"),
            ("error_tolerance", self.error_tolerance > 0, "> 0"),
            ("error_window_s", self.error_window_s > 0, "> 0"),
            ("error_ucb_delta", 0 < self.error_ucb_delta < 1, "in (0, 1)"),
            (
                "error_surge_s",
                0 <= self.error_surge_s < self.error_window_s,
                ">= 0 and shorter than error_window_s",
            ),
            ("noise_window", self.noise_window >= 1, ">= 1"),
            ("noise_min_samples", self.noise_min_samples >= 1, ">= 1"),
            ("no_data_timeout_s", self.no_data_timeout_s > 0, "> 0"),
            (
                "blind_failsafe_s",
                0 < self.blind_failsafe_s < math.inf,
                "a finite number of seconds > 0",
            ),
            (
                "budget_sample_rate_hz",
                math.isfinite(self.budget_sample_rate_hz) and self.budget_sample_rate_hz > 0,
                "> 0 and finite",
            ),
            (
                "false_trips_per_release_hour",
                self.false_trips_per_release_hour is None
                or (
                    math.isfinite(self.false_trips_per_release_hour)
                    and self.false_trips_per_release_hour > 0
                ),
                "> 0 and finite",
            ),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

    @property
    def labels(self) -> list[str]:
        return bucket_labels(self.edges)

    def to_json(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_budget(
        cls,
        false_trips_per_release_hour: float = DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
        budget_sample_rate_hz: float = DEFAULT_BUDGET_SAMPLE_RATE_HZ,
        **fields: Any,
    ) -> GateConfig:
        """A configuration whose drift, latency and errors thresholds come from the budget
        (each one given in ``fields`` overrides its share)."""
        edges = fields.get("edges", DEFAULT_EDGES)
        pool_tails = fields.get("pool_tails", True)
        k = sum(detector_counts(edges, pool_tails).values())
        a = threshold_for_budget(false_trips_per_release_hour, k, budget_sample_rate_hz)
        for name in ("drift_threshold", "latency_threshold", "errors_threshold"):
            if fields.get(name) is None:
                fields[name] = a
        return cls(
            budget_sample_rate_hz=budget_sample_rate_hz,
            false_trips_per_release_hour=false_trips_per_release_hour,
            **fields,
        )

    def threshold_of(self, test: str) -> float:
        return {
            "drift_kl": self.drift_threshold,
            "drift_top1": self.drift_threshold,
            "latency": self.latency_threshold,
            "errors": self.errors_threshold,
        }[test]

    @property
    def release_test(self) -> bool:
        """The one-test-per-release mode (``--test release-eprocess``)."""
        return self.test == RELEASE_EPROCESS

    def budget_json(self) -> FalseAlarmBudget:
        """The false-alarm budget this configuration runs with (``release-eprocess``: the
        per-release guarantee, ``release_budget``; ``cusum``: ``cusum_budget``)."""
        return self.release_budget() if self.release_test else self.cusum_budget()

    def release_budget(self) -> ReleaseBudget:
        """The release test's per-release guarantee (``release_weights.release_budget_json``)."""
        return release_budget_json(
            edges=self.edges,
            pool_tails=self.pool_tails,
            alpha=self.alpha,
            floor_delta=self.floor_delta,
            focus_weight=self.focus_weight,
            floor_kl_clip=self.floor_kl_clip,
            floor_top1_clip=self.floor_top1_clip,
            floor_min_samples=self.floor_min_samples,
            invalid_weight=self.invalid_weight,
            session_window_s=self.session_window_s,
        )

    def cusum_budget(self) -> CusumBudget:
        """The e-CUSUM's false-alarm budget (``--test cusum``).

        Each e-CUSUM ``M_t`` is bounded by the Shiryaev-Roberts statistic
        ``R_t = (R_{t-1} + 1) e_t``, a nonnegative submartingale with ``E[R_n] <= n`` under
        the null, so Doob's maximal inequality gives ``P(false alarm within n samples) <=
        n / A`` for each detector. A release runs ``K`` detectors (drift KL and top-1 per
        bucket and tail, latency and errors per bucket); a union bound over them (no
        independence needed: the tails share samples) gives ``P(any false trip within H
        release-hours) <= sum_d r_d * 3600 * H / A_d``, where ``r_d`` is the rate of samples
        detector ``d`` sees. With one assumed rate ``r`` for every detector
        (``budget_sample_rate_hz``: an upper bound, so the sum is an upper bound too) and a
        budget of ``alpha`` false trips per release-hour split evenly (``alpha / K`` each),
        each detector's threshold is ``A = K * r * 3600 / alpha`` (``threshold_for_budget``).
        The bound is for streams *at* the null mean; healthy streams sit below it and trip
        far less often (``bench/gate_false_alarms.py`` measures how much).
        """
        counts = detector_counts(self.edges, self.pool_tails)
        r = self.budget_sample_rate_hz
        per_test: dict[str, CusumTestBudget] = {
            test: {
                "detectors": n,
                "threshold": self.threshold_of(test),
                "false_trips_per_release_hour": implied_budget([(n, self.threshold_of(test))], r),
            }
            for test, n in counts.items()
        }
        k = sum(counts.values())
        total = implied_budget(((n, self.threshold_of(t)) for t, n in counts.items()), r)
        thresholds = {self.threshold_of(t) for t in counts}
        return {
            "false_trips_per_release_hour": total,
            "requested_false_trips_per_release_hour": self.false_trips_per_release_hour,
            "merge": "union bound (budget / K per detector)",
            "detectors": k,
            "per_detector_threshold": thresholds.pop() if len(thresholds) == 1 else None,
            "per_detector_false_trips_per_release_hour": total / k,
            "sample_rate_hz_assumed": r,
            "per_test": per_test,
            "guarantee": "P(any false trip within H release-hours) <= "
            "false_trips_per_release_hour * H for streams at their null mean, while no "
            "detector sees more than sample_rate_hz_assumed samples/s (Doob's maximal "
            "inequality per detector, union bound over the K detectors)",
        }
