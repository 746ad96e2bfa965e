"""The SLO checks, as pure functions from what the run recorded to an SLO result.

Each takes the records (a DataFrame with the columns of ``RECORD_COLUMNS``), the
reference fault (``faults.ReferenceFault``, a ledger row) or the broker's events, and
returns ``slo.result``'s shape. The probes (``probes.slo``, ``probes.hostile``) fetch
the inputs and call these; a missing input is theirs to say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np
import pandas as pd

from gameday.evidence.events import event_time, first_phase, phase_events
from gameday.evidence.faults import FaultRow
from gameday.evidence.milestones import CLOCK_SLACK_S, last_canary_request, weights_applied
from gameday.evidence.slo import Slo, failed_result, not_measured, result

RECORD_COLUMNS = (
    "start_time",
    "ttft_s",
    "e2e_s",
    "ok",
    "error_kind",
    "served_by",
    "prompt_tokens",
    "planned_prompt_tokens",
    "status",
)
# Router /health: "gate_auth" is ok | unauthorized | forbidden.
GATE_AUTH_OK = "ok"


def record_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The load records as the checks read them: every column of ``RECORD_COLUMNS`` (an
    absent one all-null), ``ok`` a bool (unknown is not ok), ``tokens`` the prompt's tokens
    (else the planned ones), ``served_by`` a string and the times numbers (else NaN)."""
    for col in RECORD_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    frame["ok"] = frame["ok"].astype("boolean").fillna(False).astype(bool)
    tokens = pd.to_numeric(frame["prompt_tokens"], errors="coerce")
    planned = pd.to_numeric(frame["planned_prompt_tokens"], errors="coerce")
    frame["tokens"] = tokens.fillna(planned)
    frame["served_by"] = frame["served_by"].fillna("").astype(str)
    for col in ("start_time", "ttft_s", "e2e_s"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def fault_detail(fault: FaultRow) -> dict[str, dict[str, object]]:
    keys = ("kind", "component", "time", "params")
    return {"fault": {k: fault.get(k) for k in keys}}


def baseline_ttft_p99(frame: pd.DataFrame, max_s: float, min_requests: int) -> Slo:
    """p99 time to first token of successful baseline-served requests, over at least
    ``min_requests`` of them."""
    check, allowed = "baseline_ttft_p99_s", float(max_s)
    base = frame[(frame["served_by"] == "baseline") & frame["ok"] & frame["ttft_s"].notna()]
    n = len(base)
    if n < int(min_requests):
        why = (
            f"only {n} successful baseline requests, fewer than the {int(min_requests)} a "
            "p99 needs: raise the load or its duration"
        )
        return failed_result(check, allowed, "s", why, requests=n)
    ttft = base["ttft_s"].to_numpy(dtype=float)
    p99 = float(np.quantile(ttft, 0.99))
    p50, top = round(float(np.quantile(ttft, 0.5)), 6), round(float(ttft.max()), 6)
    return result(check, p99, allowed, "s", p99 <= allowed, requests=n, p50_s=p50, max_s=top)


def error_rate(frame: pd.DataFrame, max_ratio: float) -> Slo:
    """The share of failed requests, any variant."""
    allowed = float(max_ratio)
    failed = frame[~frame["ok"]]
    ratio = len(failed) / len(frame)
    kinds = failed["error_kind"].fillna("unknown").astype(str).value_counts().to_dict()
    variants = failed["served_by"].replace("", "unknown").value_counts().to_dict()
    return result(
        "error_rate",
        ratio,
        allowed,
        "ratio",
        ratio <= allowed,
        requests=len(frame),
        failed=len(failed),
        by_error_kind={str(k): int(v) for k, v in kinds.items()},
        by_variant={str(k): int(v) for k, v in variants.items()},
    )


def canary_served_after(frame: pd.DataFrame, fault: FaultRow, max_s: float) -> Slo:
    """The rollback as users feel it: the last canary-served request's start after the
    fault (0 when none started after it)."""
    t0 = float(fault["time"])
    served_by = frame["served_by"].to_numpy()
    last, count = last_canary_request(served_by, frame["start_time"].to_numpy(dtype=float), t0)
    measured = 0.0 if last is None else last - t0
    return result(
        "rollback_s",
        measured,
        float(max_s),
        "s",
        measured <= float(max_s),
        canary_requests_after_fault=count,
        canary_requests_total=int((served_by == "canary").sum()),
        **fault_detail(fault),
    )


def drifted_responses(frame: pd.DataFrame, kernel: FaultRow, max_count: int) -> Slo:
    """Canary-served requests exposed to the faulty kernel: started after it was injected,
    with a prompt at or above its token threshold."""
    allowed = float(max_count)
    params = kernel.get("params") or {}
    threshold = int(params.get("min_prompt_tokens", 0))
    exposed = frame[
        (frame["served_by"] == "canary")
        & (frame["start_time"] >= float(kernel["time"]))
        & (frame["tokens"] >= threshold)
    ]
    count = len(exposed)
    return result(
        "drifted_responses",
        float(count),
        allowed,
        "count",
        count <= allowed,
        min_prompt_tokens=threshold,
        failed_among_them=int((~exposed["ok"]).sum()),
        **fault_detail(kernel),
    )


def errors_not_in_flight_at_kill(frame: pd.DataFrame, kill: FaultRow, grace_s: float) -> Slo:
    """Failed requests the pod kill does not explain: not in flight when it happened
    (started before it, or within ``grace_s`` after it on a stale connection, and not
    finished before it). Allowed: 0."""
    t_kill = float(kill["time"])
    failed = frame[~frame["ok"]]
    start = failed["start_time"].to_numpy(dtype=float)
    end = start + failed["e2e_s"].fillna(np.inf).to_numpy(dtype=float)
    in_flight = (start <= t_kill + float(grace_s)) & (end >= t_kill - 0.05)
    unexplained = failed[~in_flight]
    first = unexplained["start_time"].sort_values().head(10)
    return result(
        "errors_not_in_flight_at_kill",
        float(len(unexplained)),
        0.0,
        "count",
        len(unexplained) == 0,
        failed=len(failed),
        in_flight_at_kill=int(in_flight.sum()),
        kill={"replica": kill.get("replica"), "time": t_kill},
        unexplained_start_times=[round(float(t) - t_kill, 3) for t in first],
    )


def broker_milestone(
    check: str,
    events: Sequence[Mapping[str, object]],
    fault: FaultRow,
    max_s: float,
    routers: Sequence[Mapping[str, object]] = (),
) -> Slo:
    """A milestone of the broker's history, timed from the fault: ``detection_s`` (the
    trip), ``weights_applied_s`` (weight 0 at every router, ``WeightsApplied``: the
    executor's annotation, else ``routers``' own heartbeats) or ``rollback_complete_s``
    (the ``rolled_back`` phase)."""
    allowed, t0 = float(max_s), float(fault["time"])
    since = t0 - CLOCK_SLACK_S
    trip = first_phase(events, "tripped", since)
    about: dict[str, object] = {}
    when: float | None = None
    if check == "detection_s":
        hit, what = trip, "trip"
    elif check == "rollback_complete_s":
        hit, what = first_phase(events, "rolled_back", since), "rolled_back phase"
    else:
        applied = weights_applied(events, event_time(trip) if trip else since, routers)
        what = "routers_applied annotation (nor every live router's canary_off_since)"
        hit = (applied.annotation or {}) if applied else None
        if applied is not None:
            about, when = applied.detail(), applied.time
    if hit is None:
        why = f"no {what} in the release's history since the fault"
        return failed_result(check, allowed, "s", why, **fault_detail(fault))
    measured = (event_time(hit) if when is None else when) - t0
    return result(
        check,
        measured,
        allowed,
        "s",
        measured <= allowed,
        event_seq=hit.get("seq"),
        actor=hit.get("actor"),
        **about,
        **fault_detail(fault),
    )


def trips_since(events: Sequence[Mapping[str, object]], since: float | None) -> Slo:
    """``no_trip``: the trips since the experiment began; allowed 0."""
    trips = phase_events(events, "tripped", since)
    return result(
        "no_trip",
        float(len(trips)),
        0.0,
        "count",
        not trips,
        since=since,
        trips=[{"time": t.get("time"), "seq": t.get("seq")} for t in trips[:5]],
    )


def router_blindness(health: Mapping[str, object]) -> str | None:
    """Why a router's samples do not reach the gate (from its /health), or None."""
    auth = health.get("gate_auth")
    if isinstance(auth, dict):
        auth = auth.get("status")
    if auth is not None and auth != GATE_AUTH_OK:
        return f"its sample pushes are refused by the gate ({auth})"
    queue = health.get("sample_queue")
    error = queue.get("gate_error") if isinstance(queue, dict) else None
    if isinstance(error, str) and any(code in error for code in ("401", "403")):
        return f"its sample pushes are refused by the gate ({error})"
    return None


def gate_blind(
    health: Mapping[str, Mapping[str, object] | None], gate_state: object, routers: int
) -> Slo:
    """``gate_blind``: the routers (and the gate itself, when inconclusive) that leave the
    gate blind; allowed 0. ``health`` is each router's /health (None: it did not answer)."""
    check, unit = "gate_blind", "routers"
    blind: dict[str, str] = {}
    unreachable = [name for name, h in health.items() if h is None]
    for name, h in health.items():
        why = router_blindness(h) if h is not None else None
        if why is not None:
            blind[name] = why
    if gate_state == "inconclusive":
        blind["gate"] = "the gate is inconclusive: no canary sample for its no-data timeout"
    if not routers or len(unreachable) == routers:
        why = "no router answered /health: whether the gate can see is unknown"
        return failed_result(check, 0.0, unit, why)
    return result(
        check,
        float(len(blind)),
        0.0,
        unit,
        not blind,
        blind=blind,
        unreachable=unreachable,
        gate_state=gate_state,
        why="; ".join(f"{k}: {v}" for k, v in blind.items()) or None,
    )


class ServerError(TypedDict):
    """A hostile request answered with a 5xx or a broken connection (``status`` None)."""

    input: str
    status: int | None
    detail: str


class FloodJson(TypedDict):
    """What a flood got: its statuses per input, and the first server errors."""

    sent: int
    elapsed_s: float
    by_input: dict[str, dict[str, int]]
    server_errors: list[ServerError]


def hostile_server_errors(data: FloodJson | None) -> Slo:
    """``hostile_server_errors``: hostile requests answered with a 5xx or a broken
    connection (from ``hostile.json``); allowed 0."""
    check, unit = "hostile_server_errors", "requests"
    if data is None:
        return not_measured(check, 0, unit, "no hostile flood has run yet in this experiment")
    sent = int(data.get("sent") or 0)
    if sent == 0:
        return failed_result(check, 0, unit, "the hostile flood sent nothing")
    counted = sum(
        n
        for counts in (data.get("by_input") or {}).values()
        for status, n in counts.items()
        if status == "connection_failed" or status.startswith("5")
    )
    bad = data.get("server_errors") or []
    return result(
        check,
        counted,
        0,
        unit,
        counted == 0,
        sent=sent,
        by_input=data.get("by_input"),
        first_server_errors=bad[:5],
    )


def metric_total(metrics_text: str, names: tuple[str, ...]) -> float:
    """The sum of the samples of the metrics ``names`` (every label set) in a replica's
    ``/metrics`` text; ValueError naming a sample line that has no number."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(names):
            try:
                total += float(line.rsplit(" ", 1)[-1])
            except ValueError:
                raise ValueError(f"the /metrics line {line!r} has no number") from None
    return total


class PinAnswer(TypedDict):
    """A row of ``pins_after_trip.json``: a pinned request the router answered."""

    status: int
    served_by: str | None
    code: object  # the answer's error code, as it gave it


class PinUnanswered(TypedDict):
    """A row of ``pins_after_trip.json``: a pinned request that got no answer."""

    status: None
    error: str  # the transport's exception class


class PinsAfterTrip(TypedDict):
    """``pins_after_trip.json``: what answered each pinned request, and the canary's
    request count before and after."""

    sent: int
    answers: list[PinAnswer | PinUnanswered]
    canary_requests_before: float
    canary_requests_after: float


def pin_answer(status: int, body: object, served_by: str | None) -> PinAnswer:
    """What answered a request pinned to the canary (a row of ``pins_after_trip.json``):
    its HTTP status, who served it (``x-served-by``) and its error ``code``, if any."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return {"status": status, "served_by": served_by, "code": code}


def pinned_requests_on_tripped_canary(data: PinsAfterTrip | None) -> Slo:
    """After a trip, pinned requests that reached the canary (``pins_after_trip.json``):
    answered by it (``x-served-by``) or moving its own request counter; allowed 0, and
    every one must be refused as ``canary_off``."""
    check, unit = "pinned_requests_on_tripped_canary", "requests"
    if data is None:
        return not_measured(check, 0, unit, "no pinned requests were sent after a trip yet")
    answers = data.get("answers") or []
    served = sum(1 for a in answers if a.get("served_by") == "canary")
    moved = float(data.get("canary_requests_after", 0)) - float(
        data.get("canary_requests_before", 0)
    )
    refused = sum(1 for a in answers if a.get("status") == 409 and a.get("code") == "canary_off")
    # A router that sends the pin to the baseline instead (Envoy whose pin route was turned
    # off) protects the user too; only the canary answering, or its counter moving, fails.
    rerouted = sum(
        1 for a in answers if a.get("status") == 200 and a.get("served_by") == "baseline"
    )
    reached = max(served, int(moved))
    return result(
        check,
        reached,
        0,
        unit,
        reached == 0 and refused + rerouted == len(answers),
        sent=len(answers),
        refused_canary_off=refused,
        served_by_baseline=rerouted,
        served_by_canary=served,
        canary_request_counter_delta=moved,
    )
