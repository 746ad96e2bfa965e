"""What users saw of a shared-dependency fault (issue #16): the fault's window, errors and
TTFT per variant before, during and after it, the time to recover, and the SLO checks
over that summary (``dependency.json``, the report's section).

Pure: the ledger, the watch lines and the records in, figures out. A check must never pass
on a summary that lacks what it measures: it fails naming what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NotRequired, TypedDict

import pandas as pd

from canary_contract.faults import FaultAction
from gameday.evidence.ledger import DEPENDENCY_ROLE, FaultEntry
from gameday.evidence.slo import Slo, failed_result, result

# The checks: (name, unit) of each SLO result below.
ERROR_RATE = ("dependency_error_rate", "ratio")
MAX_E2E = ("max_e2e_s", "s")
RECOVERY = ("dependency_recovery_s", "s")
UNHEALTHY = ("services_unhealthy_ticks", "count")
RECOVERY_WINDOW_S = 2.0
RECOVERY_STEP_S = 0.25
RECOVERY_ERROR_SLACK = 0.02
RECOVERY_TTFT_FACTOR = 1.5
RECOVERY_TTFT_SLACK_S = 0.05
VARIANTS = ("baseline", "canary")


class FaultWindow(TypedDict):
    """The dependency fault of a run and when it began and ended (``end`` None: never)."""

    kind: str
    start: float
    end: float | None
    params: Mapping[str, object]  # the ledger entry's


class Stats(TypedDict):
    """Requests, errors, error rate and TTFT p50/p99 (of the answered ones) of some rows."""

    requests: int
    errors: int
    error_rate: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None


class PerVariant(TypedDict):
    all: Stats
    baseline: Stats
    canary: Stats


class TrafficSummary(TypedDict):
    """What users saw around the fault (``traffic_summary``)."""

    before: PerVariant
    during: PerVariant
    after: PerVariant
    recovery_s: float | None
    recovery_rule: str
    max_e2e_s: float | None
    error_kinds: dict[str, int]


class Summary(TypedDict):
    """``dependency.json``: the fault, the watch's ticks, the model servers' dependency
    results (per variant, per ``result``) and, once the records were read around a fault,
    the ``TrafficSummary``'s keys as well."""

    fault: FaultWindow | None
    watch_ticks: int
    unhealthy_ticks: dict[str, int]
    model_dependency_results: dict[str, dict[str, float]]
    records_error: NotRequired[str]
    before: NotRequired[PerVariant]
    during: NotRequired[PerVariant]
    after: NotRequired[PerVariant]
    recovery_s: NotRequired[float | None]
    recovery_rule: NotRequired[str]
    max_e2e_s: NotRequired[float | None]
    error_kinds: NotRequired[dict[str, int]]


class WatchTick(TypedDict):
    """A line of ``dependency_watch.jsonl``: when, each service's health and whether Redis
    answered PING."""

    time: float
    health: dict[str, bool]
    redis: bool


class WatchCounts(TypedDict):
    """What a watch saw: its ticks, and per service the ones that found it unhealthy."""

    ticks: int
    unhealthy_ticks: dict[str, int]


def _tick_time(line: Mapping[str, object]) -> float | None:
    at = line.get("time")
    return float(at) if isinstance(at, int | float) else None


def fault_window(
    entries: Sequence[FaultEntry], watch_lines: Sequence[Mapping[str, object]]
) -> FaultWindow | None:
    """The dependency fault of the ledger and when it began and ended (None: no fault).

    It runs from the injection to its end: a pause, its length; the holder, its deadline
    or its clearing, whichever is first; a kill, the first watch tick after it that found
    Redis answering again (``end`` None: never)."""
    faults = [
        e
        for e in entries
        if e.component == DEPENDENCY_ROLE and e.action in (FaultAction.DEPENDENCY, FaultAction.KILL)
    ]
    if not faults:
        return None
    f = faults[0]
    start = f.time
    end: float | None
    if f.action == FaultAction.KILL:
        times = [_tick_time(w) for w in watch_lines if w.get("redis")]
        ups = [t for t in times if t is not None and t > start]
        end = min(ups) if ups else None
    else:
        end = start + float(f.ttl_s or 0.0)
        clears = [e.time for e in entries if e.action == FaultAction.DEPENDENCY_CLEAR
                  and e.fault_id == f.fault_id]  # fmt: skip
        if clears:
            end = min(end, min(clears))
    kind = "kill" if f.action == FaultAction.KILL else f.kind
    return FaultWindow(kind=kind, start=start, end=end, params=f.params)


