"""What a progressive-delivery controller's status says (Argo Rollouts' ``Rollout``,
Flagger's ``Canary``), and the check that pairs it with the traffic served after it.

Those controllers have had fail-open bugs (a status that says aborted while the canary
kept its traffic), so a status must never pass alone: it passes only with traffic evidence
that agrees (``gameday.evidence.traffic``). Pure: objects as the API gave them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TypedDict

from gameday.evidence.slo import Slo, result
from gameday.evidence.traffic import judge_traffic

ARGO_ABORTED_REASON = "RolloutAborted"
UNIT = "count"


class ArgoView(TypedDict):
    """What an Argo Rollout's status says (``argo_view``); the status's own values as the
    API gave them, the times in epoch seconds."""

    phase: object
    abort: bool
    aborted_condition: bool
    aborted_at: float | None
    message: object
    canary_weight: object


class FlaggerView(TypedDict):
    """What a Flagger Canary's status says (``flagger_view``)."""

    phase: object
    canary_weight: object
    failed_checks: object
    changed_at: float | None
    promoted_condition: Mapping[str, object] | None


def as_object(value: object) -> Mapping[str, object]:
    """A JSON object of the API's answer, or an empty one for anything else (missing)."""
    return value if isinstance(value, dict) else {}


def objects_of(value: object) -> list[Mapping[str, object]]:
    """The JSON objects of a list in the API's answer (none when it is not a list)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def epoch_s(value: object) -> float | None:
    """Epoch seconds of an RFC 3339 time as the Kubernetes API writes it (or None)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def argo_view(obj: Mapping[str, object]) -> ArgoView:
    """An Argo Rollout's phase, abort, the RolloutAborted condition, its time (epoch
    seconds) and the canary weight when traffic routing reports one."""
    status = as_object(obj.get("status"))
    aborted_cond = next(
        (
            c
            for c in objects_of(status.get("conditions"))
            if c.get("type") == "Progressing" and c.get("reason") == ARGO_ABORTED_REASON
        ),
        None,
    )
    weights = as_object(as_object(status.get("canary")).get("weights"))
    weight = as_object(weights.get("canary")).get("weight")
    aborted_at = epoch_s(status.get("abortedAt")) or epoch_s(
        (aborted_cond or {}).get("lastTransitionTime")
    )
    return {
        "phase": status.get("phase"),
        "abort": bool(status.get("abort")),
        "aborted_condition": aborted_cond is not None,
        "aborted_at": aborted_at,
        "message": status.get("message"),
        "canary_weight": weight,
    }


def argo_aborted(view: ArgoView) -> bool:
    """``status.abort`` true, phase ``Degraded`` and the RolloutAborted condition."""
    return bool(view["abort"] and view["phase"] == "Degraded" and view["aborted_condition"])


def flagger_view(obj: Mapping[str, object]) -> FlaggerView:
    """A Flagger Canary's phase, canaryWeight, failedChecks and when it changed."""
    status = as_object(obj.get("status"))
    promoted = next(
        (c for c in objects_of(status.get("conditions")) if c.get("type") == "Promoted"), None
    )
    return {
        "phase": status.get("phase"),
        "canary_weight": status.get("canaryWeight"),
        "failed_checks": status.get("failedChecks"),
        "changed_at": epoch_s(status.get("lastTransitionTime"))
        or epoch_s((promoted or {}).get("lastTransitionTime")),
        "promoted_condition": promoted,
    }


def flagger_failed(view: FlaggerView) -> bool:
    """Phase ``Failed``."""
    return bool(view["phase"] == "Failed")


def status_time(view: Mapping[str, object], since_key: str) -> float | None:
    """The view's time of the status a check waits for (``since_key``), or None."""
    at = view.get(since_key)
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def _short(view: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in view.items() if k != "promoted_condition")


def status_refusal(
    check: str,
    name: str,
    view: Mapping[str, object],
    done: bool,
    expected: str,
    since_key: str,
    allowed: float,
    wait: float,
) -> Slo | None:
    """The failed check when the status alone already fails — not ``expected`` within
    ``wait`` seconds, a canary weight other than 0, no time for the change — else None."""
    why = None
    weight = view.get("canary_weight")
    if not done:
        why = (
            f"{name!r} should be {expected} within {wait:g} s, but it is phase "
            f"{view.get('phase')!r} ({_short(view)})"
        )
    elif weight not in (None, 0):
        why = (
            f"{name!r} says {expected} but still gives the canary weight {weight} "
            "(expected 0): the controller failed open"
        )
    elif status_time(view, since_key) is None:
        why = (
            f"{name!r} says {expected} but gives no time for it, so the traffic after "
            "it cannot be checked"
        )
    if why is None:
        return None
    return result(check, None, allowed, UNIT, False, why=why, controller=view)


def paired(
    check: str,
    name: str,
    expected: str,
    view: Mapping[str, object],
    since: float,
    grace: float,
    evidence: Mapping[str, object],
    allowed: float,
) -> Slo:
    """The status paired with the traffic after it: ``measured`` is the canary-served
    requests that started after ``since`` (the change + ``grace``), ``allowed`` at most."""
    measured, ok, why = judge_traffic(evidence, allowed)
    if why is not None and measured is not None:
        why = f"{name!r} says {expected}, but {why}: the controller failed open"
    said = {} if why is None else {"why": why}
    detail = {"controller": view, "since": since, "grace_s": grace, "traffic": evidence}
    return result(check, measured, allowed, UNIT, ok, **detail, **said)
