"""One anytime-valid test per release (``--test release-eprocess``; issue #26): a
``ReleaseGate``'s detectors as betting e-processes whose weighted average trips the
release at ``1 / alpha`` (``canarystack.gate.eprocess``), tested against noise floors that
are upper confidence sequences frozen per release (``canarystack.gate.floor``), with the
dependence rule (``canarystack.gate.sessions``) and a bounded weight for invalid answers.

What a release is guaranteed: ``P(any false trip while the release runs) <= alpha +
floor_delta`` (defaults 1e-3 + 1e-4), however long it runs and whatever the sample rate,
for a canary whose every observation meets its null mean given the past:

- drift (KL, top-1 disagreement), per bucket and tail: the comparison's divergence (KL
  clipped at ``kl_clip``) against ``m0 = floor + tolerance``, the floor being the scope's
  frozen upper confidence bound on the baseline-baseline mean (the clip while the scope has
  too few comparisons). A comparison with an invalid canary side counts as
  ``invalid_weight x m0`` (capped at the clip), not as maximal divergence: a bet is chosen
  before the observation, so one invalid answer among healthy ones moves nothing, while a
  canary whose every answer is invalid wins ``1 + f (invalid_weight - 1)`` per comparison;
- latency, per bucket: 1 when the canary's TTFT exceeds ``latency_ratio`` x the
  baseline's (paired, or the recent baseline median) + slack, against ``m0 = 1/2``;
- errors, per bucket: 1 for a canary error, against the Clopper-Pearson upper bound of the
  baseline's recent error rate + ``error_tolerance`` (predictable: from past outcomes).

Only comparisons admitted by the dependence rule enter the drift and paired-latency tests.

This module must never do I/O or read a clock: sample times come with the samples, and
it never decides to trip a release by itself (``ReleaseGate`` does, from ``decision``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from canary_contract.broker import TripRecord
from canarystack.gate import trip_record
from canarystack.gate.config import GateConfig
from canarystack.gate.eprocess import BetRule, EProcesses, ReleaseEProcess, alone_threshold
from canarystack.gate.floor import FloorJson, NoiseFloor
from canarystack.gate.release_weights import (
    detector_name,
    floor_count,
    focus_scope,
    release_weights,
    weights_by_test,
)
from canarystack.gate.samples import Comparison
from canarystack.gate.scopes import BucketScope, drift_scopes, tested_scopes
from canarystack.gate.sessions import SessionThinning, ThinningJson
from canarystack.gate.stats import EProcessJson

# The metric each test's observations measure (a trip's ``detail.metric``).
METRICS = {
    "drift_kl": "kl_mean",
    "drift_top1": "top1_disagreement",
    "latency": "canary_slower_share",
    "errors": "canary_error_rate",
}
# The broker's name of each test (``TripEvidence.test``).
TRIP_TESTS = {"drift_kl": "drift", "drift_top1": "drift", "latency": "latency", "errors": "errors"}
# Detectors listed in a trip's evidence, largest share first.
MAX_CONTRIBUTIONS = 5


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 6)


class ReleaseFloorJson(FloorJson):
    """A release test's floor in the keys of the default test's ``noise_floor`` too."""

    source: str
    borrowed_from: str | None


class ReleaseTestJson(TypedDict):
    """``--test release-eprocess``'s test as ``GET /v1/gate/{release}`` shows it."""

    test: str
    alpha: float
    floor_delta: float
    false_trip_probability_per_release: float
    statistic: float | None
    threshold: float
    focus_detector: str
    weights_by_test: dict[str, float]
    invalid_weight: float
    invalid_comparisons: int
    dependence: ThinningJson


