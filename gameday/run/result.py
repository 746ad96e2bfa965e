"""What ``gameday run`` writes as one experiment's ``result.json`` (docs/ARCHITECTURE.md
§7.1), key by key: the runner builds it, the terminal shows it, ``run.json`` quotes it.
The report reads the file back as plain JSON (``gameday.report.loader``)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class GateFigures(TypedDict):
    """The gate's counters as ``gate-evidence.json`` holds them (since the experiment's
    start), copied as the gate wrote them."""

    ok: object
    comparisons: object
    canary_outcomes: object
    thresholds: object
    source: object
    error: object
    counted_from: object


class EvidenceFigures(TypedDict):
    """``result.json``'s ``evidence``: the gate's counters and the load's own check."""

    gate: GateFigures | None
    load: dict[str, object] | None  # load.json's summary.generator
    load_workers: object  # every worker's records, by worker (None for one process)


class NoEvidence(TypedDict):
    """``result.json``'s ``evidence`` of an experiment that did not run: ``{}``."""


class StackInfo(TypedDict):
    owned: bool  # the run started (and stopped) the stack itself


class CampaignTrial(TypedDict):
    """Which trial of a campaign (or a run with a seed given) this experiment was."""

    experiment: str
    run: int | None
    of: int
    load_seed: int | None


class ExperimentResult(TypedDict):
    experiment: str
    verdict: str  # gameday.run.verdict: pass | fail | inconclusive | not_applicable
    reasons: list[str]
    chaos_exit_code: int | None
    started_at: float
    ended_at: float
    file: str
    figures: dict[str, object]  # gameday.run.figures: the terminal's key figures
    evidence: EvidenceFigures | NoEvidence
    stack: StackInfo
    campaign: NotRequired[CampaignTrial]
