"""A dependency both variants share fails: the errors test must not blame the canary.

The errors test compares each canary outcome with the baseline's error rate over the last
``error_window_s`` (10 s). When a shared dependency starts failing, the canary's errors
arrive at once but the window takes seconds to see the baseline's: without more, the gate
trips a healthy canary on a shared incident (``bench/gate_null_outcomes.py`` measures how
often). ``detect.error_surge`` leaves canary outcomes untested while the baseline's recent
errors are surely above its window's bound. These tests feed the gate's own classes a
seeded stream at the game day's rates (baseline ~38 outcomes/s, canary 2/s).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from canarystack.gate.stats import binomial_lower, binomial_upper
from tests.test_gate_stats import batch, gate, outcome

HEALTHY_S = 20.0
INCIDENT_S = 20.0


def stream(
    rng: np.random.Generator, base_p: float, canary_p: float, shared_p: float
) -> list[dict[str, Any]]:
    """Outcomes of one bucket in time order: HEALTHY_S at ``base_p`` on both sides (the
    canary at ``canary_p`` from then on), then INCIDENT_S during which a shared dependency
    fails ``shared_p`` of either variant's requests."""
    out = []
    t = 0.0
    while t < HEALTHY_S + INCIDENT_S:
        t += float(rng.exponential(1.0 / 40.0))
        variant = "canary" if rng.random() < 0.05 else "baseline"
        p = base_p if variant == "baseline" or t < HEALTHY_S else canary_p
        if t >= HEALTHY_S:
            p = 1.0 - (1.0 - p) * (1.0 - shared_p)
        failed = rng.random() < p
        out.append(
            outcome(t, variant, "2k-4k", None if failed else 0.05, "http_503" if failed else None)
        )
    return out


def feed(test: str, outcomes: list[dict[str, Any]], **cfg: Any) -> Any:
    g = gate(test=test, **cfg)
    for i in range(0, len(outcomes), 20):  # the routers' batches
        now = float(outcomes[i]["time"])
        g.ingest(batch(outcomes=outcomes[i : i + 20]), now, now)
        if g.trip is not None:
            break
    return g


def test_the_lower_bound_is_the_upper_bound_s_mirror() -> None:
    assert binomial_lower(0, 50, 0.01) == 0.0 and binomial_lower(3, 0, 0.01) == 0.0
    # k errors of n: lower(k, n) = 1 - upper(n - k, n), both one-sided at level 1 - delta.
    for k, n in ((1, 40), (10, 38), (37, 38)):
        assert binomial_lower(k, n, 0.01) == pytest.approx(1.0 - binomial_upper(n - k, n, 0.01))
    assert binomial_lower(19, 38, 0.01) < 0.5 < binomial_upper(19, 38, 0.01)


def test_a_shared_outage_trips_the_default_test_without_the_rule_and_not_with_it() -> None:
    outcomes = stream(np.random.default_rng(3), 0.01, 0.01, 1.0)
    before = feed("cusum", outcomes, error_surge_s=0.0)
    assert before.trip is not None and before.trip["test"] == "errors"
    after = feed("cusum", outcomes)
    assert after.trip is None
    skips = after.buckets["2k-4k"].error_surge_skips
    # The canary's outcomes of the incident's first seconds, until the window catches up.
    assert 1 <= skips <= 2.0 * 0.05 * 40.0 * after.config.error_window_s
    assert after.to_json(40.0)["buckets"]["2k-4k"]["error_surge_skips"] == skips  # /v1/gate


def test_the_release_test_leaves_the_incident_s_onset_untested_too() -> None:
    outcomes = stream(np.random.default_rng(3), 0.01, 0.01, 1.0)
    without = feed("release-eprocess", outcomes, error_surge_s=0.0)
    rule = feed("release-eprocess", outcomes)
    assert without.buckets["2k-4k"].error_surge_skips == 0
    assert rule.buckets["2k-4k"].error_surge_skips >= 1
    wealth = {
        name: next(d for s, t, d in g.detectors() if s == "2k-4k" and t == "errors").statistic
        for name, g in (("without", without), ("rule", rule))
    }
    assert wealth["rule"] < wealth["without"]


def test_a_canary_that_fails_on_its_own_still_trips_with_the_rule() -> None:
    # Baseline at 1 % throughout, the canary at 40 % after the healthy part; no incident.
    outcomes = stream(np.random.default_rng(4), 0.01, 0.4, 0.0)
    g = feed("cusum", outcomes)
    assert g.trip is not None and g.trip["test"] == "errors"
    assert g.buckets["2k-4k"].error_surge_skips == 0


def test_the_rule_s_window_must_be_shorter_than_the_error_window() -> None:
    with pytest.raises(ValueError, match="error_surge_s"):
        gate(error_surge_s=10.0)
