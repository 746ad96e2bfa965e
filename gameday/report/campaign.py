"""Campaigns: a game day as repeated, randomized trials (issue #14, item 4).

Over 400 lines because it is one idea: the statistics of one cell of repeated runs (each
method stated on its function) and their ECDF. Pure functions and the figure; it must
never read the run folder, nor decide an experiment's verdict, nor leave a missed trip
out (it is the worst run).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

if TYPE_CHECKING:  # (gameday.run.plan imports this module: keep it light)
    from gameday.report.summary import ExperimentSummary

CONFIDENCE = 0.95
CERTIFY_QUANTILE = 0.95
DEFAULT_DETECTION_SLO_S = 5.0  # experiments' GAMEDAY_SLO_DETECTION_S default
PERCENTILE_METHOD = "linear (numpy default, Hyndman-Fan type 7)"
INTERVAL_METHOD = "distribution-free order-statistic interval (binomial ranks), 95 %"
RUN_SUFFIX = re.compile(r"^(?P<base>.+)@r(?P<index>[0-9]+)$")
# The quantiles of time to trip a cell reports, by their key in ``TimeToTripJson``.
QUANTILES: tuple[tuple[Literal["p50"], float], tuple[Literal["p95"], float]] = (
    ("p50", 0.5),
    ("p95", 0.95),
)


class CertificationJson(TypedDict):
    claim: str
    certified: bool
    runs: int
    exceedances: int
    inconclusive_runs: int
    runs_needed_without_exceedance: int
    proven_quantile: float
    sentence: str
    method: str


class QuantileJson(TypedDict):
    """One quantile of time to trip with its 95 % interval (None: unbounded or none)."""

    value_s: float | None
    ci95_s: list[float | None]  # [low, high]
    ci95_unbounded: list[bool]  # [low, high]


class TimeToTripJson(TypedDict):
    n: int
    p50: QuantileJson
    p95: QuantileJson


class WorstRunJson(TypedDict):
    name: str
    verdict: str
    time_to_trip_s: float | None
    tripped: bool
    load_seed: int | None


class CampaignCellJson(TypedDict):
    """One cell of summary.json's ``campaign``; a cell expecting a trip has
    ``certification``, any other ``false_trip_probability_upper_95``."""

    experiment: str
    component: str | None
    fault: str | None
    expect: str | None
    verdict: str
    runs: int
    passes: int
    passes_text: str
    inconclusive_runs: int
    tripped_runs: int
    missed_trips: int
    time_to_trip: TimeToTripJson
    worst_run: WorstRunJson | None
    ecdf: list[list[float]]  # [time to trip, share of runs]
    run_names: list[str]
    load_seeds: list[int | None]
    certification: NotRequired[CertificationJson | None]  # None: not --certify
    false_trip_probability_upper_95: NotRequired[float | None]


class CampaignDocJson(TypedDict):
    """summary.json's ``campaign`` section."""

    repeat: int
    certify: bool
    percentile_method: str
    interval_method: str
    missed_trip_counts_as: str
    inconclusive_runs: str
    seeds: str
    cells: list[CampaignCellJson]
    certification: list[str]  # each certified cell's sentence


def run_folder_name(base: str, index: int) -> str:
    """The folder of run ``index`` (1-based) of experiment ``base`` in a campaign."""
    return f"{base}@r{index:02d}"


def split_run_name(name: str) -> tuple[str, int | None]:
    """``router/latency@r03`` -> (``router/latency``, 3); a plain name -> (name, None)."""
    m = RUN_SUFFIX.match(name)
    if m is None:
        return name, None
    return m.group("base"), int(m.group("index"))


# ---------------------------------------------------------------------------------------
# Statistics (pure)


