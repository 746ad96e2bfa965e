"""One experiment's verdict, decided fail-closed from what the run left behind.

This module decides; it reads nothing from disk and talks to nothing
(``gameday.run.runner`` gathers the inputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gameday.evidence.journal import (
    BLIND_CHECK,
    BLIND_PREFIX,
    DEVIATED,
    MISSED_TRIP,
    gameday_extension,
    journal_reasons,
    unexpected_trips,
)

__all__ = [
    "BLIND_CHECK",
    "BLIND_PREFIX",
    "DEVIATED",
    "FAIL",
    "INCONCLUSIVE",
    "NOT_APPLICABLE",
    "PASS",
    "Evidence",
    "decide",
    "gameday_extension",
    "journal_reasons",
]

EXPECTS = ("trip", "no_trip", "blind", "colour_lost")
# probes.colouring's check: for expect: colour_lost (lost_at: HOP), its findings naming HOP
# are what the experiment expects.
COLOUR_CHECK = "colouring_fidelity"
COLOUR_SLO = f"SLO {COLOUR_CHECK!r} ("
COLOUR_UNSEEN = "the experiment expects the colouring probe to find the colour lost at hop"
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
# The target lacks what the experiment needs (gameday.run.capabilities): said, not run.
NOT_APPLICABLE = "not_applicable"
NOT_JUDGED = "not judged (the evidence is insufficient): "
# Reasons of journal_reasons that are failures of the run itself, whatever the evidence.
_HARD_JOURNAL_PREFIXES = (
    "no journal.json",
    "Chaos Toolkit's status is",
    "the steady state was not met before the method",
    "the steady-state hypothesis did not run",
    "the method did not run",
    "only ",
    "rollback ",
    BLIND_PREFIX,
    "the experiment expects the harness to find the gate blind",
    COLOUR_UNSEEN,
)


@dataclass
class Evidence:
    """Everything the verdict of one experiment looks at."""

    chaos_exit_code: int | None  # None: chaos never started or was killed
    journal: Mapping[str, object] | None  # journal.json as chaos wrote it
    records_rows: int | None  # None: no records file, or unreadable
    trips_in_window: int | None  # None: the broker's history could not be read
    interrupted: str | None = None  # "SIGINT" etc. when the run was interrupted
    timed_out_s: float | None = None
    setup_error: str | None = None  # the stack did not start, the target is wrong...
    faults_left: list[str] = field(default_factory=list)
    load_problem: str | None = None
    # Why the gate could not have seen, or the load is not valid (gameday.run.sufficiency);
    # None: not assessed, which is itself inconclusive (fail-closed).
    inconclusive: list[str] | None = None
    # Answers users got from the faulty canary after its fault (gameday.run.external);
    # None: no canary fault in the run.
    exposed: int | None = None


def _hard_journal_reason(reason: str) -> bool:
    return reason.startswith(_HARD_JOURNAL_PREFIXES) or "before the method" in reason


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _blind_expected(reasons: list[str]) -> list[str]:
    """For ``expect: blind`` (an experiment that makes the gate blind on purpose, to show
    the harness notices): the blindness findings are what it expects, so they and the
    deviation they cause are not reasons to fail; their absence is."""
    found = [r for r in reasons if r.startswith(BLIND_PREFIX)]
    if not found:
        return [
            *reasons,
            "the experiment expects the harness to find the gate blind, but every "
            f"{BLIND_CHECK!r} check passed: a blind gate would have gone unnoticed",
        ]
    return [r for r in reasons if r not in found and r != DEVIATED]


def _colour_lost_expected(reasons: list[str], hop: str) -> list[str]:
    """For ``expect: colour_lost`` with ``lost_at: HOP`` (an experiment that drops the
    traffic tag at HOP on purpose): the colouring findings that name HOP, and the deviation
    they cause, are what it expects; their absence is the failure. A finding naming another
    hop stays a reason."""
    found = [r for r in reasons if r.startswith(COLOUR_SLO) and f"(hop {hop!r} " in r]
    if not hop or not found:
        return [
            *reasons,
            f"{COLOUR_UNSEEN} {hop!r} (lost_at), but no {COLOUR_CHECK!r} check named it: "
            "a lost tag would have gone unnoticed",
        ]
    return [r for r in reasons if r not in found and r != DEVIATED]


def decide(evidence: Evidence) -> tuple[str, list[str]]:
    """``("pass", [])``, ``("fail", reasons)`` or ``("inconclusive", reasons)``.

    Chaos Toolkit's exit code is not enough: ``chaos run`` exits 0 when the steady state was
    not met before the method (the method never ran) and when a method activity raised
    (docs: ../shared/MEASURED.md). An experiment passes only when all of this holds:

    - ``chaos run`` exited 0 on its own (not interrupted, not timed out, not killed);
    - the journal exists, its status is ``completed`` and it did not deviate;
    - the steady state was met before the method and after it (every hypothesis probe ran
      and was within its tolerance);
    - the method ran, and every activity in it succeeded; every rollback succeeded;
    - every SLO result in the journal (``{"check", "measured", "allowed", "ok", ...}``) is ok;
    - the experiment says what it expects (the ``gameday`` extension), and the broker's
      history agrees: a trip when it expects one, none when it does not;
    - the gate could see (``probes.slo.gate_sees_every_router``): a blind gate fails the run
      with a reason that starts "the gate was blind". An experiment that blinds the gate on
      purpose says ``expect: blind`` and passes only when the harness noticed;
    - users were there: the load records exist and have rows;
    - no fault of the run is left active (those not cleared expire by their TTL, but the run
      says so and fails).

    An experiment is ``inconclusive`` (never a pass; ``gameday run`` exits 3) when the gate
    could not have seen the fault or the load generator's run is not valid
    (``Evidence.inconclusive``, from ``gameday.run.sufficiency``): too few baseline-canary
    comparisons or canary outcomes, a starved or late Locust. Then the gate's merits — a
    trip or none, the SLOs, a deviation, Chaos Toolkit's exit code after one — are not
    judged (they are listed as "not judged: ..."). Failures of the run itself still fail it
    (fail wins): the stack or target could not be prepared, an interruption, a timeout, a
    killed chaos, a missing journal or extension, a steady state unmet before the method, a
    failed rollback, a blind gate, an unreadable broker history, Locust left running or
    failed, no load records, a fault left active.

    Each reason is a sentence a person can act on (the journal's come from
    ``gameday.evidence.journal``, which the report uses too).
    """
    ev = evidence
    # hard: failures of the run itself, they fail it whatever the evidence; merit: the
    # gate's merits, judged only when the gate could have seen.
    hard, merit = _run_reasons(ev)
    journal: list[str] = []
    if not ev.setup_error or ev.journal is not None:
        journal = journal_reasons(ev.journal)
    ext, expect, problems = _expectation(ev)
    hard += problems
    journal, merit = _expected_findings(ev, ext, expect, journal, merit)
    for reason in journal:
        (hard if _hard_journal_reason(reason) else merit).append(reason)
    history_hard, history_merit = _trip_reasons(ev, expect)
    hard += [*history_hard, *_leftover_reasons(ev)]
    merit += history_merit
    return _verdict(ev, hard, merit)


def _run_reasons(ev: Evidence) -> tuple[list[str], list[str]]:
    """How the run itself went, as (hard, merit) reasons: the setup, an interruption, a
    timeout, a killed ``chaos run`` or its exit code (a merit when it is 1 after a completed
    experiment: a deviation or a failed activity)."""
    hard: list[str] = []
    merit: list[str] = []
    if ev.setup_error:
        hard.append(ev.setup_error)
    if ev.interrupted:
        hard.append(f"the run was interrupted ({ev.interrupted}) during this experiment")
    if ev.timed_out_s is not None:
        hard.append(
            f"the experiment did not finish within {ev.timed_out_s:g} s and was stopped "
            "(raise --experiment-timeout-s if it needs longer)"
        )
    completed = ev.journal is not None and ev.journal.get("status") == "completed"
    if ev.chaos_exit_code is None and not ev.setup_error:
        hard.append("chaos run did not exit by itself (it was killed)")
    elif ev.chaos_exit_code not in (None, 0):
        # chaos exits 1 after a deviation or a failed activity of a completed experiment
        (merit if completed and ev.chaos_exit_code == 1 else hard).append(
            f"chaos run exited with code {ev.chaos_exit_code}"
        )
    return hard, merit


def _expectation(ev: Evidence) -> tuple[Mapping[str, object] | None, Any, list[str]]:
    """The experiment's ``gameday`` extension, what it expects, and the hard reasons when
    a journal has no extension or the extension expects something unknown."""
    problems: list[str] = []
    experiment = _dict(ev.journal.get("experiment")) if ev.journal else None
    ext = gameday_extension(experiment) if experiment is not None else None
    if ev.journal is not None and ext is None:
        problems.append(
            "the experiment has no 'gameday' extension saying what it expects "
            "(docs/ARCHITECTURE.md §7.1)"
        )
    expect = ext.get("expect") if ext else None
    if ext is not None and expect not in EXPECTS:
        problems.append(
            f"the gameday extension's expect is {expect!r}: use one of {', '.join(EXPECTS)}"
        )
    return ext, expect, problems


def _expected_findings(
    ev: Evidence,
    ext: Mapping[str, object] | None,
    expect: Any,
    journal: list[str],
    merit: list[str],
) -> tuple[list[str], list[str]]:
    """For ``expect: blind`` and ``expect: colour_lost``: the journal's reasons without the
    findings the experiment expects (``_blind_expected``, ``_colour_lost_expected``), and
    the merits without chaos's exit code 1 for the deviation those findings caused."""
    if expect == "blind":
        blind_found = any(r.startswith(BLIND_PREFIX) for r in journal)
        journal = _blind_expected(journal)
        if blind_found and ev.journal is not None and ev.journal.get("deviated") is True:
            # chaos exits 1 for the deviation the blindness caused: expected here too.
            merit = [r for r in merit if r != "chaos run exited with code 1"]
    if expect == "colour_lost":
        lost_found = any(r.startswith(COLOUR_SLO) for r in journal)
        journal = _colour_lost_expected(journal, str(_dict(ext).get("lost_at") or ""))
        if lost_found and ev.journal is not None and ev.journal.get("deviated") is True:
            merit = [r for r in merit if r != "chaos run exited with code 1"]
    return journal, merit


