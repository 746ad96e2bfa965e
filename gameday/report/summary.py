"""The report's summary: every check an experiment has, why it passed or failed, and its
verdict, in summary.json.

Must never pass quietly (fail-closed, DESIGN.md §3): a missing piece, a journal Chaos
Toolkit would accept but a release gate must not, or an unmet SLO fails the experiment.
This module decides and serialises; it never reads files or draws.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from canary_contract.json import record_json
from gameday.evidence import journal as journal_core
from gameday.evidence.journal import BLIND_CHECK, DEVIATED
from gameday.report.figures import KeyFigures, key_figures
from gameday.report.findings import Activity, JournalFindings, SloCheck, SloCheckJson
from gameday.report.findings import journal_findings as journal_findings
from gameday.report.heatmaps import HeatmapData
from gameday.report.jsonfields import dumps_json, rounded
from gameday.report.loader import ExperimentData, RunData
from gameday.report.missing import Missing, MissingJson
from gameday.report.timeline import Timeline


class ExperimentSummaryJson(TypedDict):
    """An experiment in summary.json: ``ExperimentSummary``'s fields up to ``files``, then
    the timeline's trip (the rest only the HTML shows)."""

    name: str
    title: str
    component: str | None
    fault: str | None
    expect: str | None
    verdict: str
    reasons: list[str]
    journal_status: str | None
    checks: list[SloCheckJson]
    not_measured_before_method: list[str]
    missing: list[MissingJson]
    figures: KeyFigures
    notes: list[str]
    files: dict[str, str]
    tripped: bool
    time_to_trip_s: float | None


class CountsJson(TypedDict):
    experiments: int
    experiments_passed: int
    experiments_inconclusive: int
    checks: int
    checks_failed: int
    checks_not_measured: int


class RunFiguresJson(TypedDict):
    """summary.json's ``key_figures``: the run's, over its experiments."""

    requests: int
    failed_requests: int
    time_to_trip_s: dict[str, float | None]
    worst_time_to_trip_s: float | None
    unexpected_trips: list[str]
    missed_trips: list[str]
    canary_requests_after_trip: int


class SummaryJson(TypedDict):
    """summary.json as ``Summary.to_json`` has it (``gameday.report.build`` adds more)."""

    run_id: str
    run_dir: str
    verdict: str
    headline: str
    reasons: list[str]
    generated_at: float
    counts: CountsJson
    key_figures: RunFiguresJson
    checks: list[SloCheckJson]
    experiments: list[ExperimentSummaryJson]
    missing: list[MissingJson]
    files: dict[str, str]
    report_build_s: dict[str, float]


@dataclass(kw_only=True)
class ExperimentSummary:
    """One experiment's verdict: the fields up to ``files`` are its summary.json entry
    (with the timeline's trip), the rest only the HTML shows."""

    name: str
    title: str
    component: str | None
    fault: str | None
    expect: str | None
    verdict: str
    reasons: list[str]
    journal_status: str | None
    checks: list[SloCheck]
    not_measured_before: list[str] = field(default_factory=list)
    missing: list[Missing]
    figures: KeyFigures
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    description: str
    activities: list[Activity]
    timeline: Timeline
    heatmap: HeatmapData | None
    result: Mapping[str, object] | None  # result.json as read

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> ExperimentSummaryJson:
        return record_json(
            self,
            ExperimentSummaryJson,
            checks=[c.to_json() for c in self.checks],
            not_measured_before_method=self.not_measured_before,
            missing=[m.to_json() for m in self.missing],
            tripped=self.timeline.tripped,
            time_to_trip_s=rounded(self.timeline.time_to_trip_s),
        )


@dataclass
class Summary:
    run_id: str
    run_dir: Path
    verdict: str
    headline: str
    reasons: list[str]
    experiments: list[ExperimentSummary]
    missing: list[Missing]
    generated_at: float = field(default_factory=time.time)
    timings_s: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def checks(self) -> list[SloCheck]:
        return [c for e in self.experiments for c in e.checks]

    @property
    def report_html(self) -> Path:
        return self.run_dir / "report.html"

    def all_missing(self) -> list[Missing]:
        return self.missing + [m for e in self.experiments for m in e.missing]

    def to_json(self) -> SummaryJson:
        checks = self.checks
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "verdict": self.verdict,
            "headline": self.headline,
            "reasons": self.reasons,
            "generated_at": self.generated_at,
            "counts": {
                "experiments": len(self.experiments),
                "experiments_passed": sum(e.passed for e in self.experiments),
                "experiments_inconclusive": sum(
                    e.verdict == "inconclusive" for e in self.experiments
                ),
                "checks": len(checks),
                "checks_failed": sum(c.ok is False for c in checks),
                "checks_not_measured": sum(c.ok is None for c in checks),
            },
            "key_figures": self.key_figures(),
            "checks": [c.to_json() for c in checks],
            "experiments": [e.to_json() for e in self.experiments],
            "missing": [m.to_json() for m in self.all_missing()],
            "files": self.files,
            "report_build_s": {k: round(v, 4) for k, v in self.timings_s.items()},
        }

    def key_figures(self) -> RunFiguresJson:
        trips = [
            e.timeline.time_to_trip_s
            for e in self.experiments
            if e.expect == "trip" and e.timeline.time_to_trip_s is not None
        ]
        return {
            "requests": sum(e.figures["requests"] for e in self.experiments),
            "failed_requests": sum(e.figures["failed_requests"] for e in self.experiments),
            "time_to_trip_s": {
                e.name: rounded(e.timeline.time_to_trip_s)
                for e in self.experiments
                if e.timeline.tripped
            },
            "worst_time_to_trip_s": rounded(max(trips)) if trips else None,
            "unexpected_trips": [
                e.name for e in self.experiments if e.expect == "no_trip" and e.timeline.tripped
            ],
            "missed_trips": [
                e.name for e in self.experiments if e.expect == "trip" and not e.timeline.tripped
            ],
            "canary_requests_after_trip": sum(
                e.figures["canary_requests_after_trip"] for e in self.experiments
            ),
        }

    def write_json(self, path: Path) -> None:
        path.write_text(dumps_json(self.to_json()))


