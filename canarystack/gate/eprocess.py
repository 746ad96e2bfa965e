"""Betting e-processes and their weighted average: the arithmetic of the gate's
one-test-per-release mode (``--test release-eprocess``, ``canarystack.gate.release_test``).

One detector is a *non-restarting* e-process for "the conditional mean of ``x`` is at most
``m0``": with ``r_t = x_t / m0_t >= 0`` and a bet fraction ``f_t`` chosen from the past
alone (``0 <= f_t <= max(fractions) < 1``)::

    W_t = prod_{i <= t} (1 - f_i + f_i * r_i)        (W_0 = 1)

Each factor is ``>= 1 - f_i > 0`` and, under the null (``E[x_i | past] <= m0_i``), has
conditional mean ``1 + f_i (E[r_i | past] - 1) <= 1``: ``W`` is a nonnegative
supermartingale. So is any weighted average ``M_t = sum_d w_d W_{d,t}`` (``w_d > 0``,
``sum w_d = 1``) of the detectors of one release, whatever their sample rates and however
their samples overlap (each factor's conditional mean is taken given everything seen before
it), and ``M_0 = 1``. Ville's inequality: ``P(sup_t M_t >= 1/alpha) <= alpha``. Tripping the
release at the first ``M_t >= 1/alpha`` therefore false-trips with probability at most
``alpha`` over the whole release, however long it runs and however many samples arrive.

The bet (``BetRule``): each candidate fraction ``f_j`` keeps a *score*, the discounted
sum of the log-factors ``log(1 - f_j + f_j r)`` it would have earned on this detector's
past observations (``S_j <- discount * S_j + log(1 - f_j + f_j r_t)``, after the bet on
``r_t`` is placed). The next bet is the candidate with the highest score, or 0 when no
score is positive. It uses past observations only (predictable). It is 0 whenever the
recent evidence is healthy: by Jensen's inequality (``log`` is concave) every score is
<= 0 while the discounted average of past ``r`` is at most 1, so a healthy stream leaves
``W`` at exactly 1 however long it runs, and a fault that starts late meets a detector
that has lost nothing. Once recent observations
sit above ``m0``, the largest fraction they would have rewarded is backed (follow-the-
leader Kelly betting with a memory of about ``1 / (1 - discount)`` observations). One
observation a few times ``m0`` in a healthy stream turns no bet on.

Everything here is vectorised over ``n`` independent copies (``n = 1`` in the gate, one copy
per simulated release in ``bench/gate_null_stress.py``, which runs this very code).

This module must never do I/O, read a clock or keep anything but fixed-size arrays.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Candidate bet fractions and the discount of their scores (module level: the tests and
# the benchmark name them). With these, one observation of 3 x m0 after a healthy stretch
# turns no bet on (its gain is smaller than the healthy stretch's discounted losses at the
# smallest fraction); a fault of 5 x m0 has the largest fraction backed within ~4
# observations (bench/gate_null_stress.py measures both).
DEFAULT_BET_FRACTIONS: tuple[float, ...] = (0.05, 0.15, 0.35, 0.6, 0.85)
DEFAULT_BET_DISCOUNT = 0.8
# A score must beat 0 by more than rounding to turn a bet on.
_MARGIN = 1e-12
# log(M) is kept, not M: a faulty detector's wealth may exceed any float before the trip.
_LOG_CAP = 700.0


@dataclass(frozen=True)
class BetRule:
    """How a detector bets: the candidate ``fractions`` (increasing, each in (0, 1)) and the
    ``discount`` of their scores (0: judged on the last observation alone)."""

    fractions: tuple[float, ...] = DEFAULT_BET_FRACTIONS
    discount: float = DEFAULT_BET_DISCOUNT

    def __post_init__(self) -> None:
        fs = self.fractions
        if not fs or any(not (0.0 < f < 1.0) for f in fs):
            raise ValueError(f"bet fractions must each be in (0, 1), got {fs!r}")
        if any(b <= a for a, b in itertools.pairwise(fs)):
            raise ValueError(f"bet fractions must be strictly increasing, got {fs!r}")
        if not 0.0 <= self.discount < 1.0:
            raise ValueError(f"bet discount must be in [0, 1), got {self.discount!r}")


def _as_array(v: float | FloatArray, n: int) -> FloatArray:
    return np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))


class EProcesses:
    """``n`` independent copies of one detector's betting e-process (the module docstring
    has the algebra). ``update`` feeds one observation to each copy where ``active``."""

    def __init__(self, n: int = 1, rule: BetRule | None = None) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.rule = rule or BetRule()
        self.n = n
        self._f = np.asarray(self.rule.fractions, dtype=np.float64)
        # Each candidate's discounted sum of log(1 - f + f r) over this copy's past
        # observations (0 before the first: no candidate is ahead, no bet).
        self.scores = np.zeros((n, len(self._f)))
        self.log_wealth = np.zeros(n)
        self.max_log_wealth = np.zeros(n)
        self.samples = np.zeros(n, dtype=np.int64)
        self.bets = np.zeros(n, dtype=np.int64)  # observations a nonzero bet was placed on
        self.last_fraction = np.zeros(n)
        # The current run: observations since the log-wealth was last <= 0.
        self.run_samples = np.zeros(n, dtype=np.int64)

    def fractions(self) -> FloatArray:
        """The fraction each copy bets on its next observation: the candidate with the
        largest score, 0 when no score is > 0."""
        return self._choose(self.scores)

    def _choose(self, scores: FloatArray) -> FloatArray:
        best = np.argmax(scores, axis=1)
        gain = scores.max(axis=1)
        out: FloatArray = np.where(gain > _MARGIN, self._f[best], 0.0)
        return out

    def update(
        self,
        x: float | FloatArray,
        m0: float | FloatArray,
        active: BoolArray | None = None,
    ) -> FloatArray:
        """One observation ``x >= 0`` against the null mean ``m0 > 0`` for each copy where
        ``active`` (all when None). The bet is chosen before ``x`` is looked at. Returns the
        log-factor each active copy's wealth was multiplied by (0 where no bet)."""
        sel: slice | npt.NDArray[np.intp]
        xs = _as_array(x, self.n)
        if active is None:
            sel = slice(None)
        else:
            sel = np.flatnonzero(active)
            xs = xs[sel]
        # A scalar m0 (the usual case) is checked once, not per copy.
        m0s: float | FloatArray = (
            float(m0) if isinstance(m0, float | int) else _as_array(m0, self.n)[sel]
        )
        if not (np.min(m0s) > 0.0 and math.isfinite(float(np.max(m0s)))):
            raise ValueError(f"m0 must be > 0 and finite, got {m0!r}")
        # A sum of values >= 0 is finite only when each of them is.
        if xs.size and not (xs.min() >= 0.0 and math.isfinite(float(xs.sum()))):
            raise ValueError("observations must be >= 0 and finite")
        scores = self.scores[sel]
        f = self._choose(scores)
        r1 = xs / m0s - 1.0
        # log(1 - f + f r) = log1p(f (r - 1)), for the bet placed and for every candidate.
        step = np.log1p(f * r1)
        self.scores[sel] = self.rule.discount * scores + np.log1p(self._f[None, :] * r1[:, None])
        before = self.log_wealth[sel].copy()  # a view when ``sel`` is a slice
        after = np.minimum(before + step, _LOG_CAP)
        self.log_wealth[sel] = after
        self.max_log_wealth[sel] = np.maximum(self.max_log_wealth[sel], after)
        self.samples[sel] += 1
        self.bets[sel] += f > 0.0
        self.last_fraction[sel] = f
        self.run_samples[sel] = np.where(before <= 0.0, 1, self.run_samples[sel] + 1)
        out: FloatArray = step
        return out


