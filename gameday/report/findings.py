"""What the Chaos Toolkit journal says of one experiment: its activities and SLO checks.

Must never trust the journal's shape: every field is checked, and an SLO output whose
``ok`` is not a boolean is a failed check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from canary_contract.json import record_json
from gameday.evidence import journal as journal_core
from gameday.evidence.slo import is_not_applicable, is_not_measured, is_slo
from gameday.report.jsonfields import rounded
from gameday.report.spec import as_dict

JOURNAL_PHASES = (
    ("before", "hypothesis before"),
    ("method", "method"),
    ("after", "hypothesis after"),
    ("rollbacks", "rollbacks"),
)


class SloCheckJson(TypedDict):
    """An SLO check in summary.json (``SloCheck``'s fields)."""

    experiment: str
    check: str
    source: str
    measured: float | None
    allowed: float | None
    unit: str
    ok: bool | None
    note: str
    detail: Mapping[str, object]


@dataclass
class SloCheck:
    experiment: str
    check: str
    source: str
    measured: float | None
    allowed: float | None
    unit: str
    ok: bool | None  # None: could not be measured
    note: str = ""
    detail: Mapping[str, object] = field(default_factory=dict)  # the probe output's

    @property
    def name(self) -> str:
        return f"{self.check} [{self.source}]"

    def sentence(self) -> str:
        if self.measured is None:
            return f"{self.check} ({self.source}): not measured" + (
                f" — {self.note}" if self.note else ""
            )
        verb = "within" if self.ok else "over"
        unit = "" if self.unit in ("ratio", "count") else f" {self.unit}"
        return (
            f"{self.check} ({self.source}): measured {_fmt(self.measured)}{unit}, "
            f"{verb} the allowed {_fmt(self.allowed)}{unit}"
            + (f" — {self.note}" if self.note and not self.ok else "")
        )

    def to_json(self) -> SloCheckJson:
        measured, allowed = rounded(self.measured), rounded(self.allowed)
        return record_json(self, SloCheckJson, measured=measured, allowed=allowed)


@dataclass
class Activity:
    phase: str
    name: str
    kind: str
    status: str
    duration_s: float | None
    error: str | None
    tolerance_met: bool | None


@dataclass
class JournalFindings:
    status: str | None
    reasons: list[str]
    checks: list[SloCheck]
    activities: list[Activity]
    probe_allowed: dict[str, float]
    # "check (probe 'name')" of SLO outputs not measured before the method: not checks.
    not_measured_before: list[str] = field(default_factory=list)


def _fmt(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def journal_findings(experiment: str, journal: Mapping[str, object] | None) -> JournalFindings:
    """The journal's activities and SLO checks; its reasons are ``gameday.evidence.journal``'s
    (the run verdict's, word for word) less those about an SLO result, which become the
    checks instead (each with its own sentence).

    The checks are every SLO probe output in the journal (``{"check", "measured",
    "allowed", "unit", "ok", "detail"}``, from the hypothesis before and after and the
    method). An output with ``detail.status == "not_measured"`` (``measured`` null, ``ok``
    true) from the hypothesis *before* the method is no check at all — nothing could be
    measured yet, the same probe measures after the method — so it is left out of the
    checks (and of junit.xml, summary.json's checks and the HTML table) and only named in
    ``not_measured_before``; the same output anywhere else is a failed check (nothing was
    measured where it should have been).
    """
    if journal is None:
        return JournalFindings(None, [], [], [], {})
    reasons = [f.sentence for f in journal_core.journal_findings(journal) if f.slo is None]
    status = journal.get("status")
    status = status if isinstance(status, str) else None
    states = as_dict(journal.get("steady_states"))
    before, after = as_dict(states.get("before")), as_dict(states.get("after"))
    entries: dict[str, list[object]] = {
        "before": _list(before.get("probes")),
        "method": _list(journal.get("run")),
        "after": _list(after.get("probes")),
        "rollbacks": _list(journal.get("rollbacks")),
    }
    activities: list[Activity] = []
    checks: list[SloCheck] = []
    probe_allowed: dict[str, float] = {}
    not_measured_before: list[str] = []
    for phase, label in JOURNAL_PHASES:
        for run in entries[phase]:
            if not isinstance(run, dict):
                continue
            act = as_dict(run.get("activity"))
            name = str(act.get("name") or "?")
            tol = run.get("tolerance_met") if isinstance(run.get("tolerance_met"), bool) else None
            duration = run.get("duration")
            activities.append(
                Activity(
                    label,
                    name,
                    str(act.get("type") or "?"),
                    str(run.get("status") or "?"),
                    float(duration) if isinstance(duration, int | float) else None,
                    journal_core.last_error(run),
                    tol,
                )
            )
            output = as_dict(run.get("output"))
            if is_slo(output):
                check = _slo_check(experiment, output, f"probe {name!r}, {label}")
                if check.allowed is not None:
                    probe_allowed.setdefault(check.check, check.allowed)
                if is_not_applicable(output):
                    detail = as_dict(output.get("detail"))
                    check.note = str(detail.get("why") or "not applicable to this target")
                if is_not_measured(output):
                    if phase == "before":
                        not_measured_before.append(f"{check.check} (probe {name!r})")
                        continue
                    check.ok = False
                    check.note = (
                        f"the probe measured nothing in the {label} (detail.status "
                        "'not_measured': it saw no load and no fault)"
                    )
                checks.append(check)
    return JournalFindings(status, reasons, checks, activities, probe_allowed, not_measured_before)


def _slo_check(experiment: str, output: Mapping[str, object], source: str) -> SloCheck:
    measured, allowed = rounded(output.get("measured")), rounded(output.get("allowed"))
    ok = output.get("ok")
    detail = as_dict(output.get("detail"))
    return SloCheck(
        experiment=experiment,
        check=str(output.get("check")),
        source=source,
        measured=measured,
        allowed=allowed,
        unit=str(output.get("unit") or ""),
        ok=ok if isinstance(ok, bool) else False,
        note="" if isinstance(ok, bool) else f"the probe's 'ok' is {ok!r}, not a boolean",
        detail=detail,
    )
