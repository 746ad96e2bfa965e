"""Per-release gate state (``ReleaseGate``): the detectors per scope, the live noise
floor, the no-data rule, and the decision to trip. Over 400 lines because ``ReleaseGate``
is one state machine whose parts read and write the same fields; what could stand alone
(input, config, scopes, per-sample tests, trip record, views) already does.

This module must never do I/O or read a clock: callers pass ``now`` in, so tests drive
time. It never decides to trip a release the broker does not show as progressing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from typing import Literal, TypedDict

from canary_contract.broker import (
    MAX_TRIP_COLOURS,
    CanaryRef,
    Release,
    StableRef,
    TripRecord,
    Weights,
    trip_json,
)
from canary_contract.phases import Phase, is_canary_off
from canary_contract.trip import TripStatus
from canarystack.gate import detect, trip_record, views
from canarystack.gate.config import (
    DEFAULT_BUDGET_SAMPLE_RATE_HZ,
    DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
    SECONDS_PER_HOUR,
    FalseAlarmBudget,
    GateConfig,
    detector_counts,
    implied_budget,
    threshold_for_budget,
)
from canarystack.gate.release_test import ReleaseFloorJson, ReleaseTest, ReleaseTestJson
from canarystack.gate.samples import (
    BATCH_IDS_PER_ROUTER,
    MAX_BATCH_ITEMS,
    MAX_ROUTERS_REMEMBERED,
    BatchRefused,
    Comparison,
    Outcome,
    SampleBatch,
    check_buckets,
    validate_batch,
)
from canarystack.gate.scopes import (
    ALL_SCOPE,
    COLOURS_PER_BUCKET,
    Alarm,
    BucketScope,
    DriftScope,
    Ingested,
    IngestedJson,
    drift_scopes,
    tail_label,
    tested_scopes,
)
from canarystack.gate.stats import Detector, ECusum, MeanWindow, TimeWindow

# The names of the gate's rooms that callers import from here: the tests of one sample
# (``detect``), a trip's record (``trip_record``), the JSON views (``views``), the input
# (``samples``), the thresholds and budget (``config``), the scopes (``scopes``) and the
# method (``stats``).
__all__ = [
    "ALL_SCOPE",
    "BATCH_IDS_PER_ROUTER",
    "COLOURS_PER_BUCKET",
    "DEFAULT_BUDGET_SAMPLE_RATE_HZ",
    "DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR",
    "MAX_BATCH_ITEMS",
    "MAX_ROUTERS_REMEMBERED",
    "MAX_TRIP_COLOURS",
    "SECONDS_PER_HOUR",
    "STATES",
    "BatchRefused",
    "Comparison",
    "GateConfig",
    "GateState",
    "Outcome",
    "ReleaseGate",
    "SampleBatch",
    "TripStatus",
    "check_buckets",
    "detector_counts",
    "implied_budget",
    "tail_label",
    "threshold_for_budget",
    "validate_batch",
]

GateState = Literal["idle", "watching", "tripped", "inconclusive"]
# The gate-blind fail-safe trips only when the baseline outcomes seen since the last canary
# sample, at the canary's weight, should have brought at least this many canary samples
# (the chance of seeing none of 5 expected is under 1 %): an idle stack is not blind.
BLIND_EXPECTED_CANARY = 5.0
STATES: tuple[GateState, ...] = ("idle", "watching", "tripped", "inconclusive")


class GateJson(TypedDict):
    """``GET /v1/gate/{release}``: the gate's fields and its parts' views."""

    release: str
    state: GateState
    revision: int | None
    phase: str | None
    canary_version: str | None
    canary_weight: float
    buckets: dict[str, views.BucketJson]
    tails: dict[str, views.TailJson]
    noise_floor: dict[str, views.NoiseFloorJson] | dict[str, ReleaseFloorJson]
    false_alarm_budget: FalseAlarmBudget
    test: str
    release_test: ReleaseTestJson | None
    trip: TripRecord | None
    trip_source: Literal["gate", "broker"] | None
    trip_status: str | None
    trip_status_reason: str | None
    trip_revision: int | None
    seconds_since_canary_sample: float | None
    samples: IngestedJson
    router_dropped: int
    duplicate_batches: int
    resets: int
    problems: list[str]


def release_record(
    name: str,
    revision: int,
    stable: str,
    canary: str | None,
    weight: float,
    *,
    phase: Phase = Phase.PROGRESSING,
    quarantined: bool = False,
) -> Release:
    """A release as a broker would answer it, for a gate fed by something else than a
    broker (the drift judge, benchmarks, tests): digests unknown (empty), no trip, created
    and updated at 0."""
    return Release(
        name=name,
        phase=phase,
        revision=revision,
        stable=StableRef(version=stable, digest=""),
        canary=None
        if canary is None
        else CanaryRef(version=canary, digest="", quarantined=quarantined),
        weights=Weights(canary=weight),
        trip=None,
        created_at=0.0,
        updated_at=0.0,
    )


class ReleaseGate:
    """The gate's view of one release. Feed it releases and batches; ask it for a trip.

    ``on_release`` takes the broker's release (or None while unknown); ``ingest``
    takes a validated batch and returns the evidence of a new trip decision, if any.
    Samples that name another canary version than the broker's are ignored.
    """

    def __init__(self, name: str, config: GateConfig) -> None:
        self.name = name
        self.config = config
        self.release: Release | None = None
        self.canary_version: str | None = None
        self.trip: TripRecord | None = None  # this gate's decision (evidence)
        self.trip_status: TripStatus | None = None
        self.trip_status_reason: str | None = None  # why abandoned, or why still writing
        self.trip_revision: int | None = None
        self.watch_start_mono: float | None = None
        self.last_canary_sample_mono: float | None = None
        # Baseline outcomes since the last canary sample (or the watch start): the traffic
        # the canary should have had its share of (the gate-blind rule).
        self.baseline_since_canary = 0
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
        """Fresh detectors for every scope.

        Drift is tested per bucket *and* per tail (every bucket at or above an edge:
        ``512+``, ``1k+``, ``2k+``, plus ``all``): a fault that grows with prompt length
        shows in the tail that pools all the long buckets at twice the sample rate of either
        bucket, so it trips sooner. A tail trip names, as ``bucket``, the member bucket with
        the strongest evidence of its own (highest statistic, then highest run mean), and
        lists the pooled buckets in ``detail``. Latency and errors compare variants *in the
        same bucket* only, as TTFT and error rates depend on prompt length.
        """
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
        scopes = drift_scopes(labels, cfg.pool_tails)
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
        # --test release-eprocess: one anytime-valid test for this release (its floors'
        # measurements carried over like the live floor's, frozen anew for the release).
        old_test = getattr(self, "release_test", None) if keep_noise else None
        self.release_test: ReleaseTest | None = (
            ReleaseTest(cfg, old_test.floors if old_test is not None else None)
            if cfg.release_test
            else None
        )
        self.scopes_of: dict[str, list[DriftScope]] = {
            b: [s for s in self.drift.values() if b in s.members] for b in labels
        }
        # Scopes whose drift detectors run (the "all" pool only when tails are pooled).
        self.tested = set(tested_scopes(labels, cfg.pool_tails))

    def reset(self, reason: str, now_mono: float, keep_noise: bool = True) -> None:
        """A fresh start for a new canary version. The noise floor is kept unless
        ``keep_noise`` is False: it measures the baseline's replicas, not the canary."""
        self._reset(keep_noise=keep_noise)
        self.trip = None
        self.trip_status = None
        self.trip_status_reason = None
        self.trip_revision = None
        self.last_canary_sample_mono = None
        self.baseline_since_canary = 0
        self.watch_start_mono = now_mono if self.canary_live() else None
        self.resets += 1
        self.last_reset_reason = reason

    # -- broker view -----------------------------------------------------------------
    @property
    def phase(self) -> str | None:
        return None if self.release is None else self.release.phase.value

    @property
    def revision(self) -> int | None:
        return None if self.release is None else self.release.revision

    @property
    def canary_weight(self) -> float:
        return 0.0 if self.release is None else self.release.canary_weight

    @property
    def stable_version(self) -> str | None:
        return None if self.release is None else self.release.stable.version

    def _release_canary(self) -> str | None:
        if self.release is None or self.release.canary is None:
            return None
        return self.release.canary.version

    def canary_live(self) -> bool:
        """The contract's rule (``canary_contract.phases.canary_live``): a quarantined
        canary is not live, whatever its phase and weight."""
        return self.release is not None and self.release.canary_live

    def trippable(self) -> bool:
        """The broker shows this release progressing with the canary we tested."""
        return (
            self.phase == "progressing"
            and self._release_canary() is not None
            and self._release_canary() == self.canary_version
        )

    def on_release(self, release: Release | None, now_mono: float) -> None:
        """The broker's release (None while unknown).

        A new canary version resets every detector and counter, but *keeps the noise
        floor*: baseline-baseline noise is a property of the stable version and its
        replicas, not of the canary, so a new canary is tested against the floor measured
        so far. The floor is dropped only when the stable version changes.
        """
        was_live = self.canary_live()
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
        if self.canary_live() and not was_live:
            self.watch_start_mono = now_mono
            self.baseline_since_canary = 0
        if not self.canary_live():
            self.watch_start_mono = None

    def _drop_noise(self) -> None:
        """A new stable version: the replicas whose noise the floor measured are gone."""
        cfg = self.config
        for scope in self.drift.values():
            scope.noise_kl = MeanWindow(cfg.noise_window, clip=cfg.kl_clip)
            scope.noise_top1 = MeanWindow(cfg.noise_window, clip=1.0)
        if self.release_test is not None:
            self.release_test.drop_floors()

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
            detect.comparison(self, c, got, now_mono)
            if self.trip is not None:
                break
        if self.trip is None:
            # Time order, so each canary outcome meets the baseline outcomes before it.
            for o in sorted(batch.outcomes, key=lambda o: o.time):
                detect.outcome(self, o, got, now_mono)
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

    def noise_of(self, scope: DriftScope) -> tuple[float, float, str]:
        """(kl floor, top-1 disagreement floor, where it came from) for a scope.

        A floor is *borrowed* when its scope has fewer than ``noise_min_samples`` of its
        own: ``noise_json`` names the scope it came from (``borrowed_from``; ``"none"`` for
        no floor at all) and ``noise_fallbacks`` counts the comparisons tested against a
        borrowed floor (the ``canarystack_gate_noise_floor_fallbacks`` metric).
        """
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
    def alarm(
        self,
        test: Literal["drift"],
        scope: DriftScope,
        det: ECusum,
        *,
        metric: str,
        noise: float,
        tolerance: float,
    ) -> None:
        detail = trip_record.drift_detail(scope, metric, noise, self.noise_of(scope)[2], tolerance)
        bucket = trip_record.strongest_member(self.drift, scope, metric)
        colours = trip_record.trip_colours(self.buckets, scope.members, "comparison")
        self._decide(Alarm(test, scope.name, bucket, det, detail, colours))

    def alarm_bucket(
        self,
        test: Literal["latency", "errors"],
        bucket: BucketScope,
        det: ECusum,
        **extra: object,
    ) -> None:
        detail = trip_record.bucket_detail(test, bucket.name, self.config, extra)
        kind = "error" if test == "errors" else "outcome"
        if extra.get("source") == "paired_shadow":
            kind = "comparison"
        colours = trip_record.trip_colours(self.buckets, (bucket.name,), kind)
        self._decide(Alarm(test, bucket.name, bucket.name, det, detail, colours))

    def decide_release(self) -> bool:
        """``--test release-eprocess``: trip when the release's weighted average of
        e-processes has reached ``1 / alpha`` (True when it did)."""
        rt = self.release_test
        if rt is None or self.trip is not None or not rt.tripped():
            return False
        self.trip = rt.decision(self.buckets, self.canary_version, self.stable_version)
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None
        return True

    def _decide(self, alarm: Alarm) -> None:
        self.trip = trip_record.alarm_evidence(alarm, self.canary_version, self.stable_version)
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None

    def check_no_data(self, now_mono: float) -> bool:
        """True when the canary is live and no canary sample came for the timeout."""
        if not self.canary_live() or self.trip is not None:
            return False
        since = self.last_canary_sample_mono or self.watch_start_mono
        if since is None:
            return False
        return now_mono - since >= self.config.no_data_timeout_s

    def saw_canary(self, now_mono: float) -> None:
        """A canary sample arrived: the gate is not blind."""
        self.last_canary_sample_mono = now_mono
        self.baseline_since_canary = 0

    def expected_canary_samples(self) -> float:
        """Canary samples the baseline outcomes since the last one imply at its weight."""
        w = self.canary_weight
        if not 0 < w < 100:
            return 0.0
        return self.baseline_since_canary * w / (100.0 - w)

    def check_blind(self, now_mono: float) -> bool:
        """The gate-blind fail-safe: inconclusive, no canary sample for
        ``blind_failsafe_s``, and the baseline traffic meanwhile says the canary had its
        share (``BLIND_EXPECTED_CANARY``)."""
        if not self.check_no_data(now_mono):
            return False
        since = self.last_canary_sample_mono or self.watch_start_mono
        if since is None or now_mono - since < self.config.blind_failsafe_s:
            return False
        return self.expected_canary_samples() >= BLIND_EXPECTED_CANARY

    def decide_blind(self, now_mono: float, now_wall: float) -> None:
        """Trip because the gate is blind while the canary takes traffic (fail safe)."""
        since = self.last_canary_sample_mono or self.watch_start_mono or now_mono
        self.trip = trip_record.gate_blind_evidence(
            now_mono - since,
            now_wall,
            self.config.blind_failsafe_s,
            self.canary_weight,
            self.canary_version,
            self.baseline_since_canary,
            self.expected_canary_samples(),
        )
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None

    def decide_no_data(self, now_mono: float, now_wall: float) -> None:
        """Trip for lack of data (only with ``trip_on_no_data``)."""
        since = self.last_canary_sample_mono or self.watch_start_mono or now_mono
        waited = now_mono - since
        self.trip = trip_record.no_data_evidence(
            waited, now_wall, self.config.no_data_timeout_s, self.canary_weight, self.canary_version
        )
        self.trip_status = TripStatus.PENDING
        self.trip_status_reason = None

    def abandon_trip(self, reason: str) -> None:
        """The trip no longer makes sense (release moved on, or the broker refused it)."""
        self.trip_status = TripStatus.ABANDONED
        self.trip_status_reason = reason

    # -- reading ---------------------------------------------------------------------
    def state(self, now_mono: float) -> GateState:
        """``idle`` (no progressing release with a canary), ``watching``, ``inconclusive``
        (canary weight > 0 but no canary sample for ``no_data_timeout_s``), ``tripped``
        (this gate decided, or the broker's phase keeps the canary off)."""
        if self.trip is not None and self.trip_status is not TripStatus.ABANDONED:
            return "tripped"
        if is_canary_off(self.phase):
            return "tripped"
        if self.phase != "progressing" or self._release_canary() is None:
            return "idle"
        if self.check_no_data(now_mono):
            return "inconclusive"
        return "watching"

    def broker_trip(self) -> TripRecord | None:
        """The trip the broker's release carries (whoever wrote it), as the gate serves it."""
        if self.release is None or self.release.trip is None:
            return None
        return trip_json(self.release.trip)

    def noise_json(self) -> dict[str, views.NoiseFloorJson] | dict[str, ReleaseFloorJson]:
        return views.noise_json(self.drift, self.release_test, self.noise_of)

    def budget_json(self) -> FalseAlarmBudget:
        return views.budget_json(self.config, self.detectors(), self.release_test)

    def to_json(self, now_mono: float) -> GateJson:
        """``GET /v1/gate/{release}``: the gate's fields, and its parts' views
        (``canarystack.gate.views``)."""
        rt = self.release_test
        no_data_for = None
        since = self.last_canary_sample_mono or self.watch_start_mono
        if since is not None and self.canary_live():
            no_data_for = round(now_mono - since, 3)
        return {
            "release": self.name,
            "state": self.state(now_mono),
            "revision": self.revision,
            "phase": self.phase,
            "canary_version": self.canary_version,
            "canary_weight": self.canary_weight,
            "buckets": views.buckets_json(self.buckets, self.drift, rt),
            "tails": views.tails_json(self.drift, self.tested, rt),
            "noise_floor": self.noise_json(),
            "false_alarm_budget": self.budget_json(),
            "test": self.config.test,
            "release_test": None if rt is None else rt.to_json(),
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

    def detectors(self) -> Iterable[tuple[str, str, Detector]]:
        """(scope, test name, detector) for every running detector (for /metrics)."""
        if self.release_test is not None:
            yield from self.release_test.view_detectors()
            return
        for name, s in self.drift.items():
            if name in self.tested:
                yield name, "drift_kl", s.kl
                yield name, "drift_top1", s.top1
        for label, b in self.buckets.items():
            yield label, "latency", b.latency
            yield label, "errors", b.errors
