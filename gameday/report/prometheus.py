"""Prometheus series for the report, beside the Locust records (#15 item 5).

Must never raise on what Prometheus answers (an unreachable Prometheus, a refused query
or an empty window is a problem string, and ``prometheus.missing.txt``), so a report is
still built; it only reads Prometheus.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from gameday.api import PROMETHEUS_RANGE_TIMEOUT_S
from gameday.atomic import replace_whole, write_text
from gameday.sessions import given_or_own

if TYPE_CHECKING:
    from gameday.report.loader import ExperimentData

CSV_NAME = "prometheus.csv"
PNG_NAME = "prometheus.png"
MISSING_NAME = "prometheus.missing.txt"
MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series

# name -> (PromQL with {rate} for the rate window, unit)
SERIES: dict[str, tuple[str, str]] = {
    "router_ttft_p50": (
        "histogram_quantile(0.5, sum by (variant, le) (rate(router_ttft_seconds_bucket[{rate}])))",
        "s",
    ),
    "router_ttft_p99": (
        "histogram_quantile(0.99, sum by (variant, le) (rate(router_ttft_seconds_bucket[{rate}])))",
        "s",
    ),
    "model_ttft_p99": (
        "histogram_quantile(0.99, sum by (variant, le) "
        "(rate(vllm:time_to_first_token_seconds_bucket[{rate}])))",
        "s",
    ),
    "router_requests": ("sum by (variant) (rate(router_requests_total[{rate}]))", "req/s"),
    "router_error_ratio": (
        'sum by (variant) (rate(router_requests_total{status=~"5.."}[{rate}])) '
        "/ sum by (variant) (rate(router_requests_total[{rate}]))",
        "ratio",
    ),
    "canary_weight": ("max(router_canary_weight_percent)", "%"),
}


@dataclass(frozen=True)
class Point:
    series: str
    variant: str
    time: float
    value: float | None  # None: Prometheus answered NaN or +-Inf


@dataclass
class SeriesResult:
    points: list[Point] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def _finite(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def query_range(
    url: str,
    expr: str,
    start: float,
    end: float,
    step_s: float,
    *,
    session: requests.Session | None = None,
) -> list[tuple[dict[str, str], list[tuple[float, float | None]]]]:
    """``/api/v1/query_range``: each series' labels and (time, value) points. Raises
    ``ValueError`` naming the query when Prometheus cannot be reached or says no. Over
    ``session`` when given, else over a short-lived one of its own."""
    endpoint = f"{url.rstrip('/')}/api/v1/query_range"
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
    try:
        with given_or_own(session) as http:
            resp = http.post(endpoint, data=params, timeout=PROMETHEUS_RANGE_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ValueError(f"cannot reach Prometheus at {endpoint}: {type(exc).__name__}") from None
    try:
        body = json.loads(resp.content)
    except ValueError:
        raise ValueError(
            f"Prometheus at {endpoint} answered HTTP {resp.status_code} with no JSON"
        ) from None
    if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        err = body.get("error", "") if isinstance(body, dict) else ""
        raise ValueError(f"Prometheus refused {expr!r}: HTTP {resp.status_code} {err}".rstrip())
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ValueError(f"Prometheus answered {expr!r} with a {data.get('resultType')!r}")
    out = []
    for s in data.get("result") or []:
        labels = {str(k): str(v) for k, v in (s.get("metric") or {}).items()}
        points = [(float(t), _finite(v)) for t, v in s.get("values") or []]
        out.append((labels, points))
    return out


def collect(
    url: str,
    start: float,
    end: float,
    step_s: float = 1.0,
    rate_window_s: float = 10.0,
    series: dict[str, tuple[str, str]] | None = None,
    *,
    session: requests.Session | None = None,
) -> SeriesResult:
    """Every series of ``series`` (default ``SERIES``) over ``start``..``end``, over
    ``session`` when given, else over one short-lived session of its own."""
    res = SeriesResult()
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        res.problems.append(f"no window to query: start {start!r}, end {end!r}")
        return res
    if not 0 < step_s < float("inf") or not 0 < rate_window_s < float("inf"):
        res.problems.append(
            f"step_s and rate_window_s must be positive seconds, got {step_s!r} and "
            f"{rate_window_s!r}"
        )
        return res
    step = max(step_s, (end - start) / MAX_POINTS)
    rate = f"{max(1, round(rate_window_s))}s"
    with given_or_own(session) as http:
        for name, (template, _unit) in (series or SERIES).items():
            expr = template.replace("{rate}", rate)
            try:
                found = query_range(url, expr, start, end, step, session=http)
            except ValueError as exc:
                res.problems.append(f"{name}: {exc}")
                if "cannot reach" in str(exc):
                    break  # every other query would say the same
                continue
            if not found:
                res.problems.append(f"{name}: no series in the window ({expr})")
            for labels, points in found:
                variant = labels.get("variant", "all")
                res.points.extend(Point(name, variant, t, v) for t, v in points)
    return res


def write_csv(points: Sequence[Point], path: Path) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["series", "variant", "time", "value"])
            for p in points:
                value = "" if p.value is None else p.value
                w.writerow([p.series, p.variant, f"{p.time:.3f}", value])

    replace_whole(path, write)


def render_figure(points: Sequence[Point], path: Path, start: float, title: str) -> None:
    from matplotlib.figure import Figure

    names = [n for n in SERIES if any(p.series == n for p in points)]
    names += sorted({p.series for p in points} - set(names))
    fig = Figure(figsize=(10, 1.9 * max(1, len(names)) + 0.8))
    axes = fig.subplots(max(1, len(names)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names, strict=False):
        unit = SERIES.get(name, ("", ""))[1]
        for variant in sorted({p.variant for p in points if p.series == name}):
            pts = [p for p in points if p.series == name and p.variant == variant]
            xs = [p.time - start for p in pts]
            ys = [math.nan if p.value is None else p.value for p in pts]  # gaps, not zeros
            ax.plot(xs, ys, label=variant, lw=1.2)
        ax.set_ylabel(f"{name}\n({unit})" if unit else name, fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the experiment started")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    replace_whole(path, partial(fig.savefig, dpi=90))


def write_series(
    folder: Path,
    url: str,
    start: float,
    end: float,
    step_s: float = 1.0,
    rate_window_s: float = 10.0,
    title: str = "Prometheus series",
    *,
    session: requests.Session | None = None,
) -> SeriesResult:
    """Query ``url`` for ``start``..``end`` and write prometheus.csv and prometheus.png
    into ``folder`` (and prometheus.missing.txt listing what could not be had)::

        prometheus.csv   series,variant,time,value   (value empty where Prometheus
                         answered NaN/Inf: no figure, e.g. a quantile over a second with
                         no request)
        prometheus.png   one panel per series, one line per variant, time since ``start``

    The series (``SERIES``) are what the gate is judged on, from the components' own
    metrics: TTFT p50/p99 at the router and at the model servers, requests/s and the 5xx
    ratio per variant, and the routers' canary weight.
    """
    folder = Path(folder)
    res = collect(url, start, end, step_s, rate_window_s, session=session)
    missing = folder / MISSING_NAME
    if res.points:
        write_csv(res.points, folder / CSV_NAME)
        render_figure(res.points, folder / PNG_NAME, start, title)
        res.files += [folder / CSV_NAME, folder / PNG_NAME]
    if res.problems:
        write_text(missing, "\n".join(res.problems) + "\n")
        res.files.append(missing)
    elif missing.exists():
        missing.unlink()
    return res


def add_series(
    experiments: Iterable[ExperimentData],
    url: str,
    step_s: float = 1.0,
    rate_window_s: float = 10.0,
) -> dict[str, SeriesResult]:
    """``write_series`` for each experiment, over its own window (journal start..end)."""
    out: dict[str, SeriesResult] = {}
    for exp in experiments:
        start, end = exp.window_start(), exp.window_end()
        if start is None or end is None:
            res = SeriesResult(problems=[f"{exp.name}: no start/end time in the journal"])
        elif not exp.path.is_dir():
            res = SeriesResult(problems=[f"{exp.name}: no experiment folder {exp.path}"])
        else:
            res = write_series(exp.path, url, start, end, step_s, rate_window_s,
                               title=f"{exp.name}: Prometheus series")  # fmt: skip
        out[exp.name] = res
    return out


def add_run_series(
    run_dir: Path, url: str, step_s: float = 1.0, rate_window_s: float = 10.0
) -> dict[str, SeriesResult]:
    """``add_series`` for every experiment of the run folder."""
    from gameday.report.loader import load_run

    return add_series(load_run(run_dir).experiments, url, step_s, rate_window_s)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m gameday.report.prometheus",
        description="Write prometheus.csv/.png into each experiment folder of a run.",
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--prometheus", required=True, help="Prometheus URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--rate-window-s", type=float, default=10.0)
    args = p.parse_args(argv)
    results = add_run_series(args.run_dir, args.prometheus, args.step_s, args.rate_window_s)
    for name, res in results.items():
        print(f"{name}: {len(res.points)} points; " + ("; ".join(res.problems) or "complete"))
    return 0 if results and all(r.points for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