# ---------------------------------------------------------------------------------------
# Deciding


def _expect_blind(reasons: list[str], checks: list[SloCheck]) -> tuple[list[str], list[SloCheck]]:
    """``expect: blind`` (the experiment blinds the gate on purpose): a gate_blind check
    that found the gate blind is what it expects, so it counts as met and the deviation it
    caused is no reason; none finding it is the failure (a blind gate went unnoticed)."""
    blind = [c for c in checks if c.check == BLIND_CHECK and c.measured]
    if not blind:
        return [
            *reasons,
            "the experiment expects the harness to find the gate blind, but no "
            f"{BLIND_CHECK!r} check did: a blind gate would have gone unnoticed",
        ], checks
    sources = [c.source.split(",")[0] for c in blind]  # "probe 'name'"
    for c in blind:
        c.ok = True
        c.note = "expected: this experiment blinds the gate on purpose (expect: blind)"
    kept = [
        r
        for r in reasons
        if r != DEVIATED
        and r != "gameday run's verdict is 'pass'"
        and not (r.startswith("steady-state probe ") and any(src[6:] in r for src in sources))
    ]
    return kept, checks


COLOUR_CHECK = "colouring_fidelity"


def _expect_colour_lost(
    reasons: list[str], checks: list[SloCheck], hop: str | None
) -> tuple[list[str], list[SloCheck]]:
    """``expect: colour_lost`` with ``lost_at: HOP`` (the experiment drops the traffic colour
    at HOP on purpose): a colouring check that found the colour lost at HOP is what it
    expects; none finding it is the failure (a lost tag would have gone unnoticed)."""
    found = [
        c
        for c in checks
        if c.check == COLOUR_CHECK and c.ok is False and hop and c.detail.get("lost_at") == hop
    ]
    if not found:
        return [
            *reasons,
            f"the experiment expects the colouring probe to find the colour lost at hop "
            f"{hop!r} (lost_at), but no {COLOUR_CHECK!r} check named it: a lost tag would "
            "have gone unnoticed",
        ], checks
    sources = [c.source.split(",")[0] for c in found]
    for c in found:
        c.ok = True
        c.note = f"expected: this experiment drops the colour at {hop!r} (expect: colour_lost)"
    kept = [
        r
        for r in reasons
        if r != DEVIATED
        and not (r.startswith("steady-state probe ") and any(src[6:] in r for src in sources))
        and not (r.startswith(f"SLO {COLOUR_CHECK!r}") and f"(hop {hop!r} " in r)
    ]
    return kept, checks


