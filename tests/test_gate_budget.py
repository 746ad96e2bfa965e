"""The gate's per-release false-alarm budget and its noise floor across canaries (#14).

Pure state tests drive ``canarystack.gate.state`` directly; the service test runs a real
gate against a real broker and reads ``/v1/gate``, ``/v1/gate/<release>``, ``/metrics``
and the start-up log line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from canarystack.gate.__main__ import build_parser, config_from_args
from canarystack.gate.state import (
    DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR,
    GateConfig,
    ReleaseGate,
    SampleBatch,
    detector_counts,
    implied_budget,
    threshold_for_budget,
)
from tests.procs import Spawner
from tests.test_gate_service import batch as wire_batch
from tests.test_gate_service import comparison as wire_comparison
from tests.test_gate_service import gate_state, post, setup_stack
from tests.test_gate_stats import batch, comparison, release


def cli_config(*argv: str) -> GateConfig:
    return config_from_args(build_parser().parse_args(["--broker", "http://127.0.0.1:1", *argv]))


# ----------------------------------------------------------------------- arithmetic
def test_threshold_is_k_times_rate_times_an_hour_over_the_budget() -> None:
    # 28 detectors at 15 samples/s, 1512 false trips per release-hour: 54 each, and a
    # detector seeing 54,000 samples an hour needs A = 54,000 / 54 = 1000.
    assert threshold_for_budget(1512.0, 28, 15.0) == pytest.approx(1000.0)
    assert threshold_for_budget(1e-3, 28, 15.0) == pytest.approx(28 * 15 * 3600 / 1e-3)
    assert implied_budget([(28, 1000.0)], 15.0) == pytest.approx(1512.0)
    # Mixed thresholds: the union bound sums each test's share.
    assert implied_budget([(18, 1000.0), (10, 2000.0)], 15.0) == pytest.approx(18 * 54 + 10 * 27)


@pytest.mark.parametrize(
    ("budget", "rate", "fragment"),
    [
        (0.0, 15.0, "false_trips_per_release_hour must be > 0 and finite, got 0.0"),
        (math.inf, 15.0, "false_trips_per_release_hour must be > 0 and finite, got inf"),
        (1512.0, 0.0, "budget_sample_rate_hz must be > 0 and finite, got 0.0"),
        (1e9, 15.0, "per-detector threshold of 0.001512 (must be > 1)"),
    ],
)
def test_a_budget_the_tests_cannot_honour_is_refused(
    budget: float, rate: float, fragment: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        threshold_for_budget(budget, 28, rate)


@pytest.mark.parametrize(
    ("edges", "pool_tails"),
    [((512, 1024, 2048, 4096), True), ((512, 1024, 2048, 4096), False), ((1000,), True)],
)
def test_the_detector_count_is_the_detectors_the_gate_runs(
    edges: tuple[int, ...], pool_tails: bool
) -> None:
    cfg = GateConfig(edges=edges, pool_tails=pool_tails)
    running = list(ReleaseGate("default", cfg).detectors())
    counts = detector_counts(edges, pool_tails)
    assert sum(counts.values()) == len(running)
    for test, n in counts.items():
        assert sum(1 for _, t, _ in running if t == test) == n
    assert cfg.budget_json()["detectors"] == len(running)


def test_the_default_budget_is_what_todays_thresholds_imply() -> None:
    cfg = cli_config()
    assert (cfg.drift_threshold, cfg.latency_threshold, cfg.errors_threshold) == (1000.0,) * 3
    b = cfg.cusum_budget()
    assert cfg.budget_json() == b
    assert b["detectors"] == 28
    assert b["per_detector_threshold"] == 1000.0
    assert b["sample_rate_hz_assumed"] == 15.0
    assert b["false_trips_per_release_hour"] == pytest.approx(DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR)
    assert b["requested_false_trips_per_release_hour"] == DEFAULT_FALSE_TRIPS_PER_RELEASE_HOUR
    assert b["merge"].startswith("union bound")


def test_the_budget_flag_sets_every_threshold_and_an_explicit_one_wins() -> None:
    cfg = cli_config("--false-trips-per-release-hour", "0.001", "--budget-sample-rate-hz", "10")
    a = 28 * 10 * 3600 / 0.001
    assert cfg.drift_threshold == cfg.latency_threshold == cfg.errors_threshold == pytest.approx(a)
    assert cfg.cusum_budget()["false_trips_per_release_hour"] == pytest.approx(0.001)
    # Fewer buckets, fewer detectors, a lower threshold for the same budget.
    few = cli_config("--false-trips-per-release-hour", "0.001", "--bucket-edges", "1000")
    k = sum(detector_counts((1000,), True).values())
    assert few.drift_threshold == pytest.approx(k * 15 * 3600 / 0.001)
    # An explicit threshold overrides its test's share; the budget shown is what the
    # thresholds really guarantee.
    mixed = cli_config("--drift-threshold", "2000")
    assert mixed.drift_threshold == 2000.0 and mixed.latency_threshold == 1000.0
    shown = mixed.cusum_budget()
    assert shown["per_detector_threshold"] is None
    assert shown["false_trips_per_release_hour"] == pytest.approx(18 * 27 + 10 * 54)


def test_a_bad_budget_flag_is_named() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--broker", "http://x", "--false-trips-per-release-hour", "x"])
    with pytest.raises(ValueError, match=r"^--false-trips-per-release-hour must be > 0"):
        cli_config("--false-trips-per-release-hour", "-1")
    with pytest.raises(ValueError, match=r"^--budget-sample-rate-hz must be > 0"):
        cli_config("--budget-sample-rate-hz", "nan")


def test_false_alarms_within_n_samples_at_the_null_mean_respect_n_over_a() -> None:
    # The finite-horizon bound the budget rests on: P(alarm within n) <= n / A per
    # detector, for a stream exactly at the null mean (the worst case). 4000 streams of
    # Bernoulli(1/2) against m0 = 1/2 with A = 100: at most 40 % alarm within 40 samples.
    rng = np.random.default_rng(14)
    streams, n, a, f = 4000, 40, 100.0, 0.8
    x = rng.random((streams, n)) < 0.5
    log_m = np.zeros(streams)
    alarmed = np.zeros(streams, dtype=bool)
    for t in range(n):
        e = 1.0 + (f / 0.5) * (x[:, t] - 0.5)
        log_m = np.maximum(log_m, 0.0) + np.log(e)
        alarmed |= log_m >= math.log(a)
    assert 0 < alarmed.mean() <= n / a


# ---------------------------------------------------------------------- noise floor
def noise_batch(t0: float, bucket: str, kl: float, n: int) -> SampleBatch:
    return batch(
        [comparison(t0 + i * 0.01, bucket, kl, pair="baseline-baseline") for i in range(n)]
    )


def new_gate() -> ReleaseGate:
    g = ReleaseGate("default", GateConfig())
    g.on_release(release(), 0.0)
    return g


def test_the_noise_floor_survives_a_new_canary_version() -> None:
    g = new_gate()
    g.ingest(noise_batch(0.0, "2k-4k", 0.1, 100), 1.0, 1.0)
    before = g.noise_json()["2k-4k"]
    kl = before["kl"]
    assert before["source"] == "2k-4k" and kl is not None and kl >= 0.1
    g.on_release(release(version="v3"), 2.0)
    assert g.resets == 1 and g.canary_version == "v3"
    after = g.noise_json()["2k-4k"]
    assert after["samples"] == 100 and after["kl"] == before["kl"]
    # The new canary, as noisy as the replicas among themselves, is not drift.
    g.ingest(
        batch([comparison(3 + i * 0.01, "2k-4k", 0.1, version_b="v3") for i in range(500)]),
        3.0,
        3.0,
    )
    assert g.trip is None


def test_a_new_stable_version_drops_the_noise_floor() -> None:
    g = new_gate()
    g.ingest(noise_batch(0.0, "2k-4k", 0.1, 100), 1.0, 1.0)
    promoted = release(version="v3", stable="v2")
    g.on_release(promoted, 2.0)
    assert g.noise_json()["2k-4k"]["samples"] == 0
    # Same canary, new stable (no reset of the detectors): the floor goes all the same.
    g2 = new_gate()
    g2.ingest(noise_batch(0.0, "2k-4k", 0.1, 100), 1.0, 1.0)
    moved = release(stable="v1b")
    g2.on_release(moved, 2.0)
    assert g2.resets == 0 and g2.noise_json()["2k-4k"]["samples"] == 0


def test_a_sparse_bucket_says_whose_floor_it_borrows_and_counts_it() -> None:
    g = new_gate()
    # 100 noise comparisons in 2k-4k, 5 in 0-512 (fewer than noise_min_samples = 20).
    g.ingest(noise_batch(0.0, "2k-4k", 0.01, 100), 1.0, 1.0)
    g.ingest(noise_batch(2.0, "0-512", 0.01, 5), 1.0, 1.0)
    g.ingest(batch([comparison(3 + i * 0.01, "0-512", 0.005) for i in range(7)]), 2.0, 2.0)
    floor = g.noise_json()
    assert floor["0-512"]["borrowed_from"] == "all"
    assert floor["0-512"]["source"] == "all"
    assert floor["0-512"]["fallback_comparisons"] == 7
    assert floor["2k-4k"]["borrowed_from"] is None
    assert floor["2k-4k"]["fallback_comparisons"] == 0
    assert g.noise_fallbacks[("0-512", "all")] == 7
    # The 512+ tail (2k-4k's 100 are in it) has a floor of its own: not borrowed.
    assert floor["512+"]["borrowed_from"] is None
    # No noise anywhere: the floor is "none" (0), and that is counted too.
    g2 = new_gate()
    g2.ingest(batch([comparison(1.0, "4k+", 0.005)]), 1.0, 1.0)
    assert g2.noise_json()["4k+"]["borrowed_from"] == "none"
    assert g2.noise_fallbacks[("4k+", "none")] == 1


def test_the_gate_shows_its_observed_rate_against_the_assumed_one() -> None:
    g = ReleaseGate("default", GateConfig(budget_sample_rate_hz=50.0))
    g.on_release(release(), 0.0)
    # 100 comparisons over 9.9 s of sample time: ~10/s in the busiest detector.
    g.ingest(batch([comparison(i * 0.1, "4k+", 0.005) for i in range(100)]), 1.0, 1.0)
    b = g.to_json(1.0)["false_alarm_budget"]
    assert b["observed_max_sample_rate_hz"] == pytest.approx(100 / 9.9, rel=1e-3)
    assert dict(b)["within_assumed_rate"] is True
    fast = ReleaseGate("default", GateConfig(budget_sample_rate_hz=5.0))
    fast.on_release(release(), 0.0)
    fast.ingest(batch([comparison(i * 0.1, "4k+", 0.005) for i in range(100)]), 1.0, 1.0)
    assert dict(fast.to_json(1.0)["false_alarm_budget"])["within_assumed_rate"] is False


# ------------------------------------------------------------------- a real gate
def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_real_gate_shows_and_logs_its_budget_and_counts_borrowed_floors(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, _, gate = setup_stack(spawn, tmp_path, "--false-trips-per-release-hour", "0.5")
    expected_a = 28 * 15 * 3600 / 0.5
    one = gate_state(gate)["false_alarm_budget"]
    assert one["false_trips_per_release_hour"] == pytest.approx(0.5)
    assert one["detectors"] == 28
    assert one["per_detector_threshold"] == pytest.approx(expected_a)
    assert one["sample_rate_hz_assumed"] == 15.0
    listed: dict[str, Any] = requests.get(f"{gate.url}/v1/gate", timeout=5).json()
    assert listed["false_alarm_budget"]["per_detector_threshold"] == pytest.approx(expected_a)
    assert listed["gates"][0]["false_alarm_budget"]["detectors"] == 28
    started = [e for e in gate.log_events() if e.get("event") == "false_alarm_budget"]
    assert len(started) == 1
    assert started[0]["detectors"] == 28
    assert started[0]["per_detector_threshold"] == pytest.approx(expected_a)
    # A comparison in a bucket without noise of its own: the floor is borrowed ("none").
    r = post(gate, wire_batch([wire_comparison("4k+", 0.005) for _ in range(3)]))
    assert r.status_code == 200, r.text
    floor = gate_state(gate)["noise_floor"]["4k+"]
    assert floor["borrowed_from"] == "none" and floor["fallback_comparisons"] == 3
    text = requests.get(f"{gate.url}/metrics", timeout=5).text
    assert (
        metric(
            text,
            "canarystack_gate_noise_floor_fallbacks_total",
            release="default",
            scope="4k+",
            source="none",
        )
        == 3.0
    )
    assert metric(
        text, "canarystack_gate_false_trips_per_release_hour", release="default"
    ) == pytest.approx(0.5)