@dataclass
class ReleaseDetector:
    """One detector of the release's average, with what its evidence and views need.

    It shows the attributes ``/metrics`` and ``ReleaseGate.problems`` read of every
    detector (``statistic``, ``threshold``, ``samples``, ``finite``, ``sample_rate_hz``,
    ``to_json``): its wealth ``W``, and the wealth it would need to trip the release alone
    (the others at 1).
    """

    name: str
    scope: str
    test: str
    weight: float
    alpha: float
    process: EProcesses
    first_time: float | None = None
    last_time: float | None = None
    run_first_time: float | None = None
    last_m0: float | None = None
    total: float = 0.0
    run_total: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def log_wealth(self) -> float:
        return float(self.process.log_wealth[0])

    @property
    def statistic(self) -> float:
        return math.exp(min(self.log_wealth, 700.0))

    @property
    def threshold(self) -> float:
        return alone_threshold(self.weight, self.alpha)

    @property
    def samples(self) -> int:
        return int(self.process.samples[0])

    @property
    def run_samples(self) -> int:
        return int(self.process.run_samples[0]) if self.log_wealth > 0 else 0

    def finite(self) -> bool:
        return math.isfinite(self.log_wealth) and math.isfinite(self.total)

    def observe(self, x: float, m0: float, t: float, **extra: object) -> None:
        """One observation at sample time ``t`` (the process bets before it looks)."""
        was_positive = self.log_wealth > 0
        self.process.update(x, m0)
        if self.first_time is None:
            self.first_time = t
        if not was_positive:
            self.run_first_time = t
            self.run_total = 0.0
        self.last_time = t
        self.last_m0 = m0
        self.total += x
        self.run_total += x
        self.extra = extra

    def sample_rate_hz(self) -> float | None:
        if self.first_time is None or self.last_time is None:
            return None
        span = self.last_time - self.first_time
        return self.samples / span if span >= 1.0 else None

    def to_json(self) -> EProcessJson:
        n = self.samples
        run = self.run_samples
        return {
            "statistic": _r(self.statistic),
            "threshold": _r(self.threshold),
            "weight": round(self.weight, 6),
            "samples": n,
            "bets": int(self.process.bets[0]),
            "last_bet_fraction": float(self.process.last_fraction[0]),
            "mean": _r(self.total / n) if n else None,
            "null_mean": _r(self.last_m0),
            "run_samples": run,
            "run_mean": _r(self.run_total / run) if run else None,
            "max_statistic": _r(math.exp(min(float(self.process.max_log_wealth[0]), 700.0))),
        }


