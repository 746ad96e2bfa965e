"""The gate's pure state against hostile or broken input (issue #12, items 6 and 7).

A crafted batch must not poison the statistics for good, a refused batch must change
nothing, a resent batch must count once, and an abandoned trip must not read as tripped.
Nothing here starts a process or reads a clock (the HTTP side is test_gate_hostile.py).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from canary_contract import strictjson
from canarystack.gate.state import (
    BATCH_IDS_PER_ROUTER,
    MAX_BATCH_ITEMS,
    BatchRefused,
    GateConfig,
    ReleaseGate,
    SampleBatch,
    TripStatus,
)
from canarystack.gate.stats import ECusum, MeanWindow
from tests.test_gate_stats import comparison, outcome, release


def batch(comparisons=(), outcomes=(), **over: Any) -> SampleBatch:
    body: dict[str, Any] = {
        "router_id": "r0",
        "release": "default",
        "comparisons": list(comparisons),
        "outcomes": list(outcomes),
    }
    body.update(over)
    return SampleBatch.model_validate(body)


def gate(**cfg: Any) -> ReleaseGate:
    g = ReleaseGate("default", GateConfig(**cfg))
    g.on_release(release(), 0.0)
    return g


def noise(t: float, kl: float, bucket: str = "4k+") -> dict[str, Any]:
    return comparison(t, bucket, kl, pair="baseline-baseline")


# ------------------------------------------------------------------ the noise floor
def test_a_huge_noise_sample_cannot_make_the_floor_negative_or_break_later_batches() -> None:
    # The attack found against a real gate: 1e308 swallows the next values' precision,
    # and once it leaves the window the running sum goes negative -> m0 < 0 -> every
    # later baseline-canary comparison raised (HTTP 500 on every batch).
    g = gate()
    crafted = [noise(0.0, 1e308)]
    crafted += [noise(0.001 * i, 1.0) for i in range(1, 500)]
    crafted += [noise(1.0 + 0.001 * i, 0.0) for i in range(500)]
    g.ingest(batch(crafted), 1.0, 1.0)
    floor = g.noise_json()["4k+"]
    # The window now holds 500 zeros: the floor is exactly 0, neither negative nor inf.
    assert floor["kl"] == 0.0 and floor["kl_mean"] == 0.0
    got = g.ingest(batch([comparison(2.0, "4k+", 0.01)]), 2.0, 2.0)
    assert got.comparisons == 1
    assert g.problems() == []


def test_two_huge_noise_samples_cannot_blind_the_drift_test_for_good() -> None:
    # Two 1e308 values overflowed the sum to inf, which nothing could subtract again:
    # m0 = inf, every e-value NaN, the drift test blind for the life of the canary.
    g = gate()
    g.ingest(batch([noise(0.0, 1e308), noise(0.1, 1e308)]), 1.0, 1.0)
    g.ingest(batch([noise(1.0 + 0.001 * i, 0.01) for i in range(500)]), 2.0, 2.0)
    floor = g.noise_json()["4k+"]
    assert floor["kl"] == pytest.approx(0.01)
    assert floor["kl"] is not None and math.isfinite(floor["kl"])
    # And the test still sees a drifted canary: it trips.
    drifted = [comparison(3.0 + 0.01 * i, "4k+", 0.5) for i in range(100)]
    g.ingest(batch(drifted), 3.0, 3.0)
    assert g.trip is not None and g.trip["test"] == "drift"


def test_kl_is_clipped_on_ingestion_so_one_sample_moves_a_detector_by_a_bounded_factor() -> None:
    g = gate(kl_clip=1.0)
    g.ingest(batch([comparison(1.0, "4k+", 1e308, agree=1.0)]), 1.0, 1.0)
    det = g.drift["4k+"].kl
    m0 = GateConfig().kl_tolerance  # no noise floor yet
    assert det.statistic == pytest.approx(1 + 0.8 / m0 * (1.0 - m0))
    assert det.run_sum == 1.0  # the clipped value, not 1e308
    assert g.problems() == []


def test_a_broken_baseline_comparison_never_raises_the_noise_floor() -> None:
    g = gate()
    broken = [{**noise(0.01 * i, 1.0), "invalid": "nan_logprobs"} for i in range(100)]
    got = g.ingest(batch(broken), 1.0, 1.0)
    assert got.ignored == {"noise_invalid": 100} and got.noise_comparisons == 0
    assert g.noise_json()["4k+"]["samples"] == 0
    # A broken canary answer, sent as maximal divergence, is canary evidence: it trips.
    bad = [{**comparison(2 + 0.01 * i, "4k+", 1.0, agree=0.0), "invalid": "x"} for i in range(20)]
    g.ingest(batch(bad), 2.0, 2.0)
    assert g.trip is not None and g.trip["test"] == "drift"


def test_mean_window_stays_exact_when_a_dominant_value_leaves() -> None:
    w = MeanWindow(500)
    w.add(1e300)
    for _ in range(500):
        w.add(0.01)
    assert w.mean() == pytest.approx(0.01, rel=1e-9)
    for _ in range(500):
        w.add(0.0)
    assert w.mean() == 0.0 and w.upper() == 0.0
    with pytest.raises(ValueError, match="finite"):
        w.add(math.inf)
    with pytest.raises(ValueError, match=">= 0"):
        w.add(-1.0)
    clipped = MeanWindow(3, clip=1.0)
    clipped.add(1e308)
    assert clipped.mean() == 1.0


def test_mean_window_over_a_long_run_matches_the_exact_window_mean() -> None:
    import random

    rng = random.Random(7)
    w = MeanWindow(500)
    xs: list[float] = []
    for i in range(200_000):
        x = rng.random() * (1e6 if i % 9973 == 0 else 1e-3)
        w.add(x)
        xs.append(x)
    exact = math.fsum(xs[-500:]) / 500
    assert w.mean() == pytest.approx(exact, rel=1e-9)


def test_detector_refuses_non_finite_references() -> None:
    with pytest.raises(ValueError, match="m0 must be > 0 and finite"):
        ECusum(100).update(0.1, math.inf, 0.0)
    with pytest.raises(ValueError, match="observations must be >= 0 and finite"):
        ECusum(100).update(math.inf, 0.5, 0.0)


def test_a_statistic_that_is_not_finite_is_reported() -> None:
    g = gate()
    g.drift["4k+"].kl.log_m = math.nan  # what no input can do any more
    assert "statistic_not_finite:4k+:drift_kl" in g.problems()
    # The state stays readable as strict JSON (no NaN): the number is written as null.
    body = strictjson.loads(strictjson.dumps(g.to_json(1.0)))
    assert body["buckets"]["4k+"]["drift"]["kl"]["statistic"] is None
    assert "statistic_not_finite:4k+:drift_kl" in body["problems"]


# -------------------------------------------------------------------- whole batches
def test_a_refused_batch_changes_nothing() -> None:
    g = gate()
    good = [comparison(1.0, "4k+", 0.9) for _ in range(20)]
    bad = {**comparison(1.0, "4k+", 0.9), "bucket": "3k-5k"}
    with pytest.raises(BatchRefused) as info:
        g.ingest(batch([*good, bad]), 1.0, 1.0)
    assert info.value.param == "comparisons[20].bucket"
    assert "3k-5k" in info.value.message and "--bucket-edges" in info.value.message
    assert g.totals.comparisons == 0
    assert g.drift["4k+"].kl.samples == 0
    assert g.buckets["4k+"].comparisons == 0


def test_a_batch_over_the_size_limit_is_refused_whole() -> None:
    g = gate()
    n = MAX_BATCH_ITEMS // 2 + 1
    comps = [comparison(1.0, "0-512", 0.01) for _ in range(n)]
    outs = [outcome(1.0, "baseline", "0-512", 0.03) for _ in range(n)]
    with pytest.raises(BatchRefused, match="send smaller batches"):
        g.ingest(batch(comps, outs), 1.0, 1.0)
    assert g.totals.comparisons == 0 and g.totals.outcomes == 0


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"ttft_a_s": 1e9}, "ttft_a_s"),
        ({"ttft_b_s": -1.0}, "ttft_b_s"),
        ({"time": 1e300}, "time"),
        ({"time": -5.0}, "time"),
        ({"prompt_tokens": 10**30}, "prompt_tokens"),
        ({"kl_first": -1.0}, "kl_first"),
        ({"bucket": "x" * 1000}, "bucket"),
    ],
)
def test_sample_values_out_of_bounds_are_refused(over: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        batch([{**comparison(1.0, "4k+", 0.1), **over}])
    assert info.value.errors()[0]["loc"] == ("comparisons", 0, field)


# ---------------------------------------------------------------------- batch ids
def test_a_resent_batch_id_counts_nothing_twice() -> None:
    g = gate()
    body = [comparison(1.0, "4k+", 0.03) for _ in range(5)]
    first = g.ingest(batch(body, batch_id="b-1", dropped=3), 1.0, 1.0)
    assert not first.duplicate and first.comparisons == 5
    again = g.ingest(batch(body, batch_id="b-1", dropped=3), 1.1, 1.1)
    assert again.duplicate and again.comparisons == 0
    assert g.totals.comparisons == 5
    assert g.drift["4k+"].kl.samples == 5
    assert g.router_dropped == 3
    assert g.duplicate_batches == 1
    # The same id from another router is another batch.
    other = g.ingest(batch(body, batch_id="b-1", router_id="r1"), 1.2, 1.2)
    assert not other.duplicate and g.totals.comparisons == 10
    # Without an id a resend cannot be recognised (documented): it counts again.
    g.ingest(batch(body), 1.3, 1.3)
    g.ingest(batch(body), 1.4, 1.4)
    assert g.totals.comparisons == 20


def test_batch_ids_are_remembered_per_router_for_a_bounded_number() -> None:
    g = gate()
    g.ingest(batch(batch_id="old"), 1.0, 1.0)
    for i in range(BATCH_IDS_PER_ROUTER):
        g.ingest(batch(batch_id=f"id-{i}"), 1.0, 1.0)
    assert len(g._seen_batches["r0"]) == BATCH_IDS_PER_ROUTER
    # "old" was evicted (least recently seen); the most recent one is still known.
    assert not g.ingest(batch(batch_id="old"), 1.0, 1.0).duplicate
    assert g.ingest(batch(batch_id=f"id-{BATCH_IDS_PER_ROUTER - 1}"), 1.0, 1.0).duplicate


def test_batch_ids_survive_a_reset_for_a_new_canary() -> None:
    g = gate()
    g.ingest(batch([comparison(1.0, "4k+", 0.03)], batch_id="b-9"), 1.0, 1.0)
    g.on_release(release(version="v3"), 2.0)
    assert g.resets == 1
    assert g.ingest(batch([comparison(1.0, "4k+", 0.03)], batch_id="b-9"), 2.0, 2.0).duplicate


# ------------------------------------------------------------------ trip status
def test_an_abandoned_trip_does_not_report_tripped() -> None:
    g = gate()
    g.ingest(batch([comparison(1.0 + 0.01 * i, "4k+", 0.9) for i in range(50)]), 1.0, 1.0)
    assert g.trip is not None and g.trip_status is TripStatus.PENDING
    assert g.state(1.0) == "tripped"
    # Someone promoted the canary before the trip could be written: the writer abandons.
    g.on_release(release(phase="promoted", weight=0), 2.0)
    g.abandon_trip("release is promoted, not progressing")
    assert g.state(2.0) == "idle"
    body = g.to_json(2.0)
    assert body["state"] == "idle"
    assert body["trip_status"] == "abandoned"
    assert body["trip_status_reason"] == "release is promoted, not progressing"
    assert g.problems() == []


def test_a_trip_abandoned_while_the_canary_still_serves_is_a_problem() -> None:
    g = gate()
    g.ingest(batch([comparison(1.0 + 0.01 * i, "4k+", 0.9) for i in range(50)]), 1.0, 1.0)
    g.abandon_trip("refused: evidence rejected")
    assert g.state(2.0) == "watching"
    assert g.problems() == ["trip_not_written"]


def test_trip_status_values_are_written_down_once() -> None:
    assert [s.value for s in TripStatus] == ["pending", "writing", "written", "abandoned"]
