"""The gate's sequential tests as pure classes: false alarms on long healthy streams,
detection on drifted ones, the latency and errors references, and the state rules.

Streams are simulated with seeded generators (numpy), so every figure here is
reproducible; nothing in this file starts a process or reads a clock.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from canary_contract.broker import Release
from canary_contract.phases import Phase
from canarystack.gate.state import GateConfig, ReleaseGate, SampleBatch, release_record
from canarystack.gate.stats import ECusum, MeanWindow, TimeWindow, binomial_upper, median


def run_lengths(xs: np.ndarray, m0: float, threshold: float, bet: float = 0.8) -> list[int]:
    """Samples between alarms (restarting the detector after each alarm)."""
    det = ECusum(threshold, bet, clip=1.0)
    runs, since = [], 0
    for i, x in enumerate(xs):
        since += 1
        if det.update(float(x), m0, float(i)):
            runs.append(since)
            since = 0
            det = ECusum(threshold, bet, clip=1.0)
    return runs


def test_false_alarms_at_the_null_boundary_respect_the_arl_bound() -> None:
    # The worst case the guarantee covers: every observation has mean exactly m0.
    # Bernoulli(0.5) is the latency test's null; exponential(m0) a KL-like null.
    rng = np.random.default_rng(1)
    n = 200_000
    for xs, m0 in (
        (rng.binomial(1, 0.5, n).astype(float), 0.5),
        (rng.exponential(0.02, n), 0.02),
    ):
        runs = run_lengths(xs, m0, threshold=100)
        # ARL >= A: at most n / A alarms on average; the e-CUSUM is conservative.
        assert len(runs) <= n / 100
        if runs:
            assert np.mean(runs) >= 100


def test_healthy_version_drift_never_trips_in_many_samples() -> None:
    # The simulator's healthy canary: per-comparison KL ~ 0.01 on average, right-skewed.
    rng = np.random.default_rng(2)
    kl = rng.gamma(shape=1.5, scale=0.01 / 1.5, size=300_000)
    assert abs(kl.mean() - 0.01) < 0.001
    assert run_lengths(kl, m0=0.02, threshold=GateConfig().drift_threshold) == []
    # And a healthy top-1 disagreement of ~15 % under the 30 % tolerance.
    flips = rng.binomial(1, 0.15, 300_000).astype(float)
    assert run_lengths(flips, m0=0.3, threshold=GateConfig().drift_threshold) == []


def test_drift_is_detected_within_a_few_samples_and_the_run_starts_at_the_change() -> None:
    rng = np.random.default_rng(3)
    delays = []
    for trial in range(200):
        det = ECusum(1000, 0.8, clip=1.0)
        healthy = rng.gamma(1.5, 0.01 / 1.5, 300)
        for i, x in enumerate(healthy):
            assert not det.update(float(x), 0.02, float(i)), f"false alarm in trial {trial}"
        drifted = rng.gamma(1.5, 0.15 / 1.5, 100)  # the faulty kernel at ~4k tokens
        for j, x in enumerate(drifted):
            if det.update(float(x), 0.02, 300.0 + j):
                delays.append(j + 1)
                # The run that alarmed began at (or just before) the change point.
                assert det.run_first_time is not None
                assert 295 <= det.run_first_time <= 300 + j
                assert det.run_samples == pytest.approx(300 + j + 1 - det.run_first_time)
                break
        else:
            pytest.fail(f"no alarm on a drifted stream in trial {trial}")
    assert np.median(delays) <= 8
    assert max(delays) <= 25


def test_an_outlier_moves_the_statistic_by_a_bounded_factor() -> None:
    det = ECusum(1000, 0.8, clip=1.0)
    det.update(50.0, 0.02, 0.0)  # clipped to 1.0
    assert det.statistic == pytest.approx(1 + 0.8 / 0.02 * (1.0 - 0.02))
    assert not det.alarmed
    # A tolerance above the clip makes the test blind: no observation can raise M.
    blind = ECusum(1000, 0.8, clip=1.0)
    for i in range(1000):
        assert not blind.update(1e9, 50.0, float(i))
    assert blind.statistic <= 1.0


def test_latency_sign_test_trips_on_a_slow_canary_and_not_on_noise() -> None:
    rng = np.random.default_rng(4)
    slow = rng.binomial(1, 0.9, 2000).astype(float)
    runs = run_lengths(slow, 0.5, 1000)
    assert len(runs) >= 20
    assert np.mean(runs) <= 60
    balanced = rng.binomial(1, 0.3, 100_000).astype(float)
    assert run_lengths(balanced, 0.5, 1000) == []


def test_detector_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="threshold must be > 1"):
        ECusum(1.0)
    with pytest.raises(ValueError, match="bet_fraction"):
        ECusum(100, 1.0)
    with pytest.raises(ValueError, match="m0 must be > 0"):
        ECusum(100).update(0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="observations must be >= 0"):
        ECusum(100).update(-0.1, 0.5, 0.0)


def test_references() -> None:
    # Clopper-Pearson: 0 errors in 100 -> about 4.5 % at 99 %; no data -> 1 (never blame).
    assert binomial_upper(0, 100, 0.01) == pytest.approx(1 - 0.01 ** (1 / 100), rel=1e-6)
    assert binomial_upper(0, 0, 0.01) == 1.0
    assert binomial_upper(5, 5, 0.01) == 1.0
    assert 0.1 < binomial_upper(10, 100, 0.01) < 0.2
    w = MeanWindow(3)
    for x in (1.0, 2.0, 3.0, 4.0):
        w.add(x)
    assert len(w) == 3
    assert w.mean() == pytest.approx(3.0)
    assert w.upper() == pytest.approx(3.0 + 2 * 1.0 / math.sqrt(3))
    tw = TimeWindow(10.0)
    for t in range(20):
        tw.add(float(t), float(t))
    assert tw.values(19.0) == [float(t) for t in range(9, 20)]
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


# ----------------------------------------------------------------------- ReleaseGate


def release(
    version: str = "v2", phase: str = "progressing", weight: float = 5, stable: str = "v1"
) -> Release:
    return release_record("default", 3, stable, version, weight, phase=Phase(phase))


def comparison(
    t: float,
    bucket: str,
    kl: float,
    *,
    pair: str = "baseline-canary",
    agree: float = 1.0,
    version_b: str = "v2",
    ttft: tuple[float, float] = (0.1, 0.1),
) -> dict[str, Any]:
    return {
        "time": t,
        "pair": pair,
        "bucket": bucket,
        "prompt_tokens": 3000,
        "positions": 4,
        "kl_mean": kl,
        "kl_first": kl,
        "top1_agree": agree,
        "ttft_a_s": ttft[0],
        "ttft_b_s": ttft[1],
        "version_a": "v1",
        "version_b": version_b if pair == "baseline-canary" else "v1",
        "request_id": f"r{t}",
    }


def outcome(t: float, variant: str, bucket: str, ttft: float | None, error: str | None = None):
    return {
        "time": t,
        "variant": variant,
        "bucket": bucket,
        "prompt_tokens": 100,
        "ttft_s": ttft,
        "error": error,
        "request_id": f"o{t}{variant}",
    }


def batch(comparisons=(), outcomes=()) -> SampleBatch:
    return SampleBatch.model_validate(
        {
            "router_id": "r0",
            "release": "default",
            "comparisons": list(comparisons),
            "outcomes": list(outcomes),
        }
    )


def gate(**cfg: Any) -> ReleaseGate:
    g = ReleaseGate("default", GateConfig(**cfg))
    g.on_release(release(), 0.0)
    return g


def test_gate_trips_on_long_prompt_drift_and_names_a_long_bucket() -> None:
    rng = np.random.default_rng(5)
    g = gate()
    t = 0.0
    healthy = []
    for b in ("0-512", "1k-2k", "2k-4k", "4k+"):
        for _ in range(200):
            t += 0.01
            healthy.append(comparison(t, b, float(rng.gamma(1.5, 0.01 / 1.5))))
    g.ingest(batch(healthy), 1.0, 1.0)
    assert g.trip is None and g.state(1.0) == "watching"
    fault_time = t
    drifted = []
    for i in range(60):
        t += 0.01
        b = ("0-512", "2k-4k", "4k+")[i % 3]
        kl = 0.01 if b == "0-512" else float(rng.gamma(1.5, 0.15 / 1.5))
        drifted.append(comparison(t, b, kl))
    g.ingest(batch(drifted), 2.0, 2.0)
    assert g.trip is not None
    ev = g.trip
    assert ev["test"] == "drift"
    assert ev["bucket"] in ("2k-4k", "4k+")
    assert ev["detail"]["metric"] == "kl_mean"
    assert ev["bucket"] in ev["detail"]["pooled_buckets"]
    assert ev["statistic"] >= ev["threshold"] == 1000
    assert ev["first_sample_time"] >= fault_time - 0.05
    assert ev["last_sample_time"] >= ev["first_sample_time"]
    assert ev["samples"] >= 2
    assert g.state(2.0) == "tripped"
    # After the decision, samples are not tested any more.
    got = g.ingest(batch([comparison(t + 1, "4k+", 0.5)]), 3.0, 3.0)
    assert got.ignored == {"after_trip": 1}


def test_noise_floor_raises_the_drift_threshold() -> None:
    # Replicas that disagree by KL 0.1 among themselves: a canary at 0.1 is not drift.
    g = gate()
    bb = [comparison(i * 0.01, "2k-4k", 0.1, pair="baseline-baseline") for i in range(100)]
    bc = [comparison(1 + i * 0.01, "2k-4k", 0.1) for i in range(500)]
    g.ingest(batch(bb), 1.0, 1.0)
    g.ingest(batch(bc), 2.0, 2.0)
    assert g.trip is None
    floor = g.noise_json()["2k-4k"]
    assert floor["source"] == "2k-4k"
    kl = floor["kl"]
    assert kl is not None and kl >= 0.1
    # Without the floor (fresh gate), the same canary stream trips.
    g2 = gate()
    g2.ingest(batch(bc), 2.0, 2.0)
    assert g2.trip is not None


def lone_canary(
    n: int,
    bucket: str,
    baseline_ttft: float,
    *,
    canary_ttft: float | None,
    canary_error: str | None = None,
) -> list[dict[str, Any]]:
    """``n`` healthy baseline outcomes 10 ms apart in ``bucket``, and one canary outcome
    (its own TTFT and error) after every tenth."""
    outs = []
    for i in range(n):
        t = i * 0.01
        outs.append(outcome(t, "baseline", bucket, baseline_ttft))
        if i % 10 == 0:
            outs.append(outcome(t + 0.001, "canary", bucket, canary_ttft, canary_error))
    return outs


def test_relative_latency_and_errors_ignore_what_hurts_both_variants() -> None:
    g = gate()
    outs = []
    for i in range(2000):
        t = i * 0.01
        # A slow router (or a killed baseline replica): everything 0.5 s slower and 30 %
        # errors after t = 5 s, on both variants.
        slow = t > 5
        ttft = 0.5 if slow else 0.03
        err = "http_5xx" if slow and i % 3 == 0 else None
        outs.append(outcome(t, "baseline", "0-512", None if err else ttft, err))
        if i % 10 == 0:
            outs.append(outcome(t + 0.001, "canary", "0-512", None if err else ttft, err))
    g.ingest(batch(outcomes=outs), 1.0, 1.0)
    assert g.trip is None, g.trip
    # A canary that alone errors trips the errors test in its bucket.
    g2 = gate()
    outs2 = lone_canary(2000, "0-512", 0.03, canary_ttft=None, canary_error="http_5xx")
    g2.ingest(batch(outcomes=outs2), 1.0, 1.0)
    assert g2.trip is not None
    assert g2.trip["test"] == "errors"
    assert g2.trip["bucket"] == "0-512"
    # And a canary that alone is 3x slower trips the latency test.
    g3 = gate()
    outs3 = lone_canary(3000, "512-1k", 0.06, canary_ttft=0.2)
    g3.ingest(batch(outcomes=outs3), 1.0, 1.0)
    assert g3.trip is not None
    assert g3.trip["test"] == "latency"
    assert g3.trip["bucket"] == "512-1k"


def test_paired_shadow_latency_trips_only_on_a_slower_canary() -> None:
    g = gate()
    same = [comparison(i * 0.1, "1k-2k", 0.005, ttft=(0.3, 0.31)) for i in range(500)]
    g.ingest(batch(same), 1.0, 1.0)
    assert g.trip is None
    slower = [comparison(60 + i * 0.1, "1k-2k", 0.005, ttft=(0.1, 0.4)) for i in range(100)]
    g.ingest(batch(slower), 2.0, 2.0)
    assert g.trip is not None and g.trip["test"] == "latency"
    assert g.trip["detail"]["source"] == "paired_shadow"


def test_new_canary_version_resets_and_other_versions_are_ignored() -> None:
    g = gate()
    g.ingest(batch([comparison(1.0, "4k+", 0.03) for _ in range(3)]), 1.0, 1.0)
    assert g.drift["4k+"].kl.samples == 3
    got = g.ingest(batch([comparison(2.0, "4k+", 0.03, version_b="v9")]), 1.0, 1.0)
    assert got.ignored == {"other_canary_version": 1}
    g.on_release(release(version="v3"), 5.0)
    assert g.canary_version == "v3"
    assert g.drift["4k+"].kl.samples == 0
    assert g.resets == 1


def test_no_trip_unless_progressing_and_inconclusive_without_data() -> None:
    g = gate(no_data_timeout_s=10)
    g.on_release(release(phase="rolled_back", weight=0), 0.0)
    got = g.ingest(batch([comparison(1.0, "4k+", 0.9) for _ in range(50)]), 1.0, 1.0)
    assert got.ignored == {"phase_rolled_back": 50}
    assert g.trip is None
    assert g.state(1.0) == "tripped"  # the broker keeps the canary off
    g = gate(no_data_timeout_s=10)
    assert g.state(5.0) == "watching"
    assert g.state(10.5) == "inconclusive"
    g.ingest(batch(outcomes=[outcome(1.0, "canary", "0-512", 0.03)]), 11.0, 11.0)
    assert g.state(12.0) == "watching"
    assert g.state(21.5) == "inconclusive"
    # Weight 0: no traffic is expected, so no data is not inconclusive.
    g.on_release(release(weight=0), 22.0)
    assert g.state(100.0) == "watching"


def test_config_rejects_values_the_tests_cannot_honour() -> None:
    with pytest.raises(ValueError, match="kl_tolerance must be > 0"):
        GateConfig(kl_tolerance=0)
    with pytest.raises(ValueError, match="drift_bet must be in"):
        GateConfig(drift_bet=1.0)