def stats(frame: pd.DataFrame) -> Stats:
    """Requests, errors, error rate and TTFT p50/p99 (of the answered ones) of ``frame``."""
    n = len(frame)
    failed = int((~frame["ok"]).sum()) if n else 0
    ttft = frame.loc[frame["ok"] & frame["ttft_s"].notna(), "ttft_s"]
    return Stats(
        requests=n,
        errors=failed,
        error_rate=round(failed / n, 6) if n else None,
        ttft_p50_s=round(float(ttft.quantile(0.5)), 6) if len(ttft) else None,
        ttft_p99_s=round(float(ttft.quantile(0.99)), 6) if len(ttft) else None,
    )


def per_variant(frame: pd.DataFrame) -> PerVariant:
    """``stats`` of all of ``frame`` and of each variant's share of it."""
    baseline, canary = (stats(frame[frame["served_by"] == v]) for v in VARIANTS)
    return PerVariant(all=stats(frame), baseline=baseline, canary=canary)


def recovery_s(frame: pd.DataFrame, start: float, end: float) -> tuple[float | None, str]:
    """Seconds from the fault's end until users are served as before it (None: never in
    the records), and the rule that decided.

    Recovered: the first moment after ``end`` from which a ``RECOVERY_WINDOW_S`` window of
    requests has an error rate at most the pre-fault one + ``RECOVERY_ERROR_SLACK`` and a
    median TTFT at most ``RECOVERY_TTFT_FACTOR`` x the pre-fault one +
    ``RECOVERY_TTFT_SLACK_S``."""
    before = frame[frame["start_time"] < start]
    base = stats(before)
    if not base["requests"] or base["ttft_p50_s"] is None:
        return None, "no requests before the fault to compare with"
    max_rate = float(base["error_rate"] or 0.0) + RECOVERY_ERROR_SLACK
    max_p50 = float(base["ttft_p50_s"]) * RECOVERY_TTFT_FACTOR + RECOVERY_TTFT_SLACK_S
    rule = (f"error rate <= {max_rate:.3f} and TTFT p50 <= {max_p50:.3f} s over "
            f"{RECOVERY_WINDOW_S:g} s of requests")  # fmt: skip
    last = float(frame["start_time"].max())
    t = end
    while t + RECOVERY_WINDOW_S <= last + 1e-9:
        win = frame[(frame["start_time"] >= t) & (frame["start_time"] < t + RECOVERY_WINDOW_S)]
        s = stats(win)
        if (
            s["requests"]
            and s["ttft_p50_s"] is not None
            and float(s["error_rate"] or 0.0) <= max_rate
            and float(s["ttft_p50_s"]) <= max_p50
        ):
            return round(t - end, 3), rule
        t += RECOVERY_STEP_S
    return None, rule


def unhealthy_ticks(watch_lines: Sequence[Mapping[str, object]]) -> dict[str, int]:
    """Per service, the watch ticks that found it unhealthy."""
    unhealthy: dict[str, int] = {}
    for w in watch_lines:
        health = w.get("health")
        for name, ok in health.items() if isinstance(health, dict) else ():
            unhealthy[name] = unhealthy.get(name, 0) + (0 if ok else 1)
    return unhealthy


