"""Per-release gate state: the detectors per bucket, the live noise floor, the no-data
rule, and the decision to trip.

Scopes. Drift is tested per bucket *and* per tail (every bucket at or above an edge:
``512+``, ``1k+``, ``2k+``, plus ``all``): a fault that grows with prompt length shows in
the tail that pools all the long buckets at twice the sample rate of either bucket, so
it trips sooner. A tail trip names, as ``bucket``, the member bucket with the strongest
evidence of its own (highest statistic, then highest run mean), and lists the pooled
buckets in ``detail``. Latency and errors compare variants *in the same bucket* only, as
TTFT and error rates depend on prompt length.

What each test observes (the method is ``canarystack.gate.stats``):

- drift/kl: a baseline-canary comparison's ``kl_mean`` (clipped at ``kl_clip``) against
  ``m0 = noise_kl + kl_tolerance``, where ``noise_kl`` is the mean + 2 SE of the last
  ``noise_window`` baseline-baseline ``kl_mean`` values in the scope (falling back to
  all buckets, then to 0 when fewer than ``noise_min_samples`` exist);
- drift/top1: ``1 - top1_agree`` against ``noise_top1 + top1_tolerance``;
- latency: 1 when the canary's TTFT exceeds ``latency_ratio`` x baseline + slack, else 0,
  against ``m0 = 1/2``; paired from a comparison (both TTFTs of one prompt) or, for a
  canary outcome, against the median of the last ``latency_reference_n`` baseline TTFTs
  of the same bucket within ``latency_window_s`` seconds (a slow router or broker slows
  both sides, and reaches that reference within a few baseline requests);
- errors: 1 for a canary outcome with an error, else 0, against ``m0`` = Clopper-Pearson
  upper bound (level ``1 - error_ucb_delta``) of the baseline's error rate in the same
  bucket over the last ``error_window_s`` seconds, + ``error_tolerance``.

A noise floor is *borrowed* when its scope has fewer than ``noise_min_samples`` of its
own: ``noise_json`` names the scope it came from (``borrowed_from``; ``"none"`` for no
floor at all) and ``noise_fallbacks`` counts the comparisons tested against a borrowed
floor (the ``canarystack_gate_noise_floor_fallbacks`` metric).

State: ``idle`` (no progressing release with a canary), ``watching``, ``inconclusive``
(canary weight > 0 but no canary sample for ``no_data_timeout_s``), ``tripped`` (this
gate decided, or the broker's phase keeps the canary off). A new canary version resets
every detector and counter, but *keeps the noise floor*: baseline-baseline noise is a
property of the stable version and its replicas, not of the canary, so a new canary is
tested against the floor measured so far. The floor is dropped only when the stable
version changes. Samples that name another canary version than the broker's are ignored.

False-alarm budget (``GateConfig.budget_json``). Each e-CUSUM ``M_t`` is bounded by the
Shiryaev-Roberts statistic ``R_t = (R_{t-1} + 1) e_t``, a nonnegative submartingale with
``E[R_n] <= n`` under the null, so Doob's maximal inequality gives
``P(false alarm within n samples) <= n / A`` for each detector. A release runs ``K``
detectors (drift KL and top-1 per bucket and tail, latency and errors per bucket); a union
bound over them (no independence needed: the tails share samples) gives
``P(any false trip within H release-hours) <= sum_d r_d * 3600 * H / A_d``, where ``r_d``
is the rate of samples detector ``d`` sees. With one assumed rate ``r`` for every
detector (``budget_sample_rate_hz``: an upper bound, so the sum is an upper bound too)
and a budget of ``alpha`` false trips per release-hour split evenly (``alpha / K`` each),
each detector's threshold is ``A = K * r * 3600 / alpha`` (``threshold_for_budget``).
The bound is for streams *at* the null mean; healthy streams sit below it and trip far
less often (``bench/gate_false_alarms.py`` measures how much).

This module must never do I/O or read a clock: callers pass ``now`` in, so tests drive
time. It never decides to trip a release the broker does not show as progressing.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from canarystack.common.buckets import DEFAULT_EDGES, bucket_labels
from canarystack.gate.stats import ECusum, MeanWindow, TimeWindow, binomial_upper, median

GateState = Literal["idle", "watching", "tripped", "inconclusive"]
STATES: tuple[GateState, ...] = ("idle", "watching", "tripped", "inconclusive")
# Phases in which the routers keep the canary off: the gate shows them as tripped.
CANARY_OFF_PHASES = frozenset({"tripped", "rolling_back", "rolled_back"})
ALL_SCOPE = "all"
SECONDS_PER_HOUR = 3600.0
# The sample rate the budget assumes for every detector: a game day's open loop sends
# 15 requests/s (bench/gate_detection.py), and no detector sees more than one sample per
# request (one comparison per shadow copy, one outcome per request).
DEFAULT_BUDGET_SAMPLE_RATE_HZ = 15.0


# ----------------------------------------------------------------------------- input
# Bounds of one sample: generous for any real router, small enough that no value can
# overflow a sum or push a window. Every float is finite (``allow_inf_nan=False``).
MAX_TIME = 1e11  # seconds since the epoch (year ~5138); sample times are wall clock
MAX_TTFT_S = 3600.0
MAX_PROMPT_TOKENS = 10_000_000
MAX_POSITIONS = 1_000_000
MAX_LABEL = 64
MAX_ID = 200
MAX_ERROR = 1000
# A sample's colour (``canarystack.common.colour``): the request id and traffic tag are
# printable tokens of at most 128 characters, the trace id 32 lower-case hex digits.
TOKEN_PATTERN = r"^[A-Za-z0-9._:/=+-]{1,128}$"
TRACE_ID_PATTERN = r"^[0-9a-f]{32}$"
# Colours kept per bucket and kind of sample (the most recent ones), and how many of them
# a trip's evidence carries.
COLOURS_PER_BUCKET = 16
MAX_TRIP_COLOURS = 8


class _Sample(BaseModel):
    # Unknown fields are ignored: routers may add fields before the gate reads them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Coloured(_Sample):
    # The request's colour (optional; a sample with a request id and a trace id is
    # "coloured": the gate records a ``gate_sample`` hop for it and keeps it as an example
    # of the samples behind a trip).
    request_id: str | None = Field(default=None, pattern=TOKEN_PATTERN)
    trace_id: str | None = Field(default=None, pattern=TRACE_ID_PATTERN)
    tag: str | None = Field(default=None, pattern=TOKEN_PATTERN)

    def colour_record(self) -> dict[str, str | None] | None:
        """``{request_id, trace_id, tag}`` when the sample is coloured, else None."""
        if self.request_id is None or self.trace_id is None:
            return None
        return {"request_id": self.request_id, "trace_id": self.trace_id, "tag": self.tag}


class Comparison(_Coloured):
    """One shadow comparison. ``kl_mean`` / ``kl_first`` may be any finite value >= 0:
    the gate clips them at its ``kl_clip`` on ingestion (a broken canary's huge KL is
    maximal divergence, never an overflow). ``invalid`` (the router's reason, when one
    side's answer was broken) makes a baseline-canary comparison count as it is sent
    (maximal divergence); a baseline-baseline one is never part of the noise floor (a
    broken baseline must not raise the floor and hide a drifted canary)."""

    time: float = Field(ge=0, le=MAX_TIME)
    pair: Literal["baseline-canary", "baseline-baseline"]
    bucket: str = Field(max_length=MAX_LABEL)
    prompt_tokens: int = Field(ge=0, le=MAX_PROMPT_TOKENS)
    positions: int = Field(ge=1, le=MAX_POSITIONS)
    kl_mean: float = Field(ge=0)
    kl_first: float | None = Field(default=None, ge=0)
    top1_agree: float = Field(ge=0, le=1)
    ttft_a_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    ttft_b_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    version_a: str | None = Field(default=None, max_length=MAX_ID)
    version_b: str | None = Field(default=None, max_length=MAX_ID)
    invalid: str | None = Field(default=None, max_length=MAX_ID)


class Outcome(_Coloured):
    time: float = Field(ge=0, le=MAX_TIME)
    variant: Literal["baseline", "canary"]
    bucket: str = Field(max_length=MAX_LABEL)
    prompt_tokens: int = Field(default=0, ge=0, le=MAX_PROMPT_TOKENS)
    ttft_s: float | None = Field(default=None, ge=0, le=MAX_TTFT_S)
    error: str | None = Field(default=None, max_length=MAX_ERROR)


# Samples in one batch, comparisons and outcomes together (a router sends at most 500).
MAX_BATCH_ITEMS = 10_000
# Batch ids remembered per router, and routers remembered, for deduplication.
BATCH_IDS_PER_ROUTER = 4096
MAX_ROUTERS_REMEMBERED = 1024


class SampleBatch(_Sample):
    """A router's batch. ``batch_id`` makes a resend idempotent: an id this gate saw
    recently from the same router (the last ``BATCH_IDS_PER_ROUTER``) is answered as a
    duplicate and counts nothing. A batch without a ``batch_id`` is accepted, but cannot
    be deduplicated: a resend of it counts twice."""

    router_id: str = Field(min_length=1, max_length=MAX_ID)
    release: str = Field(min_length=1, max_length=128)
    batch_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID)
    comparisons: list[Comparison] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)
    outcomes: list[Outcome] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)
    dropped: int = Field(default=0, ge=0, le=10**12)


class BatchRefused(ValueError):
    """A batch the gate refuses as a whole (nothing of it was counted); names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def validate_batch(batch: SampleBatch, labels: Sequence[str]) -> None:
    """Everything ``ReleaseGate.ingest`` needs beyond the model's own checks; raises
    ``BatchRefused`` naming the first bad field, before anything is counted."""
    total = len(batch.comparisons) + len(batch.outcomes)
    if total > MAX_BATCH_ITEMS:
        raise BatchRefused(
            "comparisons",
            f"Invalid sample batch: {len(batch.comparisons)} comparisons + "
            f"{len(batch.outcomes)} outcomes = {total} samples, more than "
            f"{MAX_BATCH_ITEMS} in one batch; send smaller batches.",
        )
    unknown = check_buckets(batch, labels)
    if unknown is not None:
        param, label = unknown
        raise BatchRefused(
            param,
            f"Unknown bucket {label!r} in {param}: this gate's buckets are "
            f"{', '.join(labels)}; start the gate and the routers with the "
            "same --bucket-edges.",
        )


class TripStatus(enum.Enum):
    """Where this gate's own trip decision stands (the only place these values live)."""

    PENDING = "pending"  # decided, not handed to the writer yet
    WRITING = "writing"  # the writer is at it (retrying while the broker is down or refuses)
    WRITTEN = "written"  # the broker carries the trip
    ABANDONED = "abandoned"  # no longer makes sense; why is in ``trip_status_reason``


# ---------------------------------------------------------------------------- budget
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


# ---------------------------------------------------------------------------- config
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
    # no data
    no_data_timeout_s: float = 30.0
    trip_on_no_data: bool = False
    # false-alarm budget: the rate the budget assumes, and the budget the thresholds were
    # derived from (None when they were set one by one; ``budget_json`` then shows the
    # budget they imply)
    budget_sample_rate_hz: float = DEFAULT_BUDGET_SAMPLE_RATE_HZ
    false_trips_per_release_hour: float | None = None

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
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
            ("noise_window", self.noise_window >= 1, ">= 1"),
            ("noise_min_samples", self.noise_min_samples >= 1, ">= 1"),
            ("no_data_timeout_s", self.no_data_timeout_s > 0, "> 0"),
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

    def to_json(self) -> dict[str, Any]:
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

    def budget_json(self) -> dict[str, Any]:
        """The false-alarm budget this configuration runs with (module docstring)."""
        counts = detector_counts(self.edges, self.pool_tails)
        r = self.budget_sample_rate_hz
        per_test = {
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


def tail_label(bucket: str) -> str:
    """``"2k-4k"`` -> ``"2k+"`` (the tail that starts at this bucket)."""
    return bucket.split("-", 1)[0].rstrip("+") + "+"


# -------------------------------------------------------------------------- scopes
@dataclass
class DriftScope:
    """Drift detectors and the live noise floor of one bucket or tail."""

    name: str
    members: tuple[str, ...]
    kl: ECusum
    top1: ECusum
    noise_kl: MeanWindow
    noise_top1: MeanWindow
    comparisons: int = 0
    fallbacks: int = 0  # comparisons tested against a borrowed floor (this canary)


@dataclass
class BucketScope:
    """Counters, reference windows and the latency and error detectors of one bucket."""

    name: str
    latency: ECusum
    errors: ECusum
    baseline_ttft: TimeWindow
    baseline_errors: TimeWindow
    comparisons: int = 0
    noise_comparisons: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"baseline": 0, "canary": 0})
    errors_seen: dict[str, int] = field(default_factory=lambda: {"baseline": 0, "canary": 0})
    # The colours of the most recent coloured canary samples, by kind ("comparison": a
    # baseline-canary comparison tested, "outcome": a canary outcome, "error": a canary
    # outcome with an error), as (sample time, colour record); bounded.
    colours: dict[str, deque[tuple[float, dict[str, str | None]]]] = field(
        default_factory=lambda: {
            kind: deque(maxlen=COLOURS_PER_BUCKET) for kind in ("comparison", "outcome", "error")
        }
    )

    def keep_colour(self, kind: str, sample: Comparison | Outcome) -> None:
        record = sample.colour_record()
        if record is not None:
            self.colours[kind].append((sample.time, record))


