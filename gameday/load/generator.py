"""Whether the load generator could have produced the load it was asked for (#14 item 6).

``load_problems`` judges one Locust run's summary (``LoadResult.summary["generator"]``);
``gameday run`` makes the experiment ``inconclusive`` when it names a shortfall.
Tolerances: ``LoadTolerances.from_env``. This module must never start a process.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict, TypeVar

CPU_WARNING_TEXT = "CPU usage above"  # Locust's own warning (locust.runners)
ENV_TARGET_RPS = "GAMEDAY_LOAD_TARGET_RPS"
ENV_MIN_RATE_RATIO = "GAMEDAY_LOAD_MIN_RATE_RATIO"
ENV_MAX_CPU_FRACTION = "GAMEDAY_LOAD_MAX_CPU_FRACTION"
ENV_MAX_LATE_FRACTION = "GAMEDAY_LOAD_MAX_LATE_FRACTION"

N = TypeVar("N", int, float)


def env_number(
    environ: dict[str, str] | os._Environ[str],
    key: str,
    parse: Callable[[str], N],
    lo: N,
    hi: N,
    default: N | None,
    want: str,
) -> N | None:
    """``environ[key]`` read with ``parse`` (``default`` when unset or blank); ValueError
    ``"KEY='text': <want>"`` when it does not parse or lies outside ``lo``..``hi`` (NaN and
    infinities included)."""
    text = environ.get(key, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except ValueError:
        raise ValueError(f"{key}={text!r}: {want}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{key}={text!r}: {want}")
    return value


def _env_float(
    environ: dict[str, str] | os._Environ[str],
    key: str,
    default: float | None,
    lo: float,
    hi: float,
) -> float | None:
    want = f"give a number from {lo:g} to {hi:g} (or unset it for the default)"
    return env_number(environ, key, float, lo, hi, default, want)


@dataclass(frozen=True)
class LoadTolerances:
    """How far the generator may fall short before its run says nothing about the gate."""

    target_rps: float | None = None  # requests/s the run must reach (None: not checked)
    min_rate_ratio: float = 0.8  # achieved >= this x target_rps
    max_cpu_fraction: float = 0.9  # mean CPU of one Locust process over the test (of 1 core)
    max_late_fraction: float = 0.05  # open loop: trace starts later than their tolerance

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str] = os.environ) -> LoadTolerances:
        """From ``GAMEDAY_LOAD_TARGET_RPS``, ``GAMEDAY_LOAD_MIN_RATE_RATIO``,
        ``GAMEDAY_LOAD_MAX_CPU_FRACTION``, ``GAMEDAY_LOAD_MAX_LATE_FRACTION`` (ValueError
        naming the variable when one is not a number in range)."""
        d = cls()
        rps = _env_float(environ, ENV_TARGET_RPS, None, 1e-3, 1e6)
        ratio = _env_float(environ, ENV_MIN_RATE_RATIO, d.min_rate_ratio, 0.0, 1.0)
        cpu = _env_float(environ, ENV_MAX_CPU_FRACTION, d.max_cpu_fraction, 0.01, 64.0)
        late = _env_float(environ, ENV_MAX_LATE_FRACTION, d.max_late_fraction, 0.0, 1.0)
        assert ratio is not None and cpu is not None and late is not None  # defaults given
        return cls(rps, ratio, cpu, late)


class ToleranceFigures(TypedDict):
    min_rate_ratio: float
    max_cpu_fraction: float
    max_late_fraction: float


class LoadFigures(TypedDict):
    """How the generator did (``load_problems``), as ``load.json`` and ``result.json``
    show it (None where the summary lacks the figure)."""

    achieved_rps: float | None
    target_rps: float | None
    requests_sent: float | None
    test_wall_s: float | None
    cpu_fraction: float | None
    max_cpu_percent: float | None
    cpu_warning: bool
    open_loop: bool
    late_starts: int | None
    late_fraction: float | None
    max_lag_s: float | None
    users: int
    peak_users: float | None
    tolerances: ToleranceFigures


class LoadCheck(LoadFigures):
    """The figures and the verdict on them: valid, else one sentence per shortfall."""

    valid: bool
    problems: list[str]


class LoadUnchecked(TypedDict):
    """No figures judged: the tolerances themselves were bad (the problem says which)."""

    valid: Literal[False]
    problems: list[str]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load_problems(
    summary: Mapping[str, object],
    users: int,
    tolerances: LoadTolerances,
    log_text: str = "",
    processes: int = 1,
) -> LoadCheck:
    """Whether the generator kept up: its figures and one sentence per shortfall.

    Checked: Locust's own "CPU usage above 90%" warning, its mean CPU over the test,
    open-loop lateness (trace starts later than the trace's tolerance), users that never
    ran, and the achieved rate against a target rate when one is given
    (``GAMEDAY_LOAD_TARGET_RPS``; a closed loop has no rate of its own: a slower stack
    lowers it, which is the stack's doing, not the generator's).

    ``summary`` is Locust's ``load-summary.json`` (``gameday.load.collector``); ``log_text``
    its output (for Locust's CPU warning, which a master also logs for its workers).
    """
    t = tolerances
    problems: list[str] = []
    wall = _number(summary.get("test_wall_s"))
    sent = _number(summary.get("requests_sent"))
    cpu_s = _number(summary.get("cpu_s"))
    rps = _number(summary.get("achieved_rps"))
    n_proc = max(1, processes)
    cpu_fraction = (
        round(cpu_s / wall / n_proc, 4) if cpu_s is not None and wall and wall > 0 else None
    )
    warnings = int(_number(summary.get("cpu_warnings")) or 0)
    warned = warnings > 0 or CPU_WARNING_TEXT in log_text
    trace_n = int(_number(summary.get("trace_requests")) or 0)
    late = int(_number(summary.get("trace_late_starts")) or 0)
    abandoned = int(_number(summary.get("trace_abandoned")) or 0)
    late_fraction = round(late / trace_n, 4) if trace_n else None
    peak_users = _number(summary.get("peak_users"))
    figures: LoadFigures = {
        "achieved_rps": rps,
        "target_rps": t.target_rps,
        "requests_sent": sent,
        "test_wall_s": wall,
        "cpu_fraction": cpu_fraction,
        "max_cpu_percent": _number(summary.get("max_cpu_percent")),
        "cpu_warning": warned,
        "open_loop": trace_n > 0,
        "late_starts": late if trace_n else None,
        "late_fraction": late_fraction,
        "max_lag_s": _number(summary.get("max_trace_lag_s")) if trace_n else None,
        "users": users,
        "peak_users": peak_users,
        "tolerances": {
            "min_rate_ratio": t.min_rate_ratio,
            "max_cpu_fraction": t.max_cpu_fraction,
            "max_late_fraction": t.max_late_fraction,
        },
    }
    if wall is None or sent is None or cpu_s is None:
        problems.append(
            "the load's summary has no generator figures (wall time, requests sent, CPU): "
            "whether Locust kept up is unknown"
        )
    if warned:
        problems.append(
            "Locust warned 'CPU usage above 90%': the generator was short of CPU, so its "
            "rate and timings are not the stack's (give Locust a core, or fewer users)"
        )
    if cpu_fraction is not None and cpu_fraction > t.max_cpu_fraction:
        problems.append(
            f"Locust used {cpu_fraction:.0%} of a core on average over the test (more than "
            f"{t.max_cpu_fraction:.0%}, {ENV_MAX_CPU_FRACTION}): the generator was short of CPU"
        )
    if late_fraction is not None and late_fraction > t.max_late_fraction:
        lag = figures["max_lag_s"]
        problems.append(
            f"{late} of {trace_n} trace requests started late ({late_fraction:.1%}, more than "
            f"{t.max_late_fraction:.1%}, {ENV_MAX_LATE_FRACTION}; worst lag "
            f"{lag if lag is not None else '?'} s): the open loop did not keep its schedule "
            "(add users or slow the trace down)"
        )
    if abandoned:
        problems.append(
            f"{abandoned} trace requests were never started (abandoned): the open loop "
            "fell short of its schedule"
        )
    if not trace_n and peak_users is not None and peak_users < users:
        problems.append(
            f"only {peak_users:g} of the {users} users ever ran: the closed loop fell short "
            "of its target"
        )
    if t.target_rps is not None and (rps is None or rps < t.min_rate_ratio * t.target_rps):
        got = "unknown" if rps is None else f"{rps:g} requests/s"
        problems.append(
            f"the load reached {got}, below {t.min_rate_ratio:g} x the target "
            f"{t.target_rps:g} requests/s ({ENV_TARGET_RPS})"
        )
    return {**figures, "valid": not problems, "problems": problems}