def add_dependency_results(metrics_text: str, counts: dict[str, float]) -> None:
    """Add a model server's ``canarystack_dependency_requests_total`` per ``result`` (from
    its ``/metrics`` text) to ``counts``; IndexError/ValueError on a malformed line."""
    for line in metrics_text.splitlines():
        if line.startswith("canarystack_dependency_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            res = labels.split('result="', 1)[1].split('"', 1)[0]
            counts[res] = counts.get(res, 0.0) + float(value)


def traffic_summary(frame: pd.DataFrame, window: FaultWindow) -> TrafficSummary:
    """What users saw around the fault ``window``: ``before``/``during``/``after`` per
    variant, ``recovery_s`` and its rule, ``max_e2e_s``, ``error_kinds``."""
    start = float(window["start"])
    end = float(window["end"]) if window["end"] is not None else math.inf
    rec, rule = (
        (None, "the fault never ended") if end == math.inf else recovery_s(frame, start, end)
    )
    e2e = frame["e2e_s"].dropna()
    kinds = frame.loc[~frame["ok"], "error_kind"].fillna("unknown").astype(str)
    return TrafficSummary(
        before=per_variant(frame[frame["start_time"] < start]),
        during=per_variant(frame[(frame["start_time"] >= start) & (frame["start_time"] < end)]),
        after=per_variant(frame[frame["start_time"] >= end]),
        recovery_s=rec,
        recovery_rule=rule,
        max_e2e_s=round(float(e2e.max()), 6) if len(e2e) else None,
        error_kinds={str(k): int(v) for k, v in kinds.value_counts().items()},
    )


def summary(
    entries: Sequence[FaultEntry],
    watch_lines: Sequence[Mapping[str, object]],
    model_results: dict[str, dict[str, float]],
    frame: pd.DataFrame | None,
    records_error: str | None = None,
) -> Summary:
    """The experiment's dependency summary (``dependency.json``): its fault window, the
    watch's ticks, the model servers' dependency results and, when the load's records
    (``frame``) hold rows and there was a fault, ``traffic_summary`` of them;
    ``records_error`` says why the records could not be read."""
    window = fault_window(entries, watch_lines)
    doc = Summary(
        fault=window,
        watch_ticks=len(watch_lines),
        unhealthy_ticks=unhealthy_ticks(watch_lines),
        model_dependency_results=model_results,
    )
    if records_error is not None:
        doc["records_error"] = records_error
    if frame is not None and len(frame) and window is not None:
        doc = {**doc, **traffic_summary(frame, window)}
    return doc


def judged(
    doc: Summary,
    name_unit: tuple[str, str],
    allowed: float,
    judge: Callable[[Summary], Slo],
) -> Slo:
    """``judge`` (a check below) over the summary ``doc``, or the failed result naming
    what it lacks: a fault, or the records of the traffic around it."""
    check, unit = name_unit
    if doc["fault"] is None:
        return failed_result(check, allowed, unit, "no redis fault in this run's ledger")
    if "during" not in doc:
        why = doc.get("records_error") or "no load records (the load did not stop cleanly)"
        return failed_result(check, allowed, unit, why)
    return judge(doc)


# -- the SLO checks over a summary (each given one that has a fault and its traffic) ------
def errors_below(doc: Summary, max_ratio: float) -> Slo:
    """Failed requests among those that started during the fault or after it: at most
    ``max_ratio`` (the dependency degrades answers; it must not fail them)."""
    (check, unit), allowed = ERROR_RATE, float(max_ratio)
    n = doc["during"]["all"]["requests"] + doc["after"]["all"]["requests"]
    bad = doc["during"]["all"]["errors"] + doc["after"]["all"]["errors"]
    if not n:
        return failed_result(check, allowed, unit, "no request started during or after the fault")
    ratio = bad / n
    return result(check, ratio, allowed, unit, ratio <= allowed, requests=n, failed=bad,
                  during=doc["during"]["all"], after=doc["after"]["all"])  # fmt: skip


def within_deadline(doc: Summary, max_s: float) -> Slo:
    """No request took longer than ``max_s`` end to end, and none timed out."""
    (check, unit), allowed = MAX_E2E, float(max_s)
    worst = doc.get("max_e2e_s")
    timeouts = sum(v for k, v in doc.get("error_kinds", {}).items() if "timeout" in k)
    if worst is None:
        return failed_result(check, allowed, unit, "no request has an end-to-end time")
    ok = worst <= allowed and timeouts == 0
    return result(check, worst, allowed, unit, ok, timed_out=timeouts)


def recovered(doc: Summary, max_s: float) -> Slo:
    """Users are served as before the fault within ``max_s`` seconds of its end."""
    (check, unit), allowed = RECOVERY, float(max_s)
    rec = doc.get("recovery_s")
    if rec is None:
        return failed_result(check, allowed, unit, f"not recovered: {doc.get('recovery_rule')}")
    return result(check, rec, allowed, unit, rec <= allowed, rule=doc.get("recovery_rule"),
                  fault=doc["fault"])  # fmt: skip


def stayed_healthy(doc: Summary) -> Slo:
    """Every watch tick found every router replica and the broker healthy."""
    check, unit = UNHEALTHY
    if not doc["watch_ticks"]:
        return failed_result(check, 0.0, unit, "no watch ticks: add probes.dependency.watch")
    bad = sum(doc["unhealthy_ticks"].values())
    return result(check, float(bad), 0.0, unit, bad == 0, ticks=doc["watch_ticks"],
                  by_service=doc["unhealthy_ticks"])  # fmt: skip