def _trip_reasons(ev: Evidence, expect: Any) -> tuple[list[str], list[str]]:
    """What the broker's history says, as (hard, merit) reasons: unreadable (hard), or a
    trip the experiment expected and did not get (with the users the faulty canary
    answered meanwhile) or one it did not expect."""
    hard: list[str] = []
    merit: list[str] = []
    if ev.journal is not None and ev.trips_in_window is None:
        hard.append("the broker's history could not be read: trip or no trip is unknown")
    elif ev.trips_in_window is not None:
        if expect == "trip" and ev.trips_in_window == 0:
            merit.append(MISSED_TRIP)
            if ev.exposed:
                merit.append(
                    f"the gate never tripped while {ev.exposed} answers from the faulty "
                    "canary were served to users after the fault (canary-served requests "
                    "the fault reaches, from the load records)"
                )
        if expect in ("no_trip", "blind", "colour_lost") and ev.trips_in_window > 0:
            merit.append(unexpected_trips(ev.trips_in_window))
    return hard, merit


def _leftover_reasons(ev: Evidence) -> list[str]:
    """Hard reasons about the load and the faults: the load's problem, no load records,
    a fault still active after the experiment."""
    hard: list[str] = []
    if ev.load_problem:
        hard.append(ev.load_problem)
    if ev.journal is not None and not ev.records_rows:
        hard.append(
            "no load records (records.parquet is missing or empty): what users saw is unknown"
        )
    for fault in ev.faults_left:
        hard.append(f"a fault is still active after the experiment: {fault}")
    return hard


def _verdict(ev: Evidence, hard: list[str], merit: list[str]) -> tuple[str, list[str]]:
    """Fail when there is a hard reason (the merits listed too); else inconclusive when the
    gate could not have seen or the evidence was not assessed (the merits not judged);
    else fail on a merit, pass without one. Each reason once, in order."""
    if ev.inconclusive is None and ev.journal is not None:
        unknown = ["the evidence (what the gate saw, whether the load was valid) was not assessed"]
    else:
        unknown = list(ev.inconclusive or [])
    if hard:
        return FAIL, list(dict.fromkeys([*hard, *merit]))
    if unknown:
        return INCONCLUSIVE, list(dict.fromkeys([*unknown, *(NOT_JUDGED + r for r in merit)]))
    reasons = list(dict.fromkeys(merit))
    return (FAIL if reasons else PASS), reasons
