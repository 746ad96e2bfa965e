"""The gate's sequential tests: the e-CUSUM detector (``ECusum``), what every detector
shows (``Detector``), and the windows and bounds its null means come from
(``MeanWindow``, ``TimeWindow``, ``median``, ``binomial_upper``).

This module must never do I/O, read a clock, or keep anything but counters and bounded
windows: callers pass the sample times in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from scipy.special import betaincinv

from canary_contract.bounds import bounded, check_bounds


class Detector(Protocol):
    """What ``/metrics``, ``/v1/gate`` and ``ReleaseGate.problems`` read of any detector:
    an ``ECusum``, or one detector of the release test
    (``canarystack.gate.release_test.ReleaseDetector``)."""

    @property
    def statistic(self) -> float: ...

    @property
    def threshold(self) -> float: ...

    @property
    def samples(self) -> int: ...

    def finite(self) -> bool: ...

    def sample_rate_hz(self) -> float | None: ...

    def to_json(self) -> ECusumJson | EProcessJson: ...


class ECusumJson(TypedDict):
    """An e-CUSUM detector's numbers as ``GET /v1/gate/{release}`` shows them (a number
    that is not finite is null)."""

    statistic: float | None
    threshold: float
    samples: int
    mean: float | None
    null_mean: float | None
    run_samples: int
    run_mean: float | None
    max_statistic: float | None


class EProcessJson(TypedDict):
    """A release test's detector (``--test release-eprocess``,
    ``canarystack.gate.release_test``) as ``GET /v1/gate/{release}`` shows it."""

    statistic: float | None
    threshold: float | None
    weight: float
    samples: int
    bets: int
    last_bet_fraction: float
    mean: float | None
    null_mean: float | None
    run_samples: int
    run_mean: float | None
    max_statistic: float | None


@dataclass
class ECusum:
    """An e-CUSUM detector for "the mean of ``x`` has risen above ``m0``".

    The e-CUSUM of Shin, Ramdas & Rinaldo ("E-detectors: a nonparametric framework for
    sequential change detection", New England Journal of Statistics in Data Science 2(2),
    2024, §3) over *betting e-values* for a bounded-below mean (Waudby-Smith & Ramdas,
    "Estimating means of bounded random variables by betting", JRSS-B 86(1), 2024).

    The null hypothesis: each new observation ``x_t >= 0`` has conditional mean at most
    ``m0_t`` given the past (``m0_t`` may itself be computed from the past, e.g. the live
    noise floor plus a tolerance). For a bet ``lambda_t = f / m0_t`` with ``0 <= f < 1``::

        e_t = 1 + lambda_t * (x_t - m0_t)           (>= 1 - f > 0, and E[e_t | past] <= 1)
        M_t = max(M_{t-1}, 1) * e_t,   M_0 = 1       (the e-CUSUM statistic)
        alarm at the first t with M_t >= A           (A = the test's ``threshold``)

    Each ``e_t`` is an e-value under the null, so ``M_t`` is an e-detector and the
    *average run length to a false alarm* is at least ``A`` observations, for every stream
    that satisfies the null: no distributional assumption beyond ``x_t >= 0`` (Shin et al.
    2024, Theorem 3.3 / Lorden 1971 for the CUSUM form). A healthy stream whose mean sits
    well below ``m0`` false-alarms far less often (the bound is reached only when the mean
    equals ``m0``). Clipping ``x_t`` at ``clip`` only lowers it, so the guarantee is
    unchanged and one wild observation moves ``M`` by at most ``1 + f * (clip - m0) / m0``.

    While the mean is above ``m0``, ``log M_t`` grows by ``E[log e_t] > 0`` per
    observation; the run that ends in an alarm starts at the last time ``M`` was reset
    (``M_{t-1} <= 1``), which estimates the change point: the evidence reports its first
    and last sample times and its length.

    The gate uses this class for all three tests, with different ``x_t`` and ``m0_t``:
    drift (``x`` = KL or top-1 disagreement of one comparison, ``m0`` = noise floor +
    tolerance), latency (``x`` = 1 if the canary's TTFT exceeds ``ratio x`` the
    baseline's, ``m0 = 1/2``: the null is "the canary/baseline TTFT ratio has median <=
    ratio"), errors (``x`` = 1 for a canary error, ``m0`` = a Clopper-Pearson upper bound
    on the baseline's recent error rate + tolerance).

    ``threshold`` is A (alarm when the statistic reaches it; average run length to a false
    alarm >= A observations under the null). ``bet_fraction`` is f in ``lambda = f / m0``
    (0 < f < 1: closer to 1 detects large shifts faster, tolerates fewer low samples).
    ``clip`` caps each observation (None: no cap).
    """

    threshold: float
    bet_fraction: float = 0.8
    clip: float | None = None
    log_m: float = 0.0  # log of the statistic M_t
    run_samples: int = 0
    run_first_time: float | None = None
    run_last_time: float | None = None
    run_sum: float = 0.0
    samples: int = 0
    total_sum: float = 0.0
    max_log_m: float = 0.0
    last_m0: float | None = None
    first_time: float | None = None  # of the first sample ever (for the observed rate)

    def __post_init__(self) -> None:
        if not self.threshold > 1:
            raise ValueError(f"threshold must be > 1 (the alarm level A), got {self.threshold}")
        if not 0 < self.bet_fraction < 1:
            raise ValueError(f"bet_fraction must be in (0, 1), got {self.bet_fraction}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")

    @property
    def statistic(self) -> float:
        return math.exp(min(self.log_m, 700.0))

    def finite(self) -> bool:
        """Every number this detector keeps is finite (else its verdict means nothing)."""
        return all(
            math.isfinite(v) for v in (self.log_m, self.max_log_m, self.run_sum, self.total_sum)
        )

    @property
    def alarmed(self) -> bool:
        return self.log_m >= math.log(self.threshold)

    def update(self, x: float, m0: float, t: float) -> bool:
        """Add one observation ``x`` (taken at time ``t``) against the null mean ``m0``.

        Returns True when the statistic reaches the threshold. ``m0 >= clip`` (or m0 >= 1
        for indicators) makes the test blind by construction: ``e_t <= 1`` always.
        """
        if not (m0 > 0 and math.isfinite(m0)):
            raise ValueError(f"m0 must be > 0 and finite, got {m0}")
        if not (x >= 0 and math.isfinite(x)):
            raise ValueError(f"observations must be >= 0 and finite, got {x}")
        if not math.isfinite(t):
            raise ValueError(f"sample times must be finite, got {t}")
        if self.clip is not None:
            x = min(x, self.clip)
        e = 1.0 + (self.bet_fraction / m0) * (x - m0)
        if self.log_m <= 0.0:  # max(M_{t-1}, 1) = 1: a new run starts here
            self.log_m = 0.0
            self.run_samples = 0
            self.run_first_time = t
            self.run_sum = 0.0
        self.log_m += math.log(e)
        self.run_samples += 1
        self.run_last_time = t
        if self.first_time is None:
            self.first_time = t
        self.run_sum += x
        self.samples += 1
        self.total_sum += x
        self.last_m0 = m0
        self.max_log_m = max(self.max_log_m, self.log_m)
        return self.alarmed

    def sample_rate_hz(self) -> float | None:
        """Samples per second of sample time since the first one (None under 1 s)."""
        if self.first_time is None or self.run_last_time is None:
            return None
        span = self.run_last_time - self.first_time
        return self.samples / span if span >= 1.0 else None

    def to_json(self) -> ECusumJson:
        """The detector's numbers for the API; a number that is not finite is written as
        None (JSON has no NaN; ``ReleaseGate.problems`` reports it)."""
        return {
            "statistic": _r(self.statistic),
            "threshold": self.threshold,
            "samples": self.samples,
            "mean": _r(self.total_sum / self.samples) if self.samples else None,
            "null_mean": _r(self.last_m0) if self.last_m0 is not None else None,
            "run_samples": self.run_samples if self.log_m > 0 else 0,
            "run_mean": _r(self.run_sum / self.run_samples)
            if self.log_m > 0 and self.run_samples
            else None,
            "max_statistic": _r(math.exp(min(self.max_log_m, 700.0))),
        }


def _r(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


# A running sum that shrinks by more than this factor at once is recomputed exactly.
_CANCELLATION = 1024.0


@dataclass
class MeanWindow:
    """The last ``size`` values and an upper estimate of their mean (mean + z * SE).

    Numerically robust over any run length: values must be finite and >= 0 (``clip``
    caps them, so the sums cannot overflow), and the running sums are recomputed exactly
    (``math.fsum``) from the window every ``size`` additions, so rounding error never
    accumulates (a huge value that leaves the window takes no precision with it). The
    mean and variance are clamped at 0: the estimate is never negative, never infinite.
    """

    size: int = bounded(ge=1)
    z: float = 2.0
    clip: float | None = bounded(None, gt=0, finite=True)
    values: deque[float] = field(default_factory=deque)
    _sum: float = 0.0
    _sumsq: float = 0.0
    _since_exact: int = 0

    def __post_init__(self) -> None:
        check_bounds(self)

    def add(self, x: float) -> None:
        if not (x >= 0 and math.isfinite(x)):
            raise ValueError(f"window values must be >= 0 and finite, got {x}")
        if self.clip is not None:
            x = min(x, self.clip)
        self.values.append(x)
        self._sum += x
        self._sumsq += x * x
        cancelled = False
        if len(self.values) > self.size:
            old = self.values.popleft()
            before = self._sum
            self._sum -= old
            self._sumsq -= old * old
            # A value that dominated the sum left: what remains lost its precision to it.
            cancelled = before > _CANCELLATION * max(self._sum, 0.0)
        self._since_exact += 1
        if (
            cancelled
            or self._since_exact >= self.size
            or not (math.isfinite(self._sum) and math.isfinite(self._sumsq))
        ):
            self._recompute()

    def _recompute(self) -> None:
        self._sum = math.fsum(self.values)
        self._sumsq = math.fsum(v * v for v in self.values)
        self._since_exact = 0

    def __len__(self) -> int:
        return len(self.values)

    def mean(self) -> float:
        return max(0.0, self._sum / len(self.values)) if self.values else 0.0

    def upper(self) -> float:
        """mean + z * standard error (0 when empty); finite and >= 0."""
        n = len(self.values)
        if n == 0:
            return 0.0
        mean = self.mean()
        if n < 2:
            return mean
        var = (self._sumsq - n * mean * mean) / (n - 1)
        if not var > 0:  # also NaN
            var = 0.0
        return mean + self.z * math.sqrt(var / n)


@dataclass
class TimeWindow:
    """Values seen in the last ``window_s`` seconds of sample time (at most ``max_n``)."""

    window_s: float
    max_n: int = 2000
    items: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, t: float, value: float) -> None:
        if not (math.isfinite(t) and math.isfinite(value)):
            raise ValueError(f"time and value must be finite, got ({t}, {value})")
        self.items.append((t, value))
        if len(self.items) > self.max_n:
            self.items.popleft()

    def prune(self, now_t: float) -> None:
        cutoff = now_t - self.window_s
        while self.items and self.items[0][0] < cutoff:
            self.items.popleft()

    def values(self, now_t: float) -> list[float]:
        self.prune(now_t)
        return [v for _, v in self.items]

    def recent(self, now_t: float, seconds: float) -> list[float]:
        """The values of the last ``seconds`` (at most the window's)."""
        self.prune(now_t)
        cutoff = now_t - seconds
        return [v for t, v in self.items if t >= cutoff]


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def binomial_upper(errors: int, n: int, delta: float) -> float:
    """One-sided Clopper-Pearson upper confidence bound (level 1 - delta) on a rate.

    1.0 when there is no data: an unknown baseline error rate must never make the canary
    look worse than it.
    """
    if n <= 0:
        return 1.0
    if errors >= n:
        return 1.0
    return float(betaincinv(errors + 1, n - errors, 1.0 - delta))


def binomial_lower(errors: int, n: int, delta: float) -> float:
    """One-sided Clopper-Pearson lower confidence bound (level 1 - delta) on a rate; 0.0
    when there is no data or no error."""
    if n <= 0 or errors <= 0:
        return 0.0
    return float(betaincinv(errors, n - errors + 1, delta))
