"""The tests one sample feeds, for a ``ReleaseGate`` (its detectors, windows and noise
floors live in its scopes, ``canarystack.gate.scopes``; the method is
``canarystack.gate.stats``).

With ``--test release-eprocess`` the same observations go to the release's one test
(``gate.release_test``, ``canarystack.gate.release_test``) instead of the e-CUSUMs, after
the dependence rule; the release trips when its weighted average reaches ``1 / alpha``.

This module must never do I/O or read a clock: callers pass ``now`` in.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any, Literal, Protocol

from canary_contract.broker import Release
from canarystack.gate.config import GateConfig
from canarystack.gate.release_test import ReleaseTest
from canarystack.gate.samples import Comparison, Outcome
from canarystack.gate.scopes import BucketScope, DriftScope, Ingested
from canarystack.gate.stats import ECusum, binomial_lower, binomial_upper, median


class Gate(Protocol):
    """What the tests of one sample read and write of a ``ReleaseGate``
    (``canarystack.gate.state``, which calls them from ``ingest``): its scopes and release
    test, the canary version it follows, the gate-blind counter and its decisions."""

    canary_version: str | None  # adopted from the samples while the broker is unheard
    baseline_since_canary: int

    @property
    def config(self) -> GateConfig: ...
    @property
    def release(self) -> Release | None: ...
    @property
    def buckets(self) -> Mapping[str, BucketScope]: ...
    @property
    def scopes_of(self) -> Mapping[str, list[DriftScope]]: ...
    @property
    def tested(self) -> Set[str]: ...
    @property
    def release_test(self) -> ReleaseTest | None: ...
    @property
    def noise_fallbacks(self) -> dict[tuple[str, str], int]: ...

    def noise_of(self, scope: DriftScope) -> tuple[float, float, str]: ...
    def saw_canary(self, now_mono: float) -> None: ...
    def decide_release(self) -> bool: ...
    def alarm(
        self,
        test: Literal["drift"],
        scope: DriftScope,
        det: ECusum,
        *,
        metric: str,
        noise: float,
        tolerance: float,
    ) -> None: ...
    def alarm_bucket(
        self, test: Literal["latency", "errors"], bucket: BucketScope, det: ECusum, **extra: Any
    ) -> None: ...


def comparison(gate: Gate, c: Comparison, got: Ingested, now_mono: float) -> None:
    """Count and test one comparison (a baseline-baseline one feeds the noise floor).

    drift/kl: the comparison's ``kl_mean`` (clipped at ``kl_clip``) against ``m0 = noise_kl
    + kl_tolerance``, where ``noise_kl`` is the mean + 2 SE of the last ``noise_window``
    baseline-baseline ``kl_mean`` values in the scope (falling back to all buckets, then to
    0 when fewer than ``noise_min_samples`` exist); drift/top1: ``1 - top1_agree`` against
    ``noise_top1 + top1_tolerance``; latency (paired): 1 when the canary's TTFT exceeds
    ``latency_ratio`` x the baseline's of the same prompt + slack, against ``m0 = 1/2``.
    Samples that name another canary version than the broker's are ignored (counted as
    ``other_canary_version``); a baseline-baseline comparison marked ``invalid`` never
    enters the noise floor. Several scopes may alarm on one comparison: the narrowest one
    says most.
    """
    cfg = gate.config
    bucket = gate.buckets[c.bucket]
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
        for scope in gate.scopes_of[c.bucket]:
            scope.noise_kl.add(kl)
            scope.noise_top1.add(disagree)
        if gate.release_test is not None:
            gate.release_test.add_noise((s.name for s in gate.scopes_of[c.bucket]), kl, disagree)
        return
    if c.version_b is not None:
        if gate.canary_version is None and gate.release is None:
            gate.canary_version = c.version_b  # broker not heard yet: follow samples
        elif c.version_b != gate.canary_version:
            got.ignore("other_canary_version")
            return
    rt = gate.release_test
    if rt is not None and not rt.admit(c):
        # The dependence rule: the canary serves, but this session was just tested.
        gate.saw_canary(now_mono)
        got.ignore("same_session")
        return
    got.comparisons += 1
    bucket.comparisons += 1
    bucket.keep_colour("comparison", c)
    gate.saw_canary(now_mono)
    for scope in gate.scopes_of[c.bucket]:
        scope.comparisons += 1
    if rt is not None:
        rt.test_comparison(c, (scope.name for scope in gate.scopes_of[c.bucket]))
        gate.decide_release()
        return
    alarms: list[tuple[int, float, DriftScope, ECusum, str, float, float]] = []
    for scope in gate.scopes_of[c.bucket]:
        if scope.name not in gate.tested:
            continue
        noise_kl, noise_top1, source = gate.noise_of(scope)
        if source != scope.name:
            key = (scope.name, source)
            gate.noise_fallbacks[key] = gate.noise_fallbacks.get(key, 0) + 1
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
        gate.alarm("drift", scope, det, metric=metric, noise=noise, tolerance=tolerance)
        return
    if c.ttft_a_s is not None and c.ttft_b_s is not None:
        slow = c.ttft_b_s > cfg.latency_ratio * c.ttft_a_s + cfg.latency_slack_s
        if bucket.latency.update(1.0 if slow else 0.0, 0.5, c.time):
            gate.alarm_bucket("latency", bucket, bucket.latency, source="paired_shadow")


def error_surge(gate: Gate, bucket: BucketScope, t: float, upper: float) -> bool:
    """Whether the baseline's errors of the last ``error_surge_s`` surge above ``upper``,
    its window's upper bound: the lower Clopper-Pearson bound of the recent rate is above it
    (a dependency both variants share is failing, and the window has not caught up). The
    canary's outcome is then not tested for errors (counted in ``error_surge_skips``): its
    errors are no evidence against it until the reference sees the incident too. Decided
    from baseline outcomes before the canary's, so the test stays valid (a skipped
    observation is a bet of zero)."""
    cfg = gate.config
    if cfg.error_surge_s <= 0:
        return False
    recent = bucket.baseline_errors.recent(t, cfg.error_surge_s)
    k = int(sum(recent))
    if binomial_lower(k, len(recent), cfg.error_ucb_delta) <= upper:
        return False
    bucket.error_surge_skips += 1
    return True


def outcome(gate: Gate, o: Outcome, got: Ingested, now_mono: float) -> None:
    """Count and test one outcome (a baseline one feeds the reference windows).

    latency: 1 when the canary's TTFT exceeds ``latency_ratio`` x the median of the last
    ``latency_reference_n`` baseline TTFTs of the same bucket within ``latency_window_s``
    seconds + slack, else 0, against ``m0 = 1/2`` (a slow router or broker slows both
    sides, and reaches that reference within a few baseline requests); errors: 1 for a
    canary outcome with an error, else 0, against ``m0`` = Clopper-Pearson upper bound
    (level ``1 - error_ucb_delta``) of the baseline's error rate in the same bucket over the
    last ``error_window_s`` seconds, + ``error_tolerance``.
    """
    cfg = gate.config
    bucket = gate.buckets[o.bucket]
    got.outcomes += 1
    bucket.outcomes[o.variant] += 1
    failed = o.error is not None
    if failed:
        bucket.errors_seen[o.variant] += 1
    if o.variant == "baseline":
        gate.baseline_since_canary += 1
        bucket.baseline_errors.add(o.time, 1.0 if failed else 0.0)
        if not failed and o.ttft_s is not None:
            bucket.baseline_ttft.add(o.time, o.ttft_s)
        return
    gate.saw_canary(now_mono)
    bucket.keep_colour("error" if failed else "outcome", o)
    ref_errors = bucket.baseline_errors.values(o.time)
    n_ref = len(ref_errors)
    k_ref = int(sum(ref_errors))
    upper = binomial_upper(k_ref, n_ref, cfg.error_ucb_delta)
    m0 = upper + cfg.error_tolerance
    surge = error_surge(gate, bucket, o.time, upper)
    tested = m0 < 1.0 and not surge
    rt = gate.release_test
    if rt is not None:
        if tested:
            rt.observe(
                o.bucket,
                "errors",
                1.0 if failed else 0.0,
                m0,
                o.time,
                baseline_errors=k_ref,
                baseline_outcomes=n_ref,
                tolerance=cfg.error_tolerance,
                error=o.error,
            )
            if gate.decide_release():
                return
    elif tested and bucket.errors.update(1.0 if failed else 0.0, m0, o.time):
        gate.alarm_bucket(
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
    if rt is not None:
        rt.observe(
            o.bucket,
            "latency",
            1.0 if slow else 0.0,
            0.5,
            o.time,
            source="outcomes",
            baseline_median_ttft_s=round(ref_median, 6),
            canary_ttft_s=o.ttft_s,
        )
        gate.decide_release()
        return
    if bucket.latency.update(1.0 if slow else 0.0, 0.5, o.time):
        gate.alarm_bucket(
            "latency",
            bucket,
            bucket.latency,
            source="outcomes",
            baseline_median_ttft_s=round(ref_median, 6),
            canary_ttft_s=o.ttft_s,
        )
