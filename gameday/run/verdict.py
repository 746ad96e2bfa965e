"""One experiment's verdict, decided fail-closed from what the run left behind.

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
(``Evidence.inconclusive``, from ``gameday.run.evidence``): too few baseline-canary
comparisons or canary outcomes, a starved or late Locust. Then the gate's merits — a
trip or none, the SLOs, a deviation, Chaos Toolkit's exit code after one — are not
judged (they are listed as "not judged: ..."). Failures of the run itself still fail it
(fail wins): the stack or target could not be prepared, an interruption, a timeout, a
killed chaos, a missing journal or extension, a steady state unmet before the method, a
failed rollback, a blind gate, an unreadable broker history, Locust left running or
failed, no load records, a fault left active.

Each reason is a sentence a person can act on. This module decides; it reads nothing from
disk and talks to nothing (``gameday.run.runner`` gathers the inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLO_KEYS = frozenset({"check", "measured", "allowed", "ok"})
# The check of probes.slo.gate_sees_every_router: a gate that cannot see never trips.
BLIND_CHECK = "gate_blind"
BLIND_PREFIX = "the gate was blind"
DEVIATED = "the steady state deviated: the hypothesis was not met after the method"
EXPECTS = ("trip", "no_trip", "blind")
ACTIVITY_FAILED = "chaoslib.exceptions.ActivityFailed: "
TRIPPED = "tripped"
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
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
)


@dataclass
class Evidence:
    """Everything the verdict of one experiment looks at."""

    chaos_exit_code: int | None  # None: chaos never started or was killed
    journal: dict[str, Any] | None
    records_rows: int | None  # None: no records file, or unreadable
    trips_in_window: int | None  # None: the broker's history could not be read
    interrupted: str | None = None  # "SIGINT" etc. when the run was interrupted
    timed_out_s: float | None = None
    setup_error: str | None = None  # the stack did not start, the target is wrong...
    faults_left: list[str] = field(default_factory=list)
    load_problem: str | None = None
    # Why the gate could not have seen, or the load is not valid (gameday.run.evidence);
    # None: not assessed, which is itself inconclusive (fail-closed).
    inconclusive: list[str] | None = None


def _hard_journal_reason(reason: str) -> bool:
    return reason.startswith(_HARD_JOURNAL_PREFIXES) or "before the method" in reason


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _last_error(run: dict[str, Any]) -> str:
    exc = run.get("exception")
    if isinstance(exc, list):
        exc = "".join(str(x) for x in exc)
    if isinstance(exc, str) and exc.strip():
        line = exc.strip().splitlines()[-1]
        # chaoslib wraps an activity's exception in ActivityFailed, sometimes twice.
        while line.startswith(ACTIVITY_FAILED):
            line = line.removeprefix(ACTIVITY_FAILED)
        return line[:500]
    return "no exception recorded"


def _name(run: dict[str, Any]) -> str:
    return str(_dict(run.get("activity")).get("name") or "?")


def gameday_extension(experiment: dict[str, Any] | None) -> dict[str, Any] | None:
    for ext in _list(_dict(experiment).get("extensions")):
        if isinstance(ext, dict) and ext.get("name") == "gameday":
            return ext
    return None


def _slo_sentence(where: str, output: dict[str, Any]) -> str:
    detail = _dict(output.get("detail"))
    measured = output.get("measured")
    unit = output.get("unit") or ""
    why = f" ({detail['why']})" if detail.get("why") else ""
    if output.get("check") == BLIND_CHECK and measured:
        return f"{BLIND_PREFIX} ({where}): {detail.get('why') or 'see the probe output'}"
    if measured is None:
        return f"SLO {output.get('check')!r} ({where}) could not be measured{why}"
    return (
        f"SLO {output.get('check')!r} ({where}) not met: measured {measured:g} {unit}, "
        f"allowed {output.get('allowed')} {unit}{why}".replace("  ", " ")
    )


def _hypothesis_reasons(state: Any, when: str) -> list[str]:
    reasons: list[str] = []
    for run in _list(_dict(state).get("probes")):
        if not isinstance(run, dict):
            continue
        name = _name(run)
        if run.get("status") != "succeeded":
            reasons.append(f"steady-state probe {name!r} ({when}) raised: {_last_error(run)}")
        elif run.get("tolerance_met") is False:
            out = run.get("output")
            if isinstance(out, dict) and set(out) >= SLO_KEYS:
                reasons.append(_slo_sentence(f"probe {name!r}, {when}", out))
            else:
                reasons.append(
                    f"steady-state probe {name!r} ({when}) returned {str(out)[:200]!r}, "
                    "outside its tolerance"
                )
    return reasons


def journal_reasons(journal: dict[str, Any] | None) -> list[str]:
    """Why Chaos Toolkit's own record says the experiment did not pass (empty: it did)."""
    if journal is None:
        return ["no journal.json: Chaos Toolkit did not finish the experiment"]
    reasons: list[str] = []
    experiment = _dict(journal.get("experiment"))
    status = journal.get("status")
    states = _dict(journal.get("steady_states"))
    before, after = states.get("before"), states.get("after")
    has_hypothesis = bool(_list(_dict(experiment.get("steady-state-hypothesis")).get("probes")))
    # Said where Chaos Toolkit's own exit code would have let the failure pass.
    exits_0 = (
        " (Chaos Toolkit exits 0 here)"
        if status == "completed" and journal.get("deviated") is not True
        else ""
    )
    if status != "completed":
        reasons.append(f"Chaos Toolkit's status is {status!r}, not 'completed'")
    if has_hypothesis and isinstance(before, dict) and before.get("steady_state_met") is False:
        reasons.append(
            "the steady state was not met before the method, so the method never ran" + exits_0
        )
        reasons.extend(_hypothesis_reasons(before, "before the method"))
    elif has_hypothesis and not isinstance(before, dict):
        reasons.append("the steady-state hypothesis did not run before the method")
    if journal.get("deviated") is True:
        reasons.append(DEVIATED)
    if has_hypothesis and isinstance(after, dict):
        if after.get("steady_state_met") is False:
            reasons.extend(_hypothesis_reasons(after, "after the method"))
    elif has_hypothesis and status == "completed" and _dict(before).get("steady_state_met"):
        reasons.append("the steady-state hypothesis did not run after the method")
    method = _list(experiment.get("method"))
    runs = _list(journal.get("run"))
    if method and not runs and _dict(before).get("steady_state_met", True):
        reasons.append("the method did not run")
    elif method and len(runs) < len(method) and status == "completed":
        reasons.append(f"only {len(runs)} of the method's {len(method)} activities ran")
    for run in runs:
        if not isinstance(run, dict):
            continue
        if run.get("status") != "succeeded":
            kind = _dict(run.get("activity")).get("type") or "activity"
            reasons.append(
                f"method {kind} {_name(run)!r} {run.get('status') or 'did not finish'}: "
                f"{_last_error(run)}{exits_0}"
            )
    for run in _list(journal.get("rollbacks")):
        if isinstance(run, dict) and run.get("status") != "succeeded":
            reasons.append(
                f"rollback {_name(run)!r} {run.get('status')}: {_last_error(run)} "
                "(faults may stay until their TTL)"
            )
    # SLO results anywhere (a method probe has no tolerance; its result still counts).
    for label, items in (("method", runs), ("after the method", _list(_dict(after).get("probes")))):
        for run in items:
            out = run.get("output") if isinstance(run, dict) else None
            if not (isinstance(out, dict) and set(out) >= SLO_KEYS):
                continue
            where = f"probe {_name(run)!r}, {label}"
            if _dict(out.get("detail")).get("status") == "not_measured":
                # ok true, but only the hypothesis before the method may measure nothing.
                reasons.append(
                    f"SLO {out.get('check')!r} ({where}) was not measured: the probe saw no "
                    "load and no fault"
                )
            elif out.get("ok") is not True and not (
                label != "method" and run.get("tolerance_met") is False
            ):
                reasons.append(_slo_sentence(where, out))
    return reasons


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


