"""One anytime-valid test per release (``--test release-eprocess``, issue #26): the
e-process algebra, the noise floor's confidence sequence, the dependence rule and the
weight of invalid answers, on the pure classes; and a real gate that states its alpha and
delta in ``/v1/gate``, ``/metrics`` and its start-up log.

Streams are simulated with seeded generators (numpy), so every figure is reproducible.
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
from canarystack.gate.eprocess import (
    DEFAULT_BET_FRACTIONS,
    BetRule,
    EProcesses,
    ReleaseEProcess,
    alone_threshold,
)
from canarystack.gate.floor import NoiseFloor, UpperConfidenceSequence
from canarystack.gate.release_weights import focus_scope, release_weights, weights_by_test
from canarystack.gate.sessions import SessionThinning
from canarystack.gate.state import GateConfig, ReleaseGate
from tests.procs import Spawner
from tests.test_gate_service import batch as wire_batch
from tests.test_gate_service import comparison as wire_comparison
from tests.test_gate_service import gate_state, post, setup_stack
from tests.test_gate_stats import batch, comparison, outcome, release

RELEASE = "release-eprocess"


def healthy_kl(rng: np.random.Generator, n: int, mean: float = 0.001) -> np.ndarray:
    """Right-skewed per-comparison KL like the simulator's healthy canary."""
    return rng.gamma(1.5, mean / 1.5, n)


# ----------------------------------------------------------------------- the algebra
def test_the_bet_is_chosen_before_the_observation_is_seen() -> None:
    rng = np.random.default_rng(1)
    a, b = EProcesses(1), EProcesses(1)
    for x in rng.gamma(1.5, 2.0 / 1.5, 30):  # a faulty past: bets are on
        a.update(float(x), 1.0)
        b.update(float(x), 1.0)
    f = float(a.fractions()[0])
    assert f > 0 and f == float(b.fractions()[0])
    # Whatever comes next, the bet on it is the one chosen from the past.
    for proc, x in ((a, 0.0), (b, 40.0)):
        step = float(proc.update(x, 1.0)[0])
        assert float(proc.last_fraction[0]) == f
        assert step == pytest.approx(math.log1p(f * (x - 1.0)))


def test_wealth_stays_positive_and_each_factor_is_bounded_below() -> None:
    rng = np.random.default_rng(2)
    proc = EProcesses(200)
    worst = math.log1p(-max(DEFAULT_BET_FRACTIONS))
    for _ in range(500):
        # Bursts far above the null mean, then zeros: the bets are high when it hurts.
        x = np.where(rng.random(200) < 0.5, rng.uniform(0, 50, 200), 0.0)
        step = proc.update(x, 1.0)
        assert np.all(step >= worst - 1e-12)
        assert np.all(np.isfinite(proc.log_wealth))  # log W finite: W > 0
    assert np.all(proc.log_wealth < proc.max_log_wealth + 1e-12)


def test_a_healthy_stream_never_moves_the_wealth() -> None:
    # A healthy canary at a tenth of the null mean: no bet is ever placed, so an hour of
    # it (and any other length) costs nothing, and leaves nothing to recover from.
    rng = np.random.default_rng(3)
    proc = EProcesses(10)
    for _ in range(5000):
        proc.update(healthy_kl(rng, 10, mean=0.1), 1.0)
    assert np.all(proc.bets == 0)
    assert np.all(proc.log_wealth == 0.0)
    assert np.all(proc.samples == 5000)


def test_the_merge_trips_exactly_at_one_over_alpha() -> None:
    merge = ReleaseEProcess({"a": 0.25, "b": 0.75}, alpha=0.01, n=3)
    # M = 0.25 W_a + 0.75 W_b; with W_b = 1: M = 1/alpha at W_a = (100 - 0.75) / 0.25.
    w_a = alone_threshold(0.25, 0.01)
    assert w_a == pytest.approx(397.0)
    merge.detectors["a"].log_wealth[:] = np.log([w_a * (1 - 1e-9), w_a, w_a * (1 + 1e-9)])
    assert merge.value() == pytest.approx([100.0, 100.0, 100.0])
    assert merge.tripped().tolist() == [False, True, True]
    # The threshold is 1/alpha however the evidence is spread over the detectors.
    merge.detectors["a"].log_wealth[:] = math.log(100.0)
    merge.detectors["b"].log_wealth[:] = np.log([100.0 * (1 - 1e-9), 100.0, 101.0])
    assert merge.tripped().tolist() == [False, True, True]