class ReleaseTest:
    """The release test of one ``ReleaseGate`` (one canary version): its detectors, their
    weighted average, the scopes' noise floors and the dependence rule.

    ``floors`` carries the floors' measurements over from the previous canary of the same
    stable version (they are frozen anew for this release).
    """

    def __init__(self, config: GateConfig, floors: Mapping[str, NoiseFloor] | None = None) -> None:
        self.config = config
        labels = config.labels
        self.tested = tested_scopes(labels, config.pool_tails)
        self.members = dict(drift_scopes(labels, config.pool_tails))
        self.focus = focus_scope(config.edges, config.pool_tails)
        self.weights = release_weights(config.edges, config.pool_tails, config.focus_weight)
        self.merge = ReleaseEProcess(self.weights, config.alpha, BetRule())
        self.detectors: dict[str, ReleaseDetector] = {}
        for name, weight in self.weights.items():
            scope, test = name.rsplit(":", 1)
            self.detectors[name] = ReleaseDetector(
                name, scope, test, weight, config.alpha, self.merge.detectors[name]
            )
        old = floors or {}
        self.floors: dict[str, NoiseFloor] = {
            scope: old[scope].unfrozen() if scope in old else self._empty_floor()
            for scope in self.members
        }
        self.thinning = SessionThinning(config.session_window_s)
        self.invalid_comparisons = 0

    def _empty_floor(self) -> NoiseFloor:
        cfg = self.config
        delta_each = cfg.floor_delta / floor_count(cfg.edges, cfg.pool_tails)
        return NoiseFloor.empty(
            cfg.floor_kl_clip, cfg.floor_top1_clip, delta_each, cfg.floor_min_samples
        )

    def drop_floors(self) -> None:
        """A new stable version: the replicas the floors measured are gone. The floors
        start over (too few comparisons: the clip); the detectors keep their wealth, as
        the release and its one test go on."""
        self.floors = {scope: self._empty_floor() for scope in self.members}

    # -- input -----------------------------------------------------------------------
    def add_noise(self, scopes: Iterable[str], kl: float, disagreement: float) -> None:
        """A valid baseline-baseline comparison (KL already clipped at ``kl_clip``)."""
        for scope in scopes:
            self.floors[scope].add(kl, disagreement)

    def admit(self, c: Comparison) -> bool:
        """The dependence rule (``SessionThinning``) for a baseline-canary comparison."""
        return self.thinning.admit(c.session or c.trace_id, c.time)

    def test_comparison(self, c: Comparison, scopes: Iterable[str]) -> None:
        """An admitted baseline-canary comparison: the drift detectors of every tested
        scope holding its bucket, and the paired latency detector of its bucket."""
        cfg = self.config
        invalid = c.invalid is not None
        self.invalid_comparisons += invalid
        kl = min(c.kl_mean, cfg.kl_clip)
        disagree = min(1.0, max(0.0, 1.0 - c.top1_agree))
        for scope in scopes:
            if scope not in self.tested:
                continue
            floor_kl, floor_top1, state = self.floors[scope].floors()
            m0_kl = floor_kl + cfg.kl_tolerance
            m0_top1 = floor_top1 + cfg.top1_tolerance
            x_kl = min(cfg.kl_clip, cfg.invalid_weight * m0_kl) if invalid else kl
            x_top1 = min(1.0, cfg.invalid_weight * m0_top1) if invalid else disagree
            floor = {"noise_floor_state": state, "invalid": c.invalid}
            self.detectors[detector_name(scope, "drift_kl")].observe(
                x_kl, m0_kl, c.time, noise_floor=floor_kl, tolerance=cfg.kl_tolerance, **floor
            )
            # m0 >= 1 would make an indicator's test blind: skip it, as the e-CUSUM does.
            if m0_top1 < 1.0:
                self.detectors[detector_name(scope, "drift_top1")].observe(
                    x_top1,
                    m0_top1,
                    c.time,
                    noise_floor=floor_top1,
                    tolerance=cfg.top1_tolerance,
                    **floor,
                )
        if c.ttft_a_s is not None and c.ttft_b_s is not None:
            slow = c.ttft_b_s > cfg.latency_ratio * c.ttft_a_s + cfg.latency_slack_s
            self.observe(c.bucket, "latency", 1.0 if slow else 0.0, 0.5, c.time, source="paired")

    def observe(
        self, bucket: str, test: str, x: float, m0: float, t: float, **extra: object
    ) -> None:
        """One latency or errors observation of ``bucket``."""
        self.detectors[detector_name(bucket, test)].observe(x, m0, t, **extra)

    # -- decision --------------------------------------------------------------------
    def tripped(self) -> bool:
        return bool(self.merge.tripped()[0])

    def statistic(self) -> float:
        return float(self.merge.value()[0])

    def decision(
        self,
        buckets: Mapping[str, BucketScope],
        canary_version: str | None,
        stable_version: str | None,
    ) -> TripRecord:
        """The trip's evidence (``tripped_at`` still 0): the merged statistic against
        ``1 / alpha``, named after the detector holding the largest share of it; the
        colours come from the gate's ``buckets``, the versions are the gate's."""
        cfg = self.config
        parts = self.merge.contributions()
        total = math.fsum(p.weighted for p in parts)
        top = self.detectors[parts[0].name]
        members = self.members[top.scope]
        bucket = self._strongest_member(top)
        kind = "comparison" if top.test.startswith("drift") else "outcome"
        if top.test == "errors":
            kind = "error"
        elif top.test == "latency" and top.extra.get("source") == "paired":
            kind = "comparison"
        first = top.run_first_time if top.run_first_time is not None else 0.0
        last = top.last_time if top.last_time is not None else first
        detail: dict[str, object] = {
            "method": "release e-process (weighted average of betting e-processes)",
            "alpha": cfg.alpha,
            "floor_delta": cfg.floor_delta,
            "false_trip_probability_per_release": cfg.alpha + cfg.floor_delta,
            "metric": METRICS[top.test],
            "scope": top.scope,
            "pooled_buckets": list(members),
            "detector": top.name,
            "weight": round(top.weight, 6),
            "wealth": _r(top.statistic),
            "alone_threshold": _r(top.threshold),
            "null_mean": _r(top.last_m0),
            "run_mean": _r(top.run_total / top.run_samples) if top.run_samples else None,
            "test_samples": top.samples,
            "contributions": [
                {
                    "detector": p.name,
                    "weight": round(p.weight, 6),
                    "wealth": _r(math.exp(min(p.log_wealth, 700.0))),
                    "share": _r(p.weighted / total) if total > 0 else None,
                }
                for p in parts[:MAX_CONTRIBUTIONS]
            ],
            "invalid_comparisons": self.invalid_comparisons,
            "canary_version": canary_version,
            "stable_version": stable_version,
            **top.extra,
        }
        return trip_record.trip_record(
            {
                "test": TRIP_TESTS[top.test],
                "bucket": bucket,
                "statistic": round(self.statistic(), 6),
                "threshold": 1.0 / cfg.alpha,
                "samples": top.run_samples,
                "first_sample_time": first,
                "last_sample_time": max(first, last),
                "tripped_at": 0.0,
                "detail": detail,
                "colours": trip_record.trip_colours(buckets, members, kind),
            }
        )

    def _strongest_member(self, top: ReleaseDetector) -> str:
        """The member bucket of ``top``'s scope whose own detector of the same test holds
        the most wealth (then the highest run mean)."""
        members = self.members[top.scope]
        if len(members) == 1:
            return members[0]

        def strength(label: str) -> tuple[float, float]:
            own = self.detectors[detector_name(label, top.test)]
            run = own.run_total / own.run_samples if own.run_samples else 0.0
            return (own.log_wealth, run)

        return max(members, key=strength)

    # -- reading ---------------------------------------------------------------------
    def view_detectors(self) -> Iterable[tuple[str, str, ReleaseDetector]]:
        """(scope, test, detector) in the order of ``ReleaseGate.detectors``."""
        for test in ("drift_kl", "drift_top1"):
            for scope in self.tested:
                yield scope, test, self.detectors[detector_name(scope, test)]
        for label in self.config.labels:
            for test in ("latency", "errors"):
                yield label, test, self.detectors[detector_name(label, test)]

    def floor_json(self, scope: str) -> ReleaseFloorJson:
        """A scope's floor in the keys of the default test's ``noise_floor`` (``source``:
        the scope itself once measured, ``fallback`` while it has too few comparisons)."""
        floor = self.floors[scope].to_json()
        too_few = floor["state"] == "too_few"
        return {
            **floor,
            "source": "fallback" if too_few else scope,
            "borrowed_from": "fallback" if too_few else None,
        }

    def to_json(self) -> ReleaseTestJson:
        cfg = self.config
        return {
            "test": "release-eprocess",
            "alpha": cfg.alpha,
            "floor_delta": cfg.floor_delta,
            "false_trip_probability_per_release": cfg.alpha + cfg.floor_delta,
            "statistic": _r(self.statistic()),
            "threshold": 1.0 / cfg.alpha,
            "focus_detector": detector_name(self.focus, "drift_kl"),
            "weights_by_test": {k: round(v, 6) for k, v in weights_by_test(self.weights).items()},
            "invalid_weight": cfg.invalid_weight,
            "invalid_comparisons": self.invalid_comparisons,
            "dependence": self.thinning.to_json(),
        }