def decide(evidence: Evidence) -> tuple[str, list[str]]:
    """``("pass", [])``, ``("fail", reasons)`` or ``("inconclusive", reasons)``."""
    hard: list[str] = []  # failures of the run itself: they fail it whatever the evidence
    merit: list[str] = []  # the gate's merits: judged only when the gate could have seen
    ev = evidence
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
    journal: list[str] = []
    if not ev.setup_error or ev.journal is not None:
        journal = journal_reasons(ev.journal)
    experiment = _dict(ev.journal.get("experiment")) if ev.journal else None
    ext = gameday_extension(experiment) if experiment is not None else None
    if ev.journal is not None and ext is None:
        hard.append(
            "the experiment has no 'gameday' extension saying what it expects "
            "(docs/ARCHITECTURE.md §7.1)"
        )
    expect = ext.get("expect") if ext else None
    if ext is not None and expect not in EXPECTS:
        hard.append(
            f"the gameday extension's expect is {expect!r}: use one of {', '.join(EXPECTS)}"
        )
    if expect == "blind":
        blind_found = any(r.startswith(BLIND_PREFIX) for r in journal)
        journal = _blind_expected(journal)
        if blind_found and ev.journal is not None and ev.journal.get("deviated") is True:
            # chaos exits 1 for the deviation the blindness caused: expected here too.
            merit = [r for r in merit if r != "chaos run exited with code 1"]
    for reason in journal:
        (hard if _hard_journal_reason(reason) else merit).append(reason)
    if ev.journal is not None and ev.trips_in_window is None:
        hard.append("the broker's history could not be read: trip or no trip is unknown")
    elif ev.trips_in_window is not None:
        if expect == "trip" and ev.trips_in_window == 0:
            merit.append("the experiment expects a trip; the broker's history shows none")
        if expect in ("no_trip", "blind") and ev.trips_in_window > 0:
            merit.append(
                f"the experiment expects no trip; the broker's history shows "
                f"{ev.trips_in_window} trip(s)"
            )
    if ev.load_problem:
        hard.append(ev.load_problem)
    if ev.journal is not None and not ev.records_rows:
        hard.append(
            "no load records (records.parquet is missing or empty): what users saw is unknown"
        )
    for fault in ev.faults_left:
        hard.append(f"a fault is still active after the experiment: {fault}")
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