def test_weights_must_be_a_distribution() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        ReleaseEProcess({"a": 0.5, "b": 0.6}, alpha=0.01)
    with pytest.raises(ValueError, match="> 0"):
        ReleaseEProcess({"a": 1.0, "b": 0.0}, alpha=0.01)
    with pytest.raises(ValueError, match="alpha"):
        ReleaseEProcess({"a": 1.0}, alpha=1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        BetRule((0.5, 0.2))
    with pytest.raises(ValueError, match="m0 must be > 0"):
        EProcesses(1).update(0.1, 0.0)


def test_false_trips_at_the_null_boundary_stay_below_alpha() -> None:
    # Every detector exactly at its null mean (the worst case the guarantee covers):
    # Bernoulli(1/2) latency and exponential KL, many releases of 2,000 samples each.
    rng = np.random.default_rng(4)
    alpha, n = 0.05, 4000
    merge = ReleaseEProcess({"latency": 0.5, "kl": 0.5}, alpha=alpha, n=n)
    ever = np.zeros(n, dtype=bool)
    for _ in range(2000):
        merge.detectors["latency"].update(rng.binomial(1, 0.5, n).astype(float), 0.5)
        merge.detectors["kl"].update(rng.exponential(0.02, n), 0.02)
        ever |= merge.tripped()
    assert ever.mean() <= alpha


def test_the_default_weights_give_the_long_prompt_kl_scope_most_power() -> None:
    cfg = GateConfig()
    weights = release_weights(cfg.edges, cfg.pool_tails)
    assert focus_scope(cfg.edges, cfg.pool_tails) == "2k+"
    assert math.fsum(weights.values()) == pytest.approx(1.0)
    assert len(weights) == 28
    assert weights["2k+:drift_kl"] == pytest.approx(0.4)
    assert max(weights, key=lambda k: weights[k]) == "2k+:drift_kl"
    by_test = weights_by_test(weights)
    assert by_test == pytest.approx(
        {"drift_kl": 0.6, "drift_top1": 0.1, "latency": 0.15, "errors": 0.15}
    )
    # Without tail pooling the longest bucket is the focus.
    assert focus_scope(cfg.edges, False) == "4k+"
    assert "all:drift_kl" not in release_weights(cfg.edges, False)


# ----------------------------------------------------------------------- the floor
def test_the_confidence_sequence_covers_at_every_moment() -> None:
    rng = np.random.default_rng(5)
    n, delta, mean = 3000, 0.05, 0.004
    cs = UpperConfidenceSequence(0.02, delta, n=n)
    missed = np.zeros(n, dtype=bool)
    previous = cs.bound().copy()
    for _ in range(400):
        cs.add(healthy_kl(rng, n, mean))
        bound = cs.bound()
        assert np.all(bound <= previous + 1e-15)  # a running minimum never rises
        previous = bound.copy()
        missed |= bound < mean
    assert missed.mean() <= delta
    assert float(np.median(cs.bound())) < 3 * mean  # and it does tighten


def test_a_scope_with_too_few_comparisons_falls_back_to_the_clip_never_zero() -> None:
    floor = NoiseFloor.empty(0.02, 0.25, 1e-5, min_samples=50)
    assert floor.floors() == (0.02, 0.25, "too_few")
    for _ in range(49):
        floor.add(0.0, 0.0)  # bit-identical replicas
    kl, top1, state = floor.floors()
    assert (kl, top1, state) == (0.02, 0.25, "too_few")
    shown = floor.to_json()
    assert shown["state"] == "too_few" and shown["fallback_comparisons"] == 2
    floor.add(0.0, 0.0)
    kl, top1, state = floor.floors()
    assert state == "frozen"
    assert 0 < kl < 0.02 and 0 < top1 < 0.25  # never 0, even from exact zeros
    # Frozen for the release: later comparisons do not move it.
    for _ in range(500):
        floor.add(0.0, 0.0)
    assert floor.floors() == (kl, top1, "frozen")
    # The next release freezes anew, from everything measured.
    again = floor.unfrozen().floors()
    assert again[2] == "frozen" and again[0] < kl


# ----------------------------------------------------------------------- the gate
def release_gate(**over: Any) -> ReleaseGate:
    g = ReleaseGate("default", GateConfig(test=RELEASE, **over))
    g.on_release(release(), 0.0)
    return g


def ingest_all(g: ReleaseGate, comps: list[dict[str, Any]]) -> None:
    """In router-sized batches."""
    for start in range(0, len(comps), 500):
        g.ingest(batch(comps[start : start + 500]), 2.0, 2.0)


def measure_floor(g: ReleaseGate, rng: np.random.Generator, t: float = 0.0) -> float:
    """Enough baseline-baseline comparisons in every bucket to measure each floor."""
    bb = []
    for i in range(1500):
        t += 0.01
        bucket = ("0-512", "512-1k", "1k-2k", "2k-4k", "4k+")[i % 5]
        bb.append(comparison(t, bucket, float(healthy_kl(rng, 1)[0]), pair="baseline-baseline"))
    g.ingest(batch(bb), 1.0, 1.0)
    return t


def test_a_release_gate_trips_on_long_prompt_drift_at_one_over_alpha() -> None:
    rng = np.random.default_rng(6)
    g = release_gate()
    t = measure_floor(g, rng)
    healthy = []
    for i in range(3000):
        t += 0.01
        healthy.append(comparison(t, ("0-512", "2k-4k", "4k+")[i % 3], 0.001))
    g.ingest(batch(healthy), 2.0, 2.0)
    rt = g.release_test
    assert rt is not None and g.trip is None
    assert rt.statistic() == pytest.approx(1.0)
    assert rt.floor_json("2k+")["state"] == "frozen"
    seen = []
    for i in range(100):
        t += 0.01
        kl = float(rng.gamma(1.5, 0.12 / 1.5))
        g.ingest(batch([comparison(t, ("2k-4k", "4k+")[i % 2], kl)]), 3.0, 3.0)
        seen.append(rt.statistic())
        if g.trip is not None:
            break
    assert g.trip is not None, "no trip on a drifted long-prompt stream"
    assert all(s < 1000.0 for s in seen[:-1]) and seen[-1] >= 1000.0
    ev = g.trip
    assert ev["test"] == "drift" and ev["bucket"] in ("2k-4k", "4k+")
    assert ev["threshold"] == 1000.0 and ev["statistic"] >= 1000.0
    assert ev["detail"]["alpha"] == 1e-3 and ev["detail"]["floor_delta"] == 1e-4
    assert ev["detail"]["contributions"][0]["detector"] == "2k+:drift_kl"
    assert ev["detail"]["noise_floor_state"] == "frozen"
    assert len(seen) <= 30


def test_a_fault_that_starts_late_is_caught_as_fast_as_an_early_one() -> None:
    def samples_to_trip(healthy_n: int) -> int:
        rng = np.random.default_rng(7)
        g = release_gate()
        t = measure_floor(g, rng)
        comps = [
            comparison(t + 0.01 * i, "4k+", float(x))
            for i, x in enumerate(healthy_kl(rng, healthy_n))
        ]
        ingest_all(g, comps)
        t += 0.01 * healthy_n
        for i in range(200):
            g.ingest(batch([comparison(t + 0.01 * i, "4k+", 0.15)]), 3.0, 3.0)
            if g.trip is not None:
                return i + 1
        raise AssertionError("no trip")

    assert samples_to_trip(5_000) == samples_to_trip(10)


def test_a_new_canary_starts_a_new_test_and_a_new_stable_new_floors() -> None:
    rng = np.random.default_rng(11)
    g = release_gate()
    t = measure_floor(g, rng)
    drifted = [comparison(t + 0.01 * i, "4k+", 0.06) for i in range(4)]
    g.ingest(batch(drifted), 2.0, 2.0)
    rt = g.release_test
    assert rt is not None and g.trip is None
    wealth = rt.detectors["2k+:drift_kl"].log_wealth
    assert wealth > 0 and rt.floors["2k+"].frozen_kl is not None
    # A new stable version under the same canary: the floors start over, the test goes on.
    moved = release(stable="v1-patch")
    g.on_release(moved, 3.0)
    assert g.release_test is rt and rt.detectors["2k+:drift_kl"].log_wealth == wealth
    assert rt.floor_json("2k+")["state"] == "too_few"
    # A new canary: a new release and a fresh test, the floors' measurements kept.
    t = measure_floor(g, rng, t + 1.0)
    g.on_release(release(version="v3", stable="v1-patch"), 4.0)
    fresh = g.release_test
    assert fresh is not None and fresh is not rt
    assert fresh.detectors["2k+:drift_kl"].log_wealth == 0.0
    assert fresh.floor_json("2k+")["state"] == "measured"  # frozen at its first comparison
    assert fresh.floors["2k+"].samples == rt.floors["2k+"].samples


def test_one_invalid_answer_moves_nothing_and_a_sporadic_rate_never_trips() -> None:
    rng = np.random.default_rng(8)
    g = release_gate()
    t = measure_floor(g, rng)
    rt = g.release_test
    assert rt is not None
    comps = [comparison(t + 0.01 * i, "4k+", float(x)) for i, x in enumerate(healthy_kl(rng, 50))]
    g.ingest(batch(comps), 2.0, 2.0)
    before = {k: d.log_wealth for k, d in rt.detectors.items()}
    broken = comparison(t + 1.0, "4k+", 30.0, agree=0.0)
    broken["invalid"] = "nan_logprobs"
    g.ingest(batch([broken]), 2.0, 2.0)
    assert {k: d.log_wealth for k, d in rt.detectors.items()} == before
    # 1 % of answers invalid for 6,000 healthy comparisons: no trip.
    t += 2.0
    comps = []
    for i, x in enumerate(healthy_kl(rng, 6_000)):
        c = comparison(t + 0.01 * i, ("2k-4k", "4k+")[i % 2], float(x))
        if rng.random() < 0.01:
            c.update(kl_mean=30.0, top1_agree=0.0, invalid="nan_logprobs")
        comps.append(c)
    ingest_all(g, comps)
    assert g.trip is None
    assert rt.invalid_comparisons > 30


def test_a_broken_canary_whose_every_answer_is_invalid_trips_quickly() -> None:
    rng = np.random.default_rng(9)
    g = release_gate()
    t = measure_floor(g, rng)
    for i in range(100):
        c = comparison(t + 0.01 * i, ("2k-4k", "4k+", "0-512")[i % 3], 30.0, agree=0.0)
        c["invalid"] = "garbage_text"
        g.ingest(batch([c]), 2.0, 2.0)
        if g.trip is not None:
            break
    assert g.trip is not None and g.trip["test"] == "drift"
    assert i + 1 <= 15
    # Each invalid answer counted at invalid_weight x the null mean, not at the clip.
    det = g.release_test.detectors["2k+:drift_kl"] if g.release_test else None
    assert det is not None and det.last_m0 is not None
    assert det.run_total / det.run_samples == pytest.approx(3.0 * det.last_m0)


def test_one_comparison_per_session_every_window_enters_the_test() -> None:
    rule = SessionThinning(window_s=5.0)
    assert [rule.admit("s1", t) for t in (0.0, 1.0, 4.9, 5.0, 5.1, 10.0)] == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert rule.admit("s2", 1.0) and rule.admit(None, 1.0) and rule.admit(None, 1.0)
    assert (rule.admitted, rule.thinned, rule.without_key) == (6, 3, 2)
    small = SessionThinning(window_s=100.0, max_keys=3)
    for i in range(10):
        small.admit(f"k{i}", float(i))
    assert len(small._last) == 3 and small.forgotten == 7
    # In the gate: a session's burst of alike comparisons is tested once per window.
    rng = np.random.default_rng(10)
    g = release_gate()
    t = measure_floor(g, rng)
    burst = [comparison(t + 0.1 * i, "4k+", 0.2) for i in range(40)]
    for c in burst:
        c["session"] = "user-7"
    got = g.ingest(batch(burst), 2.0, 2.0)
    assert got.comparisons == 1 and got.ignored == {"same_session": 39}
    assert g.trip is None
    # The trace id stands in when there is no session key.
    traced = [comparison(t + 10 + 0.1 * i, "4k+", 0.001) for i in range(3)]
    for c in traced:
        c["trace_id"] = "0af7651916cd43dd8448eb211c80319c"
    assert g.ingest(batch(traced), 3.0, 3.0).comparisons == 1


def test_outcomes_feed_the_latency_and_errors_detectors_of_the_release() -> None:
    g = release_gate()
    outs = []
    for i in range(3000):
        ti = i * 0.01
        outs.append(outcome(ti, "baseline", "0-512", 0.03))
        if i % 10 == 0:
            outs.append(outcome(ti + 0.001, "canary", "0-512", None, "http_5xx"))
    g.ingest(batch(outcomes=outs), 1.0, 1.0)
    assert g.trip is not None and g.trip["test"] == "errors"
    assert g.trip["bucket"] == "0-512" and g.trip["threshold"] == 1000.0
    baseline_outcomes = g.trip["detail"]["baseline_outcomes"]
    assert isinstance(baseline_outcomes, int) and baseline_outcomes > 0


def test_the_cli_selects_the_test_and_refuses_what_it_cannot_honour() -> None:
    def cli(*argv: str) -> GateConfig:
        args = build_parser().parse_args(["--broker", "http://127.0.0.1:1", *argv])
        return config_from_args(args)

    assert cli().test == "cusum" and not cli().release_test
    cfg = cli("--test", RELEASE, "--alpha", "0.01", "--floor-delta", "0.001")
    assert cfg.release_test and cfg.alpha == 0.01 and cfg.floor_delta == 0.001
    budget = cfg.release_budget()
    assert cfg.budget_json() == budget
    assert budget["false_trip_probability_per_release"] == pytest.approx(0.011)
    assert budget["noise_floor"]["delta_each"] == pytest.approx(0.001 / 18)
    with pytest.raises(ValueError, match=re.escape("--alpha must be in (0, 1), got 2.0")):
        cli("--test", RELEASE, "--alpha", "2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--broker", "http://x", "--test", "bogus"])