def percentile(values: Sequence[float], q: float) -> float | None:
    """numpy's ``linear`` percentile, ``q`` in [0, 1]; ``math.inf`` values allowed (a
    missed trip); None for no values.

    The definition is numpy's and pandas' default ``linear`` (type 7 of Hyndman & Fan:
    ``h = (n - 1) q``, interpolated between the order statistics around ``h``); the repo
    has no single one yet (``bench/gate_detection.py`` uses nearest rank).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile q must be in [0, 1], got {q!r}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    if any(math.isnan(x) for x in xs):
        raise ValueError("percentile of NaN values is undefined")
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    frac = h - lo
    if frac == 0.0 or lo + 1 >= len(xs):
        return xs[lo]
    a, b = xs[lo], xs[lo + 1]
    if math.isinf(b):
        return math.inf
    return a + frac * (b - a)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), exact."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k + 1)))


def quantile_interval_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """1-based ranks (l, u) of the order-statistic interval ``[x(l), x(u)]`` covering the
    q-quantile with at least ``confidence``; l = 0 means unbounded below, u = n + 1
    unbounded above (too few runs for that side).

    Distribution-free: the number of runs at or below the true q-quantile is
    Binomial(n, q), so ``P(x(l) <= xi_q <= x(u)) >= F(u - 1) - F(l - 1)``; ``l`` and ``u``
    are the ranks that leave at most (1 - confidence) / 2 below and above.
    """
    if n < 0 or not 0.0 < q < 1.0 or not 0.0 < confidence < 1.0:
        raise ValueError(f"need n >= 0, 0 < q < 1, 0 < confidence < 1 (got {n}, {q}, {confidence})")
    tail = (1.0 - confidence) / 2.0
    lower = 0
    for rank in range(1, n + 1):  # the largest l with P(B <= l - 1) <= tail
        if binom_cdf(rank - 1, n, q) <= tail:
            lower = rank
        else:
            break
    upper = n + 1
    for rank in range(1, n + 1):  # the smallest u with P(B <= u - 1) >= 1 - tail
        if binom_cdf(rank - 1, n, q) >= 1.0 - tail:
            upper = rank
            break
    return lower, upper


def quantile_interval(
    values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """The interval's bounds; None for a side with no order statistic (unbounded)."""
    xs = sorted(float(v) for v in values)
    lower, upper = quantile_interval_ranks(len(xs), q, confidence)
    lo = xs[lower - 1] if lower >= 1 else None
    hi = xs[upper - 1] if upper <= len(xs) else None
    return lo, hi


