"""The whole report: ``build_report(run_dir) -> Summary``, every file at the run folder's top.

Must never change the experiments' own files, never leave half a file (each is written
to a temporary name and renamed) and never raise on partial data (only
``ReportInputError`` for a RUN_DIR that is not a run folder, and OSError when the run
folder cannot be written).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import NotRequired, TypedDict

from gameday.atomic import replace_whole, write_text
from gameday.report.campaign import (
    HTML_MARKER,
    CampaignCell,
    CampaignDocJson,
    campaign_cells,
    campaign_doc,
    render_campaign_html,
    render_ecdf,
)
from gameday.report.findings import journal_findings
from gameday.report.heatmaps import HeatmapData, heatmap_cells, render_heatmaps
from gameday.report.html import render_html
from gameday.report.jsonfields import dumps_json
from gameday.report.junit import write_junit
from gameday.report.loader import ExperimentData, RunData, load_run
from gameday.report.matrix import build_matrix, render_matrix
from gameday.report.noise import (
    ExperimentNoise,
    NoiseSectionJson,
    experiment_noise,
    noise_section,
)
from gameday.report.summary import (
    ExperimentSummary,
    Summary,
    SummaryJson,
    summarise_experiment,
    summarise_run,
)
from gameday.report.timeline import build_timeline
from gameday.report.timeline_figure import render_timeline


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "experiment"


@contextlib.contextmanager
def _phase(timings: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0


def _experiment(
    exp: ExperimentData, bin_s: float | None, timings: dict[str, float]
) -> ExperimentSummary:
    with _phase(timings, "journal"):
        findings = journal_findings(exp.name, exp.journal)
    with _phase(timings, "timeline"):
        timeline = build_timeline(exp, findings.probe_allowed)
    heatmap: HeatmapData | None = None
    with _phase(timings, "heatmap_cells"):
        if len(exp.records) or len(exp.oracle):
            heatmap = heatmap_cells(
                exp.records,
                exp.oracle,
                timeline.reference_time,
                bin_s=bin_s,
                experiment=exp.name,
                reference=timeline.reference,
                markers=timeline.markers,
            )
    with _phase(timings, "verdict"):
        return summarise_experiment(exp, findings, timeline, heatmap)


# What a dependency experiment (experiments/dependency/, issue #16) leaves in its folder
# (probes.dependency): the fault window and what users saw before, during and after it.
DEPENDENCY_FILE = "dependency.json"
DEPENDENCY_COMPONENT = "dependency"
PHASES = ("before", "during", "after")
VARIANTS = ("baseline", "canary")


class PhaseStatsJson(TypedDict):
    """What users of one variant saw in one phase of a dependency fault."""

    requests: int | None
    errors: int | None
    error_rate: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class DependencyJson(TypedDict):
    """One dependency experiment in summary.json's ``dependency``: the verdict's side,
    then ``problem`` when dependency.json cannot be read, else what it says (its open
    parts, ticks and the model's results, copied as probes.dependency wrote them)."""

    name: str
    fault: str | None
    expect: str | None
    tripped: bool
    time_to_trip_s: float | None
    gate_as_expected: bool | None
    verdict: str
    problem: NotRequired[str]
    dependency_fault: NotRequired[object]
    fault_s: NotRequired[float | None]
    recovery_s: NotRequired[float | None]
    recovery_rule: NotRequired[object]
    max_e2e_s: NotRequired[float | None]
    unhealthy_ticks: NotRequired[object]
    watch_ticks: NotRequired[object]
    model_dependency_results: NotRequired[object]
    phases: NotRequired[dict[str, dict[str, PhaseStatsJson]]]


class NoiseLineJson(TypedDict):
    """summary.json's ``noise_floor`` (``noise.noise_section`` less its experiments, which
    each experiment's figures hold)."""

    line: str
    measured: int
    experiments_count: int
    not_measured: list[str]


class FullSummaryJson(SummaryJson):
    """summary.json as written: the summary, the noise floor's line, the campaign (if
    any), the dependency experiments (if any)."""

    noise_floor: NoiseLineJson
    campaign: NotRequired[CampaignDocJson]
    dependency: NotRequired[list[DependencyJson]]


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _object(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _phase_stats(doc: Mapping[str, object], phase: str, variant: str) -> PhaseStatsJson:
    stats = _object(_object(doc.get(phase)).get(variant))
    return {
        "requests": _whole(stats.get("requests")),
        "errors": _whole(stats.get("errors")),
        "error_rate": _finite(stats.get("error_rate")),
        "ttft_p50_s": _finite(stats.get("ttft_p50_s")),
        "ttft_p99_s": _finite(stats.get("ttft_p99_s")),
    }


def dependency_section(run: RunData, experiments: list[ExperimentSummary]) -> list[DependencyJson]:
    """Per dependency experiment: errors and TTFT per variant before, during and after the
    fault, the time to recover, and whether the gate stayed quiet or tripped as the
    experiment expects. An experiment whose dependency.json is missing or unreadable is
    listed with ``problem`` saying so (never left out)."""
    folders = {e.name: e.path for e in run.experiments}
    out = []
    for e in experiments:
        if e.component != DEPENDENCY_COMPONENT:
            continue
        entry: DependencyJson = {
            "name": e.name,
            "fault": e.fault,
            "expect": e.expect,
            "tripped": e.timeline.tripped,
            "time_to_trip_s": _finite(e.timeline.time_to_trip_s),
            "gate_as_expected": (e.expect == "trip") == bool(e.timeline.tripped)
            if e.expect in ("trip", "no_trip")
            else None,
            "verdict": e.verdict,
        }
        path = folders[e.name] / DEPENDENCY_FILE if e.name in folders else None
        try:
            doc = json.loads(path.read_text()) if path is not None else None
        except (OSError, ValueError) as exc:
            doc = None
            entry["problem"] = f"{DEPENDENCY_FILE}: {exc}"
        if not isinstance(doc, dict):
            entry.setdefault("problem", f"{DEPENDENCY_FILE} is missing or not an object")
            out.append(entry)
            continue
        fault = _object(doc.get("fault"))
        start, end = _finite(fault.get("start")), _finite(fault.get("end"))
        entry["dependency_fault"] = fault.get("kind")
        entry["fault_s"] = round(end - start, 3) if start is not None and end is not None else None
        entry["recovery_s"] = _finite(doc.get("recovery_s"))
        entry["recovery_rule"] = doc.get("recovery_rule")
        entry["max_e2e_s"] = _finite(doc.get("max_e2e_s"))
        entry["unhealthy_ticks"] = doc.get("unhealthy_ticks") or {}
        entry["watch_ticks"] = doc.get("watch_ticks")
        entry["model_dependency_results"] = doc.get("model_dependency_results") or {}
        entry["phases"] = {ph: {v: _phase_stats(doc, ph, v) for v in VARIANTS} for ph in PHASES}
        out.append(entry)
    return out


def build_report(
    run_dir: str | Path, *, bin_s: float | None = None, prometheus_url: str | None = None
) -> Summary:
    """Build every report file into ``run_dir``; returns the verdict and what it rests on.

    ``bin_s``: heatmap bin width in seconds (default: chosen from the run's length, a
    few seconds for a normal experiment). ``prometheus_url``: a Prometheus that scraped
    the stack (``gameday run --prometheus``); each experiment folder then also gets its
    series (``prometheus.csv``/``.png``, or ``prometheus.missing.txt`` saying what could
    not be had) beside the Locust records.

    It reads the run folder, computes each experiment's timeline, heatmap cells, checks
    and verdict, draws the figures and writes, at the run folder's top::

        summary.json            the verdict, every check (measured vs allowed), key
                                figures (each experiment's ``figures.noise_floor``: what
                                its gate measured), and ``noise_floor``: "> 0 in N/M"
        junit.xml               one test case per experiment and per SLO check
        report.html             self-contained (figures embedded)
        timeline.json           every experiment's milestones, checks and markers
        matrix.png, matrix.csv  the game day matrix (when the run has any experiment)
        timeline-<exp>.png      per experiment
        heatmap-<exp>.png, heatmap-<exp>.csv   the heatmaps and each cell's numbers

    ``<exp>`` is the experiment's folder name with ``/`` as ``-``. ``gameday run`` calls
    this at the end of a run; ``gameday report`` from the shell. The returned ``Summary``
    carries the seconds each phase took (``timings_s``).
    """
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with _phase(timings, "load"):
        run = load_run(run_dir)
    root = run.run_dir
    experiments = [_experiment(exp, bin_s, timings) for exp in run.experiments]
    if prometheus_url:
        from gameday.report.prometheus import add_series

        with _phase(timings, "prometheus"):
            add_series(run.experiments, prometheus_url)
    summary = summarise_run(run, experiments)
    dependency = dependency_section(run, experiments)
    with _phase(timings, "noise_floor"):
        noise = [experiment_noise(exp.name, exp.path) for exp in run.experiments]
    noise_doc = noise_section(noise)
    for e, n in zip(experiments, noise, strict=True):
        e.figures["noise_floor"] = n.to_json()
    campaign = _campaign(run.run_info, experiments)
    if campaign is not None:
        _campaign_verdict(summary, campaign)

    with _phase(timings, "figures"):
        images = _draw_figures(root, summary, experiments, campaign, noise)
    with _phase(timings, "data_files"):
        _write_data_files(root, summary, experiments)

    doc = None if campaign is None else _campaign_json(run.run_info, campaign)
    with _phase(timings, "junit"):
        replace_whole(root / "junit.xml", partial(write_junit, summary, campaign=doc))
    timings["total"] = time.perf_counter() - started
    with _phase(timings, "html"):
        replace_whole(
            root / "report.html",
            partial(_render_html, summary, images, doc, dependency, noise, noise_doc),
        )
    timings["total"] = time.perf_counter() - started
    summary.timings_s = timings
    _write_summary_json(root, summary, noise_doc, doc, dependency)
    return summary


def _draw_figures(
    root: Path,
    summary: Summary,
    experiments: list[ExperimentSummary],
    campaign: list[CampaignCell] | None,
    noise: list[ExperimentNoise],
) -> dict[str, Path]:
    """Every figure into ``root`` (each experiment's timeline and heatmap, a campaign
    cell's ECDF, the game day matrix and its CSV), named in ``files``; the figures by
    key (``timeline:<name>``, ``heatmap:<name>``, ``ecdf:<cell>``, ``matrix``)."""
    images: dict[str, Path] = {}
    for e in experiments:
        name = slug(e.name)
        tl_png = root / f"timeline-{name}.png"
        replace_whole(tl_png, partial(render_timeline, e.timeline, title=f"{e.name}: timeline"))
        images[f"timeline:{e.name}"] = tl_png
        e.files["timeline_png"] = tl_png.name
        if e.heatmap is not None:
            hm_png = root / f"heatmap-{name}.png"
            title = f"{e.name}: {e.title}"
            replace_whole(hm_png, partial(render_heatmaps, e.heatmap, title=title))
            images[f"heatmap:{e.name}"] = hm_png
            e.files["heatmap_png"] = hm_png.name
    if campaign is not None:
        for cell in campaign:
            ecdf_png = root / f"ecdf-{slug(cell.name)}.png"
            replace_whole(ecdf_png, partial(render_ecdf, cell))
            images[f"ecdf:{cell.name}"] = ecdf_png
            summary.files[f"ecdf_png:{cell.name}"] = ecdf_png.name
    if experiments:
        matrix = build_matrix(experiments, campaign, noise={n.name: n for n in noise})
        replace_whole(root / "matrix.png", partial(render_matrix, matrix))
        replace_whole(root / "matrix.csv", partial(matrix.to_csv, index=False))
        images["matrix"] = root / "matrix.png"
        summary.files.update({"matrix_png": "matrix.png", "matrix_csv": "matrix.csv"})
    return images


def _write_data_files(root: Path, summary: Summary, experiments: list[ExperimentSummary]) -> None:
    """Each heatmap's cells as CSV and every experiment's ``timeline.json`` into ``root``;
    ``files`` names them and the files written after (summary, JUnit, HTML)."""
    for e in experiments:
        if e.heatmap is not None:
            csv = root / f"heatmap-{slug(e.name)}.csv"
            replace_whole(csv, partial(e.heatmap.cells.to_csv, index=False, float_format="%.6g"))
            e.files["heatmap_csv"] = csv.name
    timeline_doc = {
        "run_id": summary.run_id,
        "experiments": {e.name: e.timeline.to_json() for e in experiments},
    }
    write_text(root / "timeline.json", dumps_json(timeline_doc))
    summary.files.update(
        {
            "timeline_json": "timeline.json",
            "summary_json": "summary.json",
            "junit_xml": "junit.xml",
            "report_html": "report.html",
        }
    )


def _write_summary_json(
    root: Path,
    summary: Summary,
    noise_doc: NoiseSectionJson,
    campaign: CampaignDocJson | None,
    dependency: list[DependencyJson],
) -> None:
    """``summary.json``: the summary with the noise floor, the campaign (if any) and the
    dependency experiments (if any)."""
    full: FullSummaryJson = {
        **summary.to_json(),
        "noise_floor": {  # each experiment's floor is in its figures
            "line": noise_doc["line"],
            "measured": noise_doc["measured"],
            "experiments_count": noise_doc["experiments_count"],
            "not_measured": noise_doc["not_measured"],
        },
    }
    if campaign is not None:
        full["campaign"] = campaign
    if dependency:
        full["dependency"] = dependency
    write_text(root / "summary.json", dumps_json(full))


def _render_html(
    summary: Summary,
    images: dict[str, Path],
    campaign: CampaignDocJson | None,
    dependency: list[DependencyJson],
    noise: list[ExperimentNoise],
    noise_doc: NoiseSectionJson,
    path: Path,
) -> None:
    """report.html, with the campaign section (if any) where the template marks it."""
    render_html(summary, images, path, dependency=dependency, noise=noise, noise_doc=noise_doc)
    ecdfs = {k.split(":", 1)[1]: p for k, p in images.items() if k.startswith("ecdf:")}
    section = render_campaign_html(campaign, ecdfs)
    html = path.read_text(encoding="utf-8")
    path.write_text(html.replace(HTML_MARKER + "\n", section, 1), encoding="utf-8")


def _campaign_info(run_info: Mapping[str, object] | None) -> Mapping[str, object] | None:
    info = (run_info or {}).get("campaign")
    return info if isinstance(info, dict) else None


def _campaign(
    run_info: Mapping[str, object] | None, experiments: list[ExperimentSummary]
) -> list[CampaignCell] | None:
    """The campaign's cells, when run.json says the run was one (``gameday run --repeat``
    or ``--certify``); None for a plain run, whose report stays as it was."""
    info = _campaign_info(run_info)
    if info is None:
        return None
    seeds = info.get("load_seeds")
    seeds = (
        {str(k): v if isinstance(v, int) else None for k, v in seeds.items()}
        if isinstance(seeds, dict)
        else {}
    )
    return campaign_cells(experiments, seeds, certify_slo=info.get("certify") is True)


def _campaign_json(
    run_info: Mapping[str, object] | None, cells: list[CampaignCell]
) -> CampaignDocJson:
    info = _campaign_info(run_info) or {}
    repeat = info.get("repeat")
    return campaign_doc(
        cells,
        repeat if isinstance(repeat, int) else 0,
        info.get("certify") is True,
        seeds_note=str(info.get("order") or ""),
    )


def _campaign_verdict(summary: Summary, cells: list[CampaignCell]) -> None:
    """A campaign cell's verdict joins the run's (fail wins, then inconclusive): with
    --certify, an exceedance fails the run, too few runs make it inconclusive."""
    sentences = [c.certification().sentence for c in cells if c.certify and c.expect == "trip"]
    summary.reasons.extend(sentences)
    verdicts = {c.verdict for c in cells}
    if "fail" in verdicts and summary.verdict != "fail":
        failed = [c.name for c in cells if c.verdict == "fail"]
        summary.verdict = "fail"
        summary.headline = f"FAIL — campaign cell(s) failed: {', '.join(failed)}"
    elif "inconclusive" in verdicts and summary.verdict == "pass":
        unsure = [c for c in cells if c.verdict == "inconclusive"]
        summary.verdict = "inconclusive"
        summary.headline = (
            f"INCONCLUSIVE — {len(unsure)} campaign cell(s) not certified: "
            + "; ".join(c.certification().sentence for c in unsure)
        )