# ----------------------------------------------------------------------- a real gate
def test_a_real_gate_states_alpha_and_delta(spawn: Spawner, tmp_path: Path) -> None:
    _, _, gate = setup_stack(spawn, tmp_path, "--test", RELEASE, "--alpha", "0.002")
    listed: dict[str, Any] = requests.get(f"{gate.url}/v1/gate", timeout=5).json()
    budget = listed["false_alarm_budget"]
    assert budget["test"] == RELEASE
    assert budget["alpha"] == 0.002 and budget["floor_delta"] == 1e-4
    assert budget["false_trip_probability_per_release"] == pytest.approx(0.0021)
    assert budget["weights"]["2k+:drift_kl"] == pytest.approx(0.4)
    one = gate_state(gate)
    assert one["test"] == RELEASE
    assert one["release_test"]["alpha"] == 0.002 and one["release_test"]["threshold"] == 500.0
    assert one["noise_floor"]["4k+"]["state"] == "too_few"
    started = [e for e in gate.log_events() if e.get("event") == "release_test"]
    assert len(started) == 1
    assert started[0]["alpha"] == 0.002 and started[0]["floor_delta"] == 1e-4
    # A healthy comparison is tested (against the fallback floor) and moves nothing.
    r = post(gate, wire_batch([wire_comparison("4k+", 0.001) for _ in range(3)]))
    assert r.status_code == 200 and r.json()["state"] == "watching", r.text
    one = gate_state(gate)
    assert one["buckets"]["4k+"]["drift"]["kl"]["statistic"] == 1.0
    assert one["noise_floor"]["4k+"]["fallback_comparisons"] == 3
    text = requests.get(f"{gate.url}/metrics", timeout=5).text
    assert 'canarystack_gate_false_trip_probability_per_release{release="default"} 0.0021' in text
    assert 'canarystack_gate_release_statistic{release="default"} 1.0' in text