def exceedance_upper_bound(n: int, exceedances: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound of the exceedance probability after
    ``exceedances`` of ``n`` runs went over: the p with P(Binomial(n, p) <= k) = 1 - c."""
    if n < 0 or not 0 <= exceedances <= n:
        raise ValueError(f"need 0 <= exceedances <= n, got {exceedances} of {n}")
    if exceedances == n:
        return 1.0
    alpha = 1.0 - confidence
    if exceedances == 0:
        return 1.0 - alpha ** (1.0 / n) if n else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):  # binom_cdf decreases in p
        mid = (lo + hi) / 2.0
        if binom_cdf(exceedances, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def runs_needed(q: float = CERTIFY_QUANTILE, confidence: float = CONFIDENCE) -> int:
    """Runs with no exceedance that show "the q-quantile <= SLO" (59 for p95 at 95 %)."""
    n = 1
    while binom_cdf(0, n, 1.0 - q) > 1.0 - confidence:
        n += 1
    return n


@dataclass
class Certification:
    runs: int
    exceedances: int
    slo_s: float
    certified: bool
    needed: int
    proven_quantile: float  # the quantile the runs show <= SLO at the confidence
    sentence: str
    inconclusive_runs: int = 0

    def to_json(self) -> CertificationJson:
        return {
            "claim": f"p{CERTIFY_QUANTILE * 100:g} <= {self.slo_s:g} s at "
            f"{CONFIDENCE * 100:g} % confidence",
            "certified": self.certified,
            "runs": self.runs,
            "exceedances": self.exceedances,
            "inconclusive_runs": self.inconclusive_runs,
            "runs_needed_without_exceedance": self.needed,
            "proven_quantile": round(self.proven_quantile, 4),
            "sentence": self.sentence,
            "method": "one-sided Clopper-Pearson bound of the exceedance probability",
        }


def certify(
    times: Sequence[float],
    slo_s: float,
    q: float = CERTIFY_QUANTILE,
    confidence: float = CONFIDENCE,
    inconclusive_runs: int = 0,
) -> Certification:
    """What ``times`` (seconds from fault to trip; ``math.inf`` for a missed trip) prove
    about "the q-quantile of time to trip <= slo_s".

    With k of n runs over the SLO, the exceedance probability is at most its one-sided
    Clopper-Pearson upper bound ``p_u`` (``exceedance_upper_bound``); "p95 <= SLO at 95 %
    confidence" holds when ``p_u <= 0.05``. With no exceedance that is ``0.95^n <= 0.05``,
    so n >= 59. Fewer runs prove the weaker claim "the (1 - p_u)-quantile <= SLO", which
    the sentence states.
    """
    n = len(times)
    over = sum(1 for t in times if not t <= slo_s)
    needed = runs_needed(q, confidence)
    p_u = exceedance_upper_bound(n, over, confidence)
    proven = 1.0 - p_u
    ok = n > 0 and p_u <= 1.0 - q + 1e-12
    claim = f"p{q * 100:g} of time to trip <= {slo_s:g} s at {confidence * 100:g} % confidence"
    had = f"{n} run{'s' if n != 1 else ''}, {over} over {slo_s:g} s"
    if inconclusive_runs:
        had += f" ({inconclusive_runs} inconclusive not counted)"
    if ok:
        sentence = f"certified: {claim} ({had})"
    elif n == 0:
        sentence = f"not certified: no conclusive run; {claim} needs >= {needed} runs, none over"
    else:
        shown = math.floor(proven * 1000) / 10
        proves = (
            f"prove at most p{shown:g} <= {slo_s:g} s"
            if shown > 0
            else "prove no quantile <= the SLO"
        )
        more = (
            f"{claim} needs >= {needed} runs with none over"
            if over == 0
            else f"{claim} needs more runs: {over} exceedance(s) already"
        )
        sentence = f"not certified: {had} {proves} at {confidence * 100:g} % confidence; {more}"
    return Certification(n, over, slo_s, ok, needed, proven, sentence, inconclusive_runs)


def ecdf(values: Sequence[float]) -> list[tuple[float, float]]:
    """(x, F(x)) at each distinct finite value, F the share of values <= x (a missed
    trip, inf, keeps F below 1)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    out: list[tuple[float, float]] = []
    for i, x in enumerate(xs, start=1):
        if math.isinf(x):
            break
        if out and out[-1][0] == x:
            out[-1] = (x, i / n)
        else:
            out.append((x, i / n))
    return out


# ---------------------------------------------------------------------------------------
# Cells


def _num(value: float | None) -> float | None:
    if value is None or math.isinf(value) or math.isnan(value):
        return None
    return round(float(value), 4)


def _slo_s(runs: list[ExperimentSummary]) -> float:
    for e in runs:
        for c in e.checks:
            allowed = c.allowed
            ok = isinstance(allowed, int | float) and math.isfinite(allowed) and allowed > 0
            if c.check == "detection_s" and ok and allowed is not None:
                return float(allowed)
    return DEFAULT_DETECTION_SLO_S


@dataclass
class CampaignCell:
    """The runs of one experiment in a campaign (``gameday run --repeat N``: run ``k`` of
    ``router/latency`` lives in ``router/latency@rKK``, a fresh stack and load seed each):
    passes/N, time to trip p50/p95 with a 95 % interval, the worst run, the ECDF.

    A run that should have tripped and did not counts as an infinite time to trip (fail
    closed: a missed trip is the worst run, never left out). An inconclusive run (the gate
    could not have seen) is no evidence either way: it is not one of the N trials the
    statistics use, and the cell says how many there were.
    """

    name: str
    component: str | None
    fault: str | None
    expect: str | None
    runs: list[ExperimentSummary]
    seeds: dict[str, int | None] = field(default_factory=dict)
    certify: bool = False

    @property
    def conclusive(self) -> list[ExperimentSummary]:
        return [e for e in self.runs if e.verdict != "inconclusive"]

    @property
    def passes(self) -> int:
        return sum(e.verdict == "pass" for e in self.runs)

    @property
    def verdict(self) -> str:
        verdicts = {e.verdict for e in self.runs} - {"not_applicable"}
        if not verdicts and self.runs:
            return "not_applicable"
        if not self.runs or verdicts - {"pass", "inconclusive"}:
            return "fail"
        if "inconclusive" in verdicts:
            return "inconclusive"
        if self.certify and self.expect == "trip":
            cert = self.certification()
            if cert.exceedances:
                return "fail"
            if not cert.certified:
                return "inconclusive"
        return "pass"

    def times(self) -> list[float]:
        """Time to trip of each conclusive run; inf for one that should have tripped."""
        out = []
        for e in self.conclusive:
            t = e.timeline.time_to_trip_s if e.timeline.tripped else None
            if t is not None and math.isfinite(t):
                out.append(float(t))
            elif self.expect == "trip":
                out.append(math.inf)
        return out

    def certification(self) -> Certification:
        inconclusive = len(self.runs) - len(self.conclusive)
        return certify(self.times(), _slo_s(self.runs), inconclusive_runs=inconclusive)

    def worst(self) -> ExperimentSummary | None:
        """The slowest (or missed) trip; with no trip expected, the first failed run."""
        if self.expect == "trip":
            best: tuple[float, ExperimentSummary] | None = None
            for e in self.conclusive:
                t = e.timeline.time_to_trip_s if e.timeline.tripped else None
                key = t if t is not None and math.isfinite(t) else math.inf
                if best is None or key > best[0]:
                    best = (key, e)
            return best[1] if best else None
        failed = [e for e in self.runs if e.verdict == "fail"]
        return failed[0] if failed else (self.runs[0] if self.runs else None)

    def to_json(self) -> CampaignCellJson:
        times = self.times()
        stats: TimeToTripJson = {
            "n": len(times),
            "p50": _quantile_json(times, 0.5),
            "p95": _quantile_json(times, 0.95),
        }
        worst = self.worst()
        doc: CampaignCellJson = {
            "experiment": self.name,
            "component": self.component,
            "fault": self.fault,
            "expect": self.expect,
            "verdict": self.verdict,
            "runs": len(self.runs),
            "passes": self.passes,
            "passes_text": f"{self.passes}/{len(self.runs)}",
            "inconclusive_runs": len(self.runs) - len(self.conclusive),
            "tripped_runs": sum(bool(e.timeline.tripped) for e in self.runs),
            "missed_trips": sum(1 for t in times if math.isinf(t)),
            "time_to_trip": stats,
            "worst_run": None
            if worst is None
            else {
                "name": worst.name,
                "verdict": worst.verdict,
                "time_to_trip_s": _num(worst.timeline.time_to_trip_s),
                "tripped": worst.timeline.tripped,
                "load_seed": self.seeds.get(worst.name),
            },
            "ecdf": [[round(x, 4), round(f, 4)] for x, f in ecdf(times)],
            "run_names": [e.name for e in self.runs],
            "load_seeds": [self.seeds.get(e.name) for e in self.runs],
        }
        if self.expect == "trip":
            doc["certification"] = self.certification().to_json() if self.certify else None
        else:
            false_trips = sum(bool(e.timeline.tripped) for e in self.conclusive)
            n = len(self.conclusive)
            doc["false_trip_probability_upper_95"] = (
                round(exceedance_upper_bound(n, false_trips), 4) if n else None
            )
        return doc

    def text(self) -> str:
        """The matrix cell's text: passes/N, p50/p95 with bounds."""
        doc = self.to_json()
        parts = [f"{doc['passes_text']} pass"]
        st = doc["time_to_trip"]
        if self.expect == "trip" and st["n"]:
            for label, _ in QUANTILES:
                v = st[label]["value_s"]
                lo, hi = st[label]["ci95_s"]
                parts.append(f"{label} {_fmt_s(v)} [{_fmt_s(lo, '-inf')}, {_fmt_s(hi, 'inf')}]")
        elif self.expect != "trip":
            parts.append(f"{doc['tripped_runs']} trip(s)")
        return "\n".join(parts)


def _quantile_json(times: list[float], q: float) -> QuantileJson:
    lo, hi = quantile_interval(times, q) if times else (None, None)
    return {
        "value_s": _num(percentile(times, q)) if times else None,
        "ci95_s": [_num(lo), _num(hi)],
        "ci95_unbounded": [lo is None, hi is None or math.isinf(hi)],
    }


def _fmt_s(value: float | None, missing: str = "missed") -> str:
    return missing if value is None else f"{value:.1f} s"


def campaign_cells(
    experiments: list[ExperimentSummary],
    seeds: dict[str, int | None] | None = None,
    certify_slo: bool = False,
) -> list[CampaignCell]:
    """Experiments named ``base@rKK`` grouped by base, in first-seen order."""
    cells: dict[str, CampaignCell] = {}
    for e in experiments:
        base, _ = split_run_name(e.name)
        cell = cells.get(base)
        if cell is None:
            cell = cells[base] = CampaignCell(
                base, e.component, e.fault, e.expect, [], dict(seeds or {}), certify_slo
            )
        cell.runs.append(e)
    return list(cells.values())


def campaign_doc(
    cells: list[CampaignCell], repeat: int, certify_slo: bool, seeds_note: str = ""
) -> CampaignDocJson:
    """summary.json's ``campaign`` section."""
    docs = [c.to_json() for c in cells]
    return {
        "repeat": repeat,
        "certify": certify_slo,
        "percentile_method": PERCENTILE_METHOD,
        "interval_method": INTERVAL_METHOD,
        "missed_trip_counts_as": "infinite time to trip (the worst run)",
        "inconclusive_runs": "not counted among the trials (no evidence either way)",
        "seeds": seeds_note,
        "cells": docs,
        "certification": [
            cert["sentence"] for d in docs if (cert := d.get("certification")) is not None
        ],
    }


def render_ecdf(cell: CampaignCell, path: Path) -> None:
    """A small step plot of the ECDF of time to trip, the SLO and p95 marked."""
    from matplotlib.figure import Figure

    points = ecdf(cell.times())
    fig = Figure(figsize=(3.6, 2.4), layout="constrained")
    ax = fig.subplots()
    if points:
        xs = [points[0][0]] + [x for x, _ in points]
        ys = [0.0] + [f for _, f in points]
        ax.step(xs, ys, where="post", color="#0969da")
    slo = _slo_s(cell.runs)
    ax.axvline(slo, color="#cf222e", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    ax.axhline(CERTIFY_QUANTILE, color="#57606a", linestyle=":", linewidth=1, label="p95")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time from fault to trip (s)", fontsize=8)
    ax.set_ylabel("share of runs", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{cell.name}: ECDF, {len(cell.runs)} runs", fontsize=9)
    fig.savefig(path, dpi=80, format="png", pil_kwargs={"compress_level": 1})


HTML_MARKER = "<!--gameday:campaign-->"  # in report.html.j2, where the campaign section goes


def render_campaign_html(doc: CampaignDocJson | None, images: dict[str, Path]) -> str:
    """The report's campaign section (``""`` for a plain run); ``images``: experiment ->
    its ECDF PNG, embedded as ``data:`` URIs. Autoescaped: names are never HTML."""
    if doc is None:
        return ""
    from gameday.report import jinja

    uris = {name: jinja.data_uri(p) for name, p in images.items() if p.exists()}
    return (
        jinja.environment()
        .get_template("campaign.html.j2")
        .render(doc=doc, images=uris, seconds=_seconds_text)
    )


def _seconds_text(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.2f} s"