@dataclass(frozen=True)
class Contribution:
    """One detector's part of a release's merged statistic."""

    name: str
    weight: float
    log_wealth: float

    @property
    def weighted(self) -> float:
        return self.weight * math.exp(min(self.log_wealth, _LOG_CAP))


class ReleaseEProcess:
    """The weighted average ``M = sum_d w_d W_d`` of a release's detectors, for ``n``
    copies; the release trips at the first ``M >= 1/alpha`` (Ville: false trip
    probability <= ``alpha`` over the whole release).

    ``weights`` maps each detector's name to ``w_d > 0``; they must sum to 1.
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        alpha: float,
        rule: BetRule | None = None,
        n: int = 1,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if not weights:
            raise ValueError("a release needs at least one detector")
        bad = {k: w for k, w in weights.items() if not (w > 0.0 and math.isfinite(w))}
        if bad:
            raise ValueError(f"detector weights must be > 0 and finite, got {bad!r}")
        total = math.fsum(weights.values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"detector weights must sum to 1, got {total!r}")
        self.alpha = alpha
        self.n = n
        self.weights = dict(weights)
        self.names = tuple(weights)
        self._log_w = np.log(np.array([weights[k] for k in self.names]))
        self.detectors = {name: EProcesses(n, rule) for name in self.names}
        self.log_threshold = math.log(1.0 / alpha)

    def log_value(self) -> FloatArray:
        """``log M`` for each copy (log-sum-exp of ``log w_d + log W_d``)."""
        logs = np.stack([self.detectors[k].log_wealth for k in self.names]) + self._log_w[:, None]
        top = logs.max(axis=0)
        out: FloatArray = top + np.log(np.exp(logs - top[None, :]).sum(axis=0))
        return out

    def value(self) -> FloatArray:
        out: FloatArray = np.exp(np.minimum(self.log_value(), _LOG_CAP))
        return out

    def tripped(self) -> BoolArray:
        """``M >= 1/alpha`` for each copy."""
        out: BoolArray = self.log_value() >= self.log_threshold
        return out

    def contributions(self, copy: int = 0) -> list[Contribution]:
        """Each detector's ``w_d W_d`` in copy ``copy``, largest first."""
        parts = [
            Contribution(k, self.weights[k], float(self.detectors[k].log_wealth[copy]))
            for k in self.names
        ]
        return sorted(parts, key=lambda c: (c.weighted, c.name), reverse=True)


def alone_threshold(weight: float, alpha: float) -> float:
    """The wealth one detector of weight ``weight`` must reach to trip the release by
    itself while every other detector's wealth is still 1: ``w W + (1 - w) >= 1/alpha``."""
    return (1.0 / alpha - (1.0 - weight)) / weight