def summarise_experiment(
    exp: ExperimentData, findings: JournalFindings, timeline: Timeline, heatmap: HeatmapData | None
) -> ExperimentSummary:
    """One experiment's verdict. It passes only when everything below holds:

    - no piece the verdict depends on is missing (journal.json, result.json, records with
      rows; timeline.json when a trip is expected; the gameday extension);
    - ``result.json`` (what ``gameday run`` decided) says pass;
    - Chaos Toolkit's journal: status ``completed``, not deviated, the steady state met
      before the method, no method or rollback activity failed — Chaos Toolkit exits 0 in
      some of these cases, a release gate must not;
    - every SLO check of the journal is ok (``findings.journal_findings``);
    - the report's own timeline checks (``gameday.report.timeline``): the trip and the
      rollback within their SLOs when a trip is expected, no trip when none is.

    An experiment whose ``result.json`` says ``inconclusive`` (the gate could not have
    seen the fault, or the load generator was not valid: ``gameday.run.sufficiency``) is
    ``inconclusive`` here too, with gameday run's reasons, unless a piece the report needs
    is missing (that fails it); the report's own findings on the gate's merits (journal,
    SLO checks, timeline) are then listed as "not judged", never as the reason it failed.
    """
    reasons: list[str] = []
    inconclusive: list[str] = []
    not_applicable = (exp.result or {}).get("verdict") == "not_applicable"
    if exp.result is not None and not not_applicable:
        verdict = exp.result.get("verdict")
        if verdict == "inconclusive":
            inconclusive = [str(r) for r in exp.result.get("reasons") or []] or [
                "gameday run's verdict is 'inconclusive' (no reason recorded)"
            ]
        elif verdict != "pass":
            listed = [str(r) for r in exp.result.get("reasons") or []]
            reasons.append(
                f"gameday run's verdict is {verdict!r}"
                + (f": {'; '.join(listed)}" if listed else "")
            )
    reasons.extend(findings.reasons)
    checks = list(findings.checks)
    for c in timeline.checks:
        checks.append(
            SloCheck(
                exp.name, c.check, "report timeline", c.measured, c.allowed, c.unit, c.ok, c.note
            )
        )
    spec = exp.spec
    if spec and spec.expect == "blind":
        reasons, checks = _expect_blind(reasons, checks)
    if spec and spec.expect == "colour_lost":
        reasons, checks = _expect_colour_lost(reasons, checks, spec.lost_at)
    if spec and spec.expect == "trip" and not timeline.tripped and exp.timeline is not None:
        reasons.append(journal_core.MISSED_TRIP)
    for check in checks:
        if check.ok is False:
            reasons.append(check.sentence())
    if not_applicable:  # the target lacks what it needs: said, never run, never a pass
        reasons = [str(r) for r in (exp.result or {}).get("reasons") or []]
    # What went wrong first, then what could not be checked.
    incomplete = [f"incomplete: {m.piece} {m.problem}" for m in exp.missing if m.required]
    if inconclusive and not incomplete:
        not_judged = "not judged (the evidence is insufficient): "
        reasons = [
            *inconclusive,
            *(
                r if r.startswith(not_judged) else not_judged + r
                for r in reasons
                if r not in inconclusive
            ),
        ]
        verdict_now = "inconclusive"
    else:  # a missing piece fails it; what made it inconclusive is still said
        reasons.extend(incomplete)
        reasons.extend(f"also inconclusive: {r}" for r in inconclusive)
        verdict_now = "fail" if reasons else "pass"
    if not_applicable:
        verdict_now = "not_applicable"
    notes = list(spec.notes) if spec else []
    notes.extend(timeline.notes)
    if findings.not_measured_before:
        notes.append(
            "Not counted as checks: SLO probes in the hypothesis before the method, where "
            "nothing can be measured yet (the same probes measure after the method): "
            + ", ".join(findings.not_measured_before)
        )
    return ExperimentSummary(
        name=exp.name,
        title=exp.title,
        description=exp.description,
        component=spec.component if spec else None,
        fault=spec.fault if spec else None,
        expect=spec.expect if spec else None,
        verdict=verdict_now,
        reasons=_dedupe(reasons),
        journal_status=findings.status,
        checks=checks,
        activities=findings.activities,
        missing=list(exp.missing),
        figures=key_figures(exp, timeline),
        timeline=timeline,
        heatmap=heatmap,
        result=exp.result,
        notes=notes,
        not_measured_before=list(findings.not_measured_before),
    )


def summarise_run(run: RunData, experiments: list[ExperimentSummary]) -> Summary:
    """The run passes when it has experiments and all of them pass; it fails when one
    fails (fail wins) or its data is incomplete; else it is inconclusive when one is."""
    reasons = [f"incomplete: {m.piece} {m.problem}" for m in run.missing if m.required]
    failed = [e for e in experiments if e.verdict not in ("pass", "inconclusive", "not_applicable")]
    skipped = [e for e in experiments if e.verdict == "not_applicable"]
    unsure = [e for e in experiments if e.verdict == "inconclusive"]
    reasons.extend(
        f"{e.name}: {e.reasons[0]}"
        + (f" (+{len(e.reasons) - 1} more)" if len(e.reasons) > 1 else "")
        for e in failed + unsure
    )
    n = len(experiments)
    s = "s" if n != 1 else ""
    incomplete = any(m.required for m in run.missing)
    if not experiments:
        verdict, headline = "fail", "FAIL — the run has no experiments"
    elif len(skipped) == n:
        verdict, headline = "fail", "FAIL — the run has no experiment this target can run"
    elif failed or incomplete:
        verdict = "fail"
        names = ", ".join(e.name for e in failed)
        headline = f"FAIL — {len(failed)} of {n} experiment{s} failed: {names}"
        if incomplete:
            headline += ("; " if failed else "") + "the run's data is incomplete"
    elif unsure:
        verdict = "inconclusive"
        names = ", ".join(e.name for e in unsure)
        headline = (
            f"INCONCLUSIVE — {len(unsure)} of {n} experiment{s} could not show the gate "
            f"(too little evidence, or the load was not valid): {names}"
        )
    else:
        ran = n - len(skipped)
        verdict, headline = "pass", f"PASS — all {ran} experiment{'s' if ran != 1 else ''} passed"
    if skipped:
        headline += f"; {len(skipped)} not applicable to this target: " + ", ".join(
            e.name for e in skipped
        )
    return Summary(
        run_id=run.run_id,
        run_dir=run.run_dir,
        verdict=verdict,
        headline=headline,
        reasons=reasons,
        experiments=experiments,
        missing=list(run.missing),
    )


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
