"""The anytime-valid noise floor of the one-test-per-release mode (``--test
release-eprocess``): an upper confidence sequence on the mean baseline-vs-baseline
divergence of a scope (``UpperConfidenceSequence``), and the floor a release is tested
against, frozen once measured (``NoiseFloor``).

Why a confidence sequence. The release test's null for a drift detector is "the canary's
mean divergence is at most the baseline's own noise + tolerance". The noise is estimated
from baseline-baseline comparisons; an estimate that is low by chance would make the test
too sensitive. An upper confidence sequence ``U_n`` covers the noise mean at *every* ``n``
at once with probability >= 1 - delta, so the floor may be read at any moment (when it is
frozen, which may depend on the data) and the release's guarantee becomes
``P(false trip) <= alpha + delta``: bets are made against ``m0 = U + tolerance``, which is
at least the true null mean whenever the sequence covers (a predictable event), and the
sequence fails to cover with probability at most ``delta``.

The bound: the predictable plug-in empirical-Bernstein confidence sequence of
Waudby-Smith & Ramdas ("Estimating means of bounded random variables by betting", JRSS-B
86(1), 2024, Theorem 2 and eq. (13)-(15)), one-sided, for observations scaled to
``[0, 1]`` by a stated ``clip`` (a comparison's divergence above the clip counts as the
clip), with its running minimum (an intersection of valid bounds is valid). It covers the
(lambda-weighted) average of the observations' conditional means, so it assumes nothing
about their distribution beyond ``0 <= y <= clip``. With no observation it is the clip
itself: nothing is known about a mean in ``[0, clip]`` but that it is at most ``clip``;
that is the fallback floor, stated, never 0.

This module must never do I/O or read a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import numpy as np

from canarystack.gate.eprocess import BoolArray, FloatArray

# The cap on each bet of the confidence sequence (WSR 2024 use 1/2 or 3/4).
CS_MAX_BET = 0.5


class UpperConfidenceSequence:
    """An anytime-valid upper bound (level 1 - ``delta``) on the mean of observations in
    ``[0, clip]``, for ``n`` independent copies (``n = 1`` in the gate)."""

    def __init__(self, clip: float, delta: float, n: int = 1) -> None:
        if not (clip > 0.0 and math.isfinite(clip)):
            raise ValueError(f"clip must be > 0 and finite, got {clip!r}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.clip = clip
        self.delta = delta
        self.n = n
        self._log_1_delta = math.log(1.0 / delta)
        self.samples = np.zeros(n, dtype=np.int64)
        self.clipped = np.zeros(n, dtype=np.int64)  # observations at or above the clip
        self._sum_y = np.zeros(n)
        self._sum_sq = np.zeros(n)
        self._mu_prev = np.full(n, 0.5)  # mu_hat_0 = 1/2, sigma_hat_0^2 = 1/4
        self._var_prev = np.full(n, 0.25)
        self._sum_lam = np.zeros(n)
        self._sum_lam_y = np.zeros(n)
        self._sum_v_psi = np.zeros(n)
        self._upper = np.ones(n)  # running minimum, in units of the clip

    def add(self, y: float | FloatArray, active: BoolArray | None = None) -> None:
        """One observation ``y >= 0`` (clipped at ``clip``) for each copy where ``active``."""
        ys = np.broadcast_to(np.asarray(y, dtype=np.float64), (self.n,))
        sel: slice | np.ndarray = slice(None) if active is None else np.flatnonzero(active)
        ys = ys[sel]
        if not (np.all(ys >= 0.0) and np.all(np.isfinite(ys))):
            raise ValueError("floor observations must be >= 0 and finite")
        self.clipped[sel] += ys >= self.clip
        ys = np.minimum(ys, self.clip) / self.clip
        t = self.samples[sel] + 1
        # lambda_t = min(sqrt(2 log(1/delta) / (sigma_hat_{t-1}^2 t log(1 + t))), c)
        lam = np.minimum(
            np.sqrt(2.0 * self._log_1_delta / (self._var_prev[sel] * t * np.log1p(t))),
            CS_MAX_BET,
        )
        v = 4.0 * (ys - self._mu_prev[sel]) ** 2
        psi = (-np.log1p(-lam) - lam) / 4.0
        self._sum_lam[sel] += lam
        self._sum_lam_y[sel] += lam * ys
        self._sum_v_psi[sel] += v * psi
        bound = (self._sum_lam_y[sel] + self._log_1_delta + self._sum_v_psi[sel]) / self._sum_lam[
            sel
        ]
        self._upper[sel] = np.minimum(self._upper[sel], bound)
        self._sum_y[sel] += ys
        mu = (0.5 + self._sum_y[sel]) / (t + 1)
        self._sum_sq[sel] += (ys - mu) ** 2
        self._var_prev[sel] = (0.25 + self._sum_sq[sel]) / (t + 1)
        self._mu_prev[sel] = mu
        self.samples[sel] = t

    def bound(self) -> FloatArray:
        """The upper confidence bound on the mean, in the observations' units (the clip
        while there is no observation)."""
        out: FloatArray = self.clip * np.clip(self._upper, 0.0, 1.0)
        return out

    def mean(self) -> FloatArray:
        """The plain mean of the clipped observations (0 with none), for display."""
        out: FloatArray = np.where(
            self.samples > 0, self.clip * self._sum_y / np.maximum(self.samples, 1), 0.0
        )
        return out


FloorState = Literal["frozen", "measured", "too_few"]


class FloorJson(TypedDict):
    """A release test's noise floor as ``GET /v1/gate/{release}`` shows it
    (``NoiseFloor.to_json``)."""

    state: FloorState
    kl: float | None
    top1_disagreement: float | None
    samples: int
    min_samples: int
    frozen_at_samples: int | None
    kl_upper_bound_now: float | None
    top1_upper_bound_now: float | None
    kl_mean: float | None
    kl_clip: float
    top1_clip: float
    kl_clipped: int
    delta: float
    fallback_comparisons: int


@dataclass
class NoiseFloor:
    """The KL and top-1 disagreement floors of one scope for the release test.

    Fed baseline-baseline comparisons for as long as the stable version lasts (across
    canaries, like the live floor of the default test). A release's floor is *frozen* the
    first time it is asked for while the scope has at least ``min_samples`` comparisons
    (``freeze``; the gate asks when a canary comparison is tested, so a floor measured
    before the canary took traffic is frozen at its first comparison): nothing the release
    does afterwards moves the bar it is tested against. Until then the scope has too few
    comparisons and is tested against the fallback, the clip (the bound with no data).
    """

    kl: UpperConfidenceSequence
    top1: UpperConfidenceSequence
    min_samples: int
    frozen_kl: float | None = None
    frozen_top1: float | None = None
    frozen_at_samples: int | None = None
    _fallback_uses: int = field(default=0)

    @classmethod
    def empty(
        cls, kl_clip: float, top1_clip: float, delta_each: float, min_samples: int
    ) -> NoiseFloor:
        return cls(
            UpperConfidenceSequence(kl_clip, delta_each),
            UpperConfidenceSequence(top1_clip, delta_each),
            min_samples,
        )

    @property
    def samples(self) -> int:
        return int(self.kl.samples[0])

    def add(self, kl: float, disagreement: float) -> None:
        self.kl.add(kl)
        self.top1.add(disagreement)

    def unfrozen(self) -> NoiseFloor:
        """The same measurements for a new release: frozen again at its first need."""
        return NoiseFloor(self.kl, self.top1, self.min_samples)

    def floors(self) -> tuple[float, float, str]:
        """(KL floor, top-1 floor, state) to test a canary comparison against now, freezing
        the floor if it can be. State: ``frozen``, or ``too_few`` (the fallback, the
        clips, with fewer than ``min_samples`` comparisons)."""
        if self.frozen_kl is None and self.samples >= self.min_samples:
            self.frozen_kl = float(self.kl.bound()[0])
            self.frozen_top1 = float(self.top1.bound()[0])
            self.frozen_at_samples = self.samples
        if self.frozen_kl is not None and self.frozen_top1 is not None:
            return self.frozen_kl, self.frozen_top1, "frozen"
        self._fallback_uses += 1
        return self.kl.clip, self.top1.clip, "too_few"

    def to_json(self) -> FloorJson:
        """The floor as ``/v1/gate`` shows it: what a canary comparison would be tested
        against now (without freezing it), and the measurement behind it."""
        frozen = self.frozen_kl is not None
        too_few = not frozen and self.samples < self.min_samples
        state: FloorState
        if frozen:
            state = "frozen"
        elif too_few:
            state = "too_few"
        else:
            state = "measured"  # frozen at the next canary comparison
        kl = self.frozen_kl if frozen else (self.kl.clip if too_few else self.kl.bound()[0])
        top1 = self.frozen_top1 if frozen else (self.top1.clip if too_few else self.top1.bound()[0])
        return {
            "state": state,
            "kl": _r(kl),
            "top1_disagreement": _r(top1),
            "samples": self.samples,
            "min_samples": self.min_samples,
            "frozen_at_samples": self.frozen_at_samples,
            "kl_upper_bound_now": _r(self.kl.bound()[0]),
            "top1_upper_bound_now": _r(self.top1.bound()[0]),
            "kl_mean": _r(self.kl.mean()[0]),
            "kl_clip": self.kl.clip,
            "top1_clip": self.top1.clip,
            "kl_clipped": int(self.kl.clipped[0]),
            "delta": self.kl.delta,
            "fallback_comparisons": self._fallback_uses,
        }


def _r(x: float | np.floating | None) -> float | None:
    if x is None:
        return None
    v = float(x)
    return round(v, 8) if math.isfinite(v) else None
