"""What Chaos Toolkit's journal says went wrong: one list of findings, one wording.

Chaos Toolkit's own status is not enough (``chaos run`` exits 0 when the steady state was
not met before the method, or when a method activity raised), so every reason a journal
gives to fail an experiment is found here, as a sentence a person can act on, for both
the run verdict (``gameday.run.verdict``) and the report (``gameday.report.summary``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gameday.evidence.slo import is_not_measured, is_slo

# The check of probes.slo.gate_sees_every_router: a gate that cannot see never trips.
BLIND_CHECK = "gate_blind"
BLIND_PREFIX = "the gate was blind"
DEVIATED = "the steady state deviated: the hypothesis was not met after the method"
ACTIVITY_FAILED = "chaoslib.exceptions.ActivityFailed: "
NO_EXCEPTION = "no exception recorded"
# What the broker's history shows against what the experiment expects (both verdicts).
MISSED_TRIP = "the experiment expects a trip; the broker's history shows none"


@dataclass(frozen=True)
class Finding:
    """One reason the journal gives; ``slo`` is the SLO result it is about, if any."""

    sentence: str
    slo: Mapping[str, object] | None = None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def last_error(run: Mapping[str, object]) -> str | None:
    """The last line of an activity's exception, without chaoslib's ActivityFailed
    wrapping (it wraps an activity's exception, sometimes twice); None without one."""
    exc = run.get("exception")
    if isinstance(exc, list):
        exc = "".join(str(x) for x in exc)
    if not (isinstance(exc, str) and exc.strip()):
        return None
    line = exc.strip().splitlines()[-1].strip()
    while line.startswith(ACTIVITY_FAILED):
        line = line.removeprefix(ACTIVITY_FAILED)
    return line[:500]


def activity_name(run: Mapping[str, object]) -> str:
    return str(_dict(run.get("activity")).get("name") or "?")


def gameday_extension(experiment: object) -> Mapping[str, object] | None:
    """The experiment's ``gameday`` extension (what it expects, its SLOs), if any: the
    journal's JSON object as it is."""
    for ext in _list(_dict(experiment).get("extensions")):
        if isinstance(ext, dict) and ext.get("name") == "gameday":
            return ext
    return None


def slo_sentence(where: str, output: Mapping[str, object]) -> str:
    """Why an SLO result fails, in one sentence (a blind gate says so first)."""
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


def _hypothesis(state: object, when: str) -> list[Finding]:
    found: list[Finding] = []
    for run in _list(_dict(state).get("probes")):
        if not isinstance(run, dict):
            continue
        name = activity_name(run)
        if run.get("status") != "succeeded":
            error = last_error(run) or NO_EXCEPTION
            found.append(Finding(f"steady-state probe {name!r} ({when}) raised: {error}"))
        elif run.get("tolerance_met") is False:
            out = run.get("output")
            if is_slo(out):
                found.append(Finding(slo_sentence(f"probe {name!r}, {when}", out), out))
            else:
                found.append(
                    Finding(
                        f"steady-state probe {name!r} ({when}) returned {str(out)[:200]!r}, "
                        "outside its tolerance"
                    )
                )
    return found


def journal_findings(journal: Mapping[str, object] | None) -> list[Finding]:
    """Why Chaos Toolkit's own record says the experiment did not pass (empty: it did)."""
    if journal is None:
        return [Finding("no journal.json: Chaos Toolkit did not finish the experiment")]
    found: list[Finding] = []
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
        found.append(Finding(f"Chaos Toolkit's status is {status!r}, not 'completed'"))
    if isinstance(before, dict) and before.get("steady_state_met") is False:
        found.append(
            Finding(
                "the steady state was not met before the method, so the method never ran" + exits_0
            )
        )
        found.extend(_hypothesis(before, "before the method"))
    elif has_hypothesis and not isinstance(before, dict):
        found.append(Finding("the steady-state hypothesis did not run before the method"))
    if journal.get("deviated") is True:
        found.append(Finding(DEVIATED))
    if has_hypothesis and isinstance(after, dict):
        if after.get("steady_state_met") is False:
            found.extend(_hypothesis(after, "after the method"))
    elif has_hypothesis and status == "completed" and _dict(before).get("steady_state_met"):
        found.append(Finding("the steady-state hypothesis did not run after the method"))
    method = _list(experiment.get("method"))
    runs = _list(journal.get("run"))
    if method and not runs and _dict(before).get("steady_state_met", True):
        found.append(Finding("the method did not run"))
    elif method and len(runs) < len(method) and status == "completed":
        found.append(Finding(f"only {len(runs)} of the method's {len(method)} activities ran"))
    for run in runs:
        if isinstance(run, dict) and run.get("status") != "succeeded":
            kind = _dict(run.get("activity")).get("type") or "activity"
            found.append(
                Finding(
                    f"method {kind} {activity_name(run)!r} "
                    f"{run.get('status') or 'did not finish'}: "
                    f"{last_error(run) or NO_EXCEPTION}{exits_0}"
                )
            )
    for run in _list(journal.get("rollbacks")):
        if isinstance(run, dict) and run.get("status") != "succeeded":
            found.append(
                Finding(
                    f"rollback {activity_name(run)!r} {run.get('status')}: "
                    f"{last_error(run) or NO_EXCEPTION} (faults may stay until their TTL)"
                )
            )
    # SLO results anywhere (a method probe has no tolerance; its result still counts).
    for label, items in (("method", runs), ("after the method", _list(_dict(after).get("probes")))):
        for item in items:
            run = _dict(item)
            out = run.get("output")
            if not is_slo(out):
                continue
            where = f"probe {activity_name(run)!r}, {label}"
            if is_not_measured(out):
                # ok true, but only the hypothesis before the method may measure nothing.
                found.append(
                    Finding(
                        f"SLO {out.get('check')!r} ({where}) was not measured: the probe saw "
                        "no load and no fault",
                        out,
                    )
                )
            elif out.get("ok") is not True and not (
                label != "method" and run.get("tolerance_met") is False
            ):
                found.append(Finding(slo_sentence(where, out), out))
    return found


def unexpected_trips(trips: int) -> str:
    """The reason an experiment that expects no trip fails when the history shows some."""
    return f"the experiment expects no trip; the broker's history shows {trips} trip(s)"


def journal_reasons(journal: Mapping[str, object] | None) -> list[str]:
    """Every finding's sentence, in order."""
    return [f.sentence for f in journal_findings(journal)]