@dataclass
class Alarm:
    """A detector that reached its threshold, with what the evidence needs."""

    test: Literal["drift", "latency", "errors"]
    scope: str
    bucket: str
    detector: ECusum
    detail: dict[str, Any]
    colours: list[dict[str, str | None]] = field(default_factory=list)


@dataclass
class Ingested:
    comparisons: int = 0
    noise_comparisons: int = 0
    outcomes: int = 0
    ignored: dict[str, int] = field(default_factory=dict)
    duplicate: bool = False

    def ignore(self, reason: str, n: int = 1) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + n

    def to_json(self) -> dict[str, Any]:
        return {
            "comparisons": self.comparisons,
            "noise_comparisons": self.noise_comparisons,
            "outcomes": self.outcomes,
            "ignored": dict(self.ignored),
            "duplicate": self.duplicate,
        }


# ------------------------------------------------------------------------ the gate
class ReleaseGate:
    """The gate's view of one release. Feed it releases and batches; ask it for a trip.

    ``on_release`` takes the broker's release JSON (or None while unknown); ``ingest``
    takes a validated batch and returns the evidence of a new trip decision, if any.
    """

    def __init__(self, name: str, config: GateConfig) -> None:
        self.name = name
        self.config = config
        self.release: dict[str, Any] | None = None
        self.canary_version: str | None = None
        self.trip: dict[str, Any] | None = None  # this gate's decision (evidence)
        self.trip_status: TripStatus | None = None
        self.trip_status_reason: str | None = None  # why abandoned, or why still writing
        self.trip_revision: int | None = None
        self.watch_start_mono: float | None = None
        self.last_canary_sample_mono: float | None = None
        self.resets = 0
        self.totals = Ingested()
        self.router_dropped = 0
        self.duplicate_batches = 0
        # router id -> its recent batch ids (LRU); kept across resets: a resend is a
        # resend whatever the canary is now.
        self._seen_batches: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        # (scope, where its floor came from) -> comparisons tested against a floor borrowed
        # from another scope (or none); cumulative over resets, as a metric's counter.
        self.noise_fallbacks: dict[tuple[str, str], int] = {}
        # The stable version the noise windows were measured on (they survive a new
        # canary, not a new stable).
        self._noise_stable: str | None = None
        self._reset()

    # -- lifecycle -------------------------------------------------------------------
    def _reset(self, keep_noise: bool = False) -> None:
        cfg = self.config
        old_drift = getattr(self, "drift", {}) if keep_noise else {}
        labels = cfg.labels
        self.buckets: dict[str, BucketScope] = {
            b: BucketScope(
                name=b,
                latency=ECusum(cfg.latency_threshold, cfg.latency_bet),
                errors=ECusum(cfg.errors_threshold, cfg.errors_bet),
                baseline_ttft=TimeWindow(cfg.latency_window_s),
                baseline_errors=TimeWindow(cfg.error_window_s),
            )
            for b in labels
        }
        scopes: list[tuple[str, tuple[str, ...]]] = [(b, (b,)) for b in labels]
        if cfg.pool_tails:
            # Tails that pool more than one bucket (the last bucket's tail is itself).
            for i in range(1, len(labels) - 1):
                scopes.append((tail_label(labels[i]), tuple(labels[i:])))
            scopes.append((ALL_SCOPE, tuple(labels)))
        else:
            scopes.append((ALL_SCOPE, tuple(labels)))  # for the noise floor fallback only
        self.drift: dict[str, DriftScope] = {
            name: DriftScope(
                name=name,
                members=members,
                kl=ECusum(cfg.drift_threshold, cfg.drift_bet, clip=cfg.kl_clip),
                top1=ECusum(cfg.drift_threshold, cfg.drift_bet, clip=1.0),
                noise_kl=MeanWindow(cfg.noise_window, clip=cfg.kl_clip),
                noise_top1=MeanWindow(cfg.noise_window, clip=1.0),
            )
            for name, members in scopes
        }
        for name, scope in self.drift.items():
            old = old_drift.get(name)
            if old is not None:
                scope.noise_kl, scope.noise_top1 = old.noise_kl, old.noise_top1
        self._scopes_of: dict[str, list[DriftScope]] = {
            b: [s for s in self.drift.values() if b in s.members] for b in labels
        }
        # Scopes whose drift detectors run (the "all" pool only when tails are pooled).
        self._tested = {
            s.name for s in self.drift.values() if cfg.pool_tails or s.name != ALL_SCOPE
        }

    def reset(self, reason: str, now_mono: float, keep_noise: bool = True) -> None:
        """A fresh start for a new canary version. The noise floor is kept unless
        ``keep_noise`` is False: it measures the baseline's replicas, not the canary."""
        self._reset(keep_noise=keep_noise)
        self.trip = None
        self.trip_status = None
        self.trip_status_reason = None
        self.trip_revision = None
        self.last_canary_sample_mono = None
        self.watch_start_mono = now_mono if self._canary_live() else None
        self.resets += 1
        self.last_reset_reason = reason

    # -- broker view -----------------------------------------------------------------
    @property
    def phase(self) -> str | None:
        return None if self.release is None else str(self.release.get("phase"))

    @property
    def revision(self) -> int | None:
        return None if self.release is None else int(self.release.get("revision", 0))

    @property
    def canary_weight(self) -> float:
        if self.release is None:
            return 0.0
        weights = self.release.get("weights") or {}
        return float(weights.get("canary") or 0)

    @property
    def stable_version(self) -> str | None:
        if self.release is None:
            return None
        stable = self.release.get("stable") or {}
        return stable.get("version")

    def _release_canary(self) -> str | None:
        if self.release is None:
            return None
        canary = self.release.get("canary") or {}
        return canary.get("version")

    def _canary_live(self) -> bool:
        return (
            self.phase == "progressing"
            and self._release_canary() is not None
            and self.canary_weight > 0
        )

    def trippable(self) -> bool:
        """The broker shows this release progressing with the canary we tested."""
        return (
            self.phase == "progressing"
            and self._release_canary() is not None
            and self._release_canary() == self.canary_version
        )

    def on_release(self, release: dict[str, Any] | None, now_mono: float) -> None:
        was_live = self._canary_live()
        self.release = release
        version = self._release_canary()
        stable = self.stable_version
        new_stable = (
            stable is not None and self._noise_stable is not None and stable != self._noise_stable
        )
        if version != self.canary_version:
            if self.canary_version is not None or self.totals.comparisons:
                self.reset(
                    f"canary version {self.canary_version} -> {version}",
                    now_mono,
                    keep_noise=not new_stable,
                )
            self.canary_version = version
        elif new_stable:
            self._drop_noise()
        if new_stable or self._noise_stable is None:
            self._noise_stable = stable
        if self._canary_live() and not was_live:
            self.watch_start_mono = now_mono
        if not self._canary_live():
            self.watch_start_mono = None

    def _drop_noise(self) -> None:
        """A new stable version: the replicas whose noise the floor measured are gone."""
        cfg = self.config
        for scope in self.drift.values():
            scope.noise_kl = MeanWindow(cfg.noise_window, clip=cfg.kl_clip)
            scope.noise_top1 = MeanWindow(cfg.noise_window, clip=1.0)

    # -- samples ---------------------------------------------------------------------
    def testing(self) -> bool:
        """Detectors run only while no trip is decided and the phase lets the canary serve
        (or the broker has not been heard from yet: samples still count, a trip waits)."""
        if self.trip is not None:
            return False
        return self.release is None or self.phase == "progressing"

    def _seen(self, batch: SampleBatch) -> bool:
        """True when this router sent this batch id recently (and remember it if not)."""
        if batch.batch_id is None:
            return False
        ids = self._seen_batches.get(batch.router_id)
        if ids is None:
            ids = self._seen_batches[batch.router_id] = OrderedDict()
            while len(self._seen_batches) > MAX_ROUTERS_REMEMBERED:
                self._seen_batches.popitem(last=False)
        else:
            self._seen_batches.move_to_end(batch.router_id)
        if batch.batch_id in ids:
            ids.move_to_end(batch.batch_id)
            return True
        ids[batch.batch_id] = None
        while len(ids) > BATCH_IDS_PER_ROUTER:
            ids.popitem(last=False)
        return False

    def ingest(self, batch: SampleBatch, now_mono: float, now_wall: float) -> Ingested:
        """Count and test a batch. The whole batch is checked first (``validate_batch``,
        raising ``BatchRefused``): a refused batch changes nothing. A resend of a batch id
        seen recently from the same router counts nothing (``Ingested.duplicate``)."""
        validate_batch(batch, self.config.labels)
        got = Ingested()
        if self._seen(batch):
            got.duplicate = True
            self.duplicate_batches += 1
            return got
        self.router_dropped += batch.dropped
        if not self.testing():
            reason = "after_trip" if self.trip is not None else f"phase_{self.phase}"
            got.ignore(reason, len(batch.comparisons) + len(batch.outcomes))
            self._add_totals(got)
            return got
        for c in batch.comparisons:
            self._comparison(c, got, now_mono)
            if self.trip is not None:
                break
        if self.trip is None:
            # Time order, so each canary outcome meets the baseline outcomes before it.
            for o in sorted(batch.outcomes, key=lambda o: o.time):
                self._outcome(o, got, now_mono)
                if self.trip is not None:
                    break
        self._add_totals(got)
        return got

    def _add_totals(self, got: Ingested) -> None:
        t = self.totals
        t.comparisons += got.comparisons
        t.noise_comparisons += got.noise_comparisons
        t.outcomes += got.outcomes
        for k, v in got.ignored.items():
            t.ignore(k, v)

    def _comparison(self, c: Comparison, got: Ingested, now_mono: float) -> None:
        cfg = self.config
        bucket = self.buckets[c.bucket]
        # Clipped on ingestion: a huge KL is maximal divergence, and can move neither a
        # detector nor the noise floor further than the clip.
        kl = min(c.kl_mean, cfg.kl_clip)
        disagree = min(1.0, max(0.0, 1.0 - c.top1_agree))
        if c.pair == "baseline-baseline":
            if c.invalid is not None:
                got.ignore("noise_invalid")
                return
            got.noise_comparisons += 1
            bucket.noise_comparisons += 1
            for scope in self._scopes_of[c.bucket]:
                scope.noise_kl.add(kl)
                scope.noise_top1.add(disagree)
            return
        if c.version_b is not None:
            if self.canary_version is None and self.release is None:
                self.canary_version = c.version_b  # broker not heard yet: follow samples
            elif c.version_b != self.canary_version:
                got.ignore("other_canary_version")
                return
        got.comparisons += 1
        bucket.comparisons += 1
        bucket.keep_colour("comparison", c)
        self.last_canary_sample_mono = now_mono
        alarms: list[tuple[int, float, DriftScope, ECusum, str, float, float]] = []
        for scope in self._scopes_of[c.bucket]:
            scope.comparisons += 1
            if scope.name not in self._tested:
                continue
            noise_kl, noise_top1, source = self._noise(scope)
            if source != scope.name:
                key = (scope.name, source)
                self.noise_fallbacks[key] = self.noise_fallbacks.get(key, 0) + 1
                scope.fallbacks += 1
            m0_kl = noise_kl + cfg.kl_tolerance
            m0_top1 = noise_top1 + cfg.top1_tolerance
            if scope.kl.update(kl, m0_kl, c.time):
                alarms.append(
                    (
                        len(scope.members),
                        -scope.kl.log_m,
                        scope,
                        scope.kl,
                        "kl_mean",
                        noise_kl,
                        cfg.kl_tolerance,
                    )
                )
            if m0_top1 < 1.0 and scope.top1.update(disagree, m0_top1, c.time):
                alarms.append(
                    (
                        len(scope.members),
                        -scope.top1.log_m,
                        scope,
                        scope.top1,
                        "top1_disagreement",
                        noise_top1,
                        cfg.top1_tolerance,
                    )
                )
        if alarms:
            # Several scopes may alarm on one sample: the narrowest one says most.
            _, _, scope, det, metric, noise, tolerance = min(alarms, key=lambda a: a[:2])
            self._alarm("drift", scope, det, metric=metric, noise=noise, tolerance=tolerance)
            return
        if c.ttft_a_s is not None and c.ttft_b_s is not None:
            slow = c.ttft_b_s > cfg.latency_ratio * c.ttft_a_s + cfg.latency_slack_s
            if bucket.latency.update(1.0 if slow else 0.0, 0.5, c.time):
                self._alarm_bucket("latency", bucket, bucket.latency, source="paired_shadow")

    def _outcome(self, o: Outcome, got: Ingested, now_mono: float) -> None:
        cfg = self.config
        bucket = self.buckets[o.bucket]
        got.outcomes += 1
        bucket.outcomes[o.variant] += 1
        failed = o.error is not None
        if failed:
            bucket.errors_seen[o.variant] += 1
        if o.variant == "baseline":
            bucket.baseline_errors.add(o.time, 1.0 if failed else 0.0)
            if not failed and o.ttft_s is not None:
                bucket.baseline_ttft.add(o.time, o.ttft_s)
            return
        self.last_canary_sample_mono = now_mono
        bucket.keep_colour("error" if failed else "outcome", o)
        ref_errors = bucket.baseline_errors.values(o.time)
        n_ref = len(ref_errors)
        k_ref = int(sum(ref_errors))
        m0 = binomial_upper(k_ref, n_ref, cfg.error_ucb_delta) + cfg.error_tolerance
        if m0 < 1.0 and bucket.errors.update(1.0 if failed else 0.0, m0, o.time):
            self._alarm_bucket(
                "errors",
                bucket,
                bucket.errors,
                baseline_errors=k_ref,
                baseline_outcomes=n_ref,
                baseline_error_rate=round(k_ref / n_ref, 6) if n_ref else None,
                tolerance=cfg.error_tolerance,
                error=o.error,
            )
            return
        if failed or o.ttft_s is None:
            return
        # The most recent baseline TTFTs only: a slowdown of both variants (slow router,
        # loaded machine) reaches the reference within a few baseline requests.
        ref = bucket.baseline_ttft.values(o.time)[-cfg.latency_reference_n :]
        if len(ref) < cfg.latency_min_reference:
            return
        ref_median = median(ref)
        slow = o.ttft_s > cfg.latency_ratio * ref_median + cfg.latency_slack_s
        if bucket.latency.update(1.0 if slow else 0.0, 0.5, o.time):
            self._alarm_bucket(
                "latency",
                bucket,
                bucket.latency,
                source="outcomes",
                baseline_median_ttft_s=round(ref_median, 6),
                canary_ttft_s=o.ttft_s,
            )

    def _noise(self, scope: DriftScope) -> tuple[float, float, str]:
        """(kl floor, top-1 disagreement floor, where it came from) for a scope."""
        n_min = self.config.noise_min_samples
        for source in (scope, self.drift[ALL_SCOPE]):
            if len(source.noise_kl) >= n_min:
                kl, top1 = source.noise_kl.upper(), source.noise_top1.upper()
                # Never use a floor that is not finite (it would blind the test): fall
                # back, and ``problems`` reports it.
                if math.isfinite(kl) and math.isfinite(top1):
                    return max(0.0, kl), min(1.0, max(0.0, top1)), source.name
        return 0.0, 0.0, "none"

    # -- decisions -------------------------------------------------------------------
    def _alarm(
        self,
        test: Literal["drift"],
        scope: DriftScope,
        det: ECusum,
        *,
        metric: str,
        noise: float,
        tolerance: float,
    ) -> None:
        bucket = self._strongest_member(scope, metric)
        detail: dict[str, Any] = {
            "metric": metric,
            "scope": scope.name,
            "pooled_buckets": list(scope.members),
            "noise_floor": round(noise, 6),
            "noise_source": self._noise(scope)[2],
            "tolerance": tolerance,
        }
        colours = self.trip_colours(scope.members, "comparison")
        self._decide(Alarm(test, scope.name, bucket, det, detail, colours))

    def _alarm_bucket(
        self,
        test: Literal["latency", "errors"],
        bucket: BucketScope,
        det: ECusum,
        **extra: Any,
    ) -> None:
        detail: dict[str, Any] = {"scope": bucket.name, "pooled_buckets": [bucket.name]}
        if test == "latency":
            detail.update(
                metric="canary_slower_share",
                latency_ratio=self.config.latency_ratio,
                latency_slack_s=self.config.latency_slack_s,
            )
        else:
            detail.update(metric="canary_error_rate")
        detail.update(extra)
        kind = "error" if test == "errors" else "outcome"
        if extra.get("source") == "paired_shadow":
            kind = "comparison"
        colours = self.trip_colours((bucket.name,), kind)
        self._decide(Alarm(test, bucket.name, bucket.name, det, detail, colours))

    def trip_colours(self, buckets: Sequence[str], kind: str) -> list[dict[str, str | None]]:
        """The colours of the (at most ``MAX_TRIP_COLOURS``) most recent samples of ``kind``
        in ``buckets`` behind a trip, oldest first: examples a person can follow end to end."""
        kept = [entry for b in buckets for entry in self.buckets[b].colours[kind]]
        kept.sort(key=lambda entry: entry[0])
        return [dict(record) for _, record in kept[-MAX_TRIP_COLOURS:]]

    def _strongest_member(self, scope: DriftScope, metric: str) -> str:
        if len(scope.members) == 1:
            return scope.members[0]

        def strength(label: str) -> tuple[float, float]:
            own = self.drift[label]
            det = own.kl if metric == "kl_mean" else own.top1
            run = det.run_sum / det.run_samples if det.run_samples and det.log_m > 0 else 0.0
            return (det.log_m, run)

        return max(scope.members, key=strength)

    def _decide(self, alarm: Alarm) -> None:
        det = alarm.detector
        first = det.run_first_time if det.run_first_time is not None else 0.0
        last = det.run_last_time if det.run_last_time is not None else first
        run_mean = det.run_sum / det.run_samples if det.run_samples else None
        detail = {
            "method": "e-CUSUM (betting e-values)",
            "arl_lower_bound_samples": det.threshold,
            "null_mean": round(det.last_m0, 6) if det.last_m0 is not None else None,
            "run_mean": round(run_mean, 6) if run_mean is not None else None,
            "bet_fraction": det.bet_fraction,
            "test_samples": det.samples,
            "canary_version": self.canary_version,
            "stable_version": self.stable_version,
            **alarm.detail,
        }
        self.trip = {
            "test": alarm.test,
            "bucket": alarm.bucket,
            "statistic": round(det.statistic, 6),
            "threshold": float(det.threshold),
            "samples": det.run_samples,
            "first_sample_time": first,
            "last_sample_time": max(first, last),
            "tripped_at": 0.0,  # set by the caller with its wall clock
            "detail": detail,
            "colours": alarm.colours,
        }
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None

    def check_no_data(self, now_mono: float) -> bool:
        """True when the canary is live and no canary sample came for the timeout."""
        if not self._canary_live() or self.trip is not None:
            return False
        since = self.last_canary_sample_mono or self.watch_start_mono
        if since is None:
            return False
        return now_mono - since >= self.config.no_data_timeout_s

    def decide_no_data(self, now_mono: float, now_wall: float) -> None:
        """Trip for lack of data (only with ``trip_on_no_data``)."""
        since = self.last_canary_sample_mono or self.watch_start_mono or now_mono
        waited = now_mono - since
        self.trip = {
            "test": "no_data",
            "bucket": ALL_SCOPE,
            "statistic": round(waited, 3),
            "threshold": self.config.no_data_timeout_s,
            "samples": 0,
            "first_sample_time": now_wall - waited,
            "last_sample_time": now_wall,
            "tripped_at": now_wall,
            "detail": {
                "reason": "no_data",
                "message": f"canary weight {self.canary_weight:g} but no canary sample for "
                f"{waited:.1f} s (--trip-on-no-data)",
                "canary_version": self.canary_version,
            },
            "colours": [],  # no sample is behind a trip for lack of samples
        }
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None

    def abandon_trip(self, reason: str) -> None:
        """The trip no longer makes sense (release moved on, or the broker refused it)."""
        self.trip_status = TripStatus.ABANDONED
        self.trip_status_reason = reason

    # -- reading ---------------------------------------------------------------------
    def state(self, now_mono: float) -> GateState:
        if self.trip is not None and self.trip_status is not TripStatus.ABANDONED:
            return "tripped"
        if self.phase in CANARY_OFF_PHASES:
            return "tripped"
        if self.phase != "progressing" or self._release_canary() is None:
            return "idle"
        if self.check_no_data(now_mono):
            return "inconclusive"
        return "watching"

    def broker_trip(self) -> dict[str, Any] | None:
        return None if self.release is None else self.release.get("trip")

    def noise_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for scope in self.drift.values():
            kl, top1, source = self._noise(scope)
            out[scope.name] = {
                "kl": round(kl, 6),
                "top1_disagreement": round(top1, 6),
                "source": source,
                # Another scope's floor (or "none": no floor at all, 0) stands in for this
                # one's: too few baseline-baseline comparisons of its own.
                "borrowed_from": None if source == scope.name else source,
                "fallback_comparisons": scope.fallbacks,
                "samples": len(scope.noise_kl),
                "kl_mean": round(scope.noise_kl.mean(), 6),
            }
        return out

    def budget_json(self) -> dict[str, Any]:
        """The configured budget and whether the observed sample rate keeps within the
        rate it assumes (if not, the guarantee does not hold at this traffic)."""
        out = self.config.budget_json()
        rates = [r for _, _, d in self.detectors() if (r := d.sample_rate_hz()) is not None]
        observed = max(rates) if rates else None
        out["observed_max_sample_rate_hz"] = round(observed, 3) if observed is not None else None
        out["within_assumed_rate"] = (
            None if observed is None else observed <= self.config.budget_sample_rate_hz
        )
        return out

    def to_json(self, now_mono: float) -> dict[str, Any]:
        buckets: dict[str, Any] = {}
        for label, b in self.buckets.items():
            d = self.drift[label]
            buckets[label] = {
                "comparisons": b.comparisons,
                "noise_comparisons": b.noise_comparisons,
                "outcomes": dict(b.outcomes),
                "errors_seen": dict(b.errors_seen),
                "drift": {"kl": d.kl.to_json(), "top1_disagreement": d.top1.to_json()},
                "latency": b.latency.to_json(),
                "errors": b.errors.to_json(),
            }
        tails = {
            name: {
                "buckets": list(s.members),
                "comparisons": s.comparisons,
                "drift": {"kl": s.kl.to_json(), "top1_disagreement": s.top1.to_json()},
            }
            for name, s in self.drift.items()
            if len(s.members) > 1 and name in self._tested
        }
        no_data_for = None
        since = self.last_canary_sample_mono or self.watch_start_mono
        if since is not None and self._canary_live():
            no_data_for = round(now_mono - since, 3)
        return {
            "release": self.name,
            "state": self.state(now_mono),
            "revision": self.revision,
            "phase": self.phase,
            "canary_version": self.canary_version,
            "canary_weight": self.canary_weight,
            "buckets": buckets,
            "tails": tails,
            "noise_floor": self.noise_json(),
            "false_alarm_budget": self.budget_json(),
            "trip": self.trip if self.trip is not None else self.broker_trip(),
            "trip_source": "gate"
            if self.trip is not None
            else ("broker" if self.broker_trip() is not None else None),
            "trip_status": None if self.trip_status is None else self.trip_status.value,
            "trip_status_reason": self.trip_status_reason,
            "trip_revision": self.trip_revision,
            "seconds_since_canary_sample": no_data_for,
            "samples": self.totals.to_json(),
            "router_dropped": self.router_dropped,
            "duplicate_batches": self.duplicate_batches,
            "resets": self.resets,
            "problems": self.problems(),
        }

    def problems(self) -> list[str]:
        """Why this gate's statistics cannot be trusted (empty when they can): a detector
        or noise floor that is not finite, or a trip the broker refused while the release
        is still progressing with that canary (users are not protected)."""
        out: list[str] = []
        for scope_name, test, det in self.detectors():
            if not det.finite():
                out.append(f"statistic_not_finite:{scope_name}:{test}")
        for scope in self.drift.values():
            for metric, window in (("kl", scope.noise_kl), ("top1", scope.noise_top1)):
                if not (math.isfinite(window.upper()) and window.upper() >= 0):
                    out.append(f"noise_floor_not_finite:{scope.name}:{metric}")
        if self.trip is not None and self.trip_status is TripStatus.ABANDONED and self.trippable():
            out.append("trip_not_written")
        return out

    def detectors(self) -> Iterable[tuple[str, str, ECusum]]:
        """(scope, test name, detector) for every running detector (for /metrics)."""
        for name, s in self.drift.items():
            if name in self._tested:
                yield name, "drift_kl", s.kl
                yield name, "drift_top1", s.top1
        for label, b in self.buckets.items():
            yield label, "latency", b.latency
            yield label, "errors", b.errors


def check_buckets(batch: SampleBatch, labels: Sequence[str]) -> tuple[str, str] | None:
    """The first sample whose bucket this gate does not know: (param, label), or None."""
    known = set(labels)
    for i, c in enumerate(batch.comparisons):
        if c.bucket not in known:
            return f"comparisons[{i}].bucket", c.bucket
    for i, o in enumerate(batch.outcomes):
        if o.bucket not in known:
            return f"outcomes[{i}].bucket", o.bucket
    return None
