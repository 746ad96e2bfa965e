"""Traffic colouring, verified (issue #16 item 4): do a request's id, trace id and tag
survive every hop? The figures are ``gameday.evidence.colouring``'s; this reads every
component's hop log and sends or drops colour.

No request to judge is a failure after the method (fail-closed), and ``not_measured``
before it. Nothing here imports ``canarystack``.
"""

from __future__ import annotations

import secrets as _secrets
import time
from collections.abc import Mapping
from typing import TypedDict

import requests
from chaoslib.exceptions import ActivityFailed

from gameday.api import ApiError, StackApi
from gameday.evidence.colouring import (
    CHECK,
    DEFAULT_SETTLE_S,
    MODEL_ROLES,
    UNIT,
    Colour,
    Fidelity,
    FidelityJson,
    LogRead,
    SentColour,
    colour_headers,
    fidelity,
    fidelity_result,
    log_read,
)
from gameday.evidence.colouring import HOP_RULES as HOP_RULES  # experiments' tests read it
from gameday.evidence.slo import Slo, failed_result, not_applicable, not_measured
from gameday.targets import Target
from probes._context import (
    Configuration,
    InjectedFault,
    append_run_json_lines,
    foreign_gate,
    inject_fault,
    on_target,
    positive,
    stack_api,
)
from probes._context import get_target as get_target  # the live colouring test reads it
from probes._run_records import NOT_YET, before_anything, load_state, run_json_lines

__all__ = [
    "colouring_fidelity",
    "colouring_fidelity_at_least",
    "drop_colour",
    "send_coloured_requests",
]

DEFAULT_TAG = "gameday"
LOG_ROLES = ("router", *MODEL_ROLES, "gate", "broker")
MAX_TTL_S = 600.0
# What send_coloured_requests sent and saw completed, in the run folder (JSON lines).
SENT_NAME = "coloured_requests.jsonl"


class ColouredSent(TypedDict):
    """What ``send_coloured_requests`` did: how many it sent and saw completed, the tag,
    and the first failures."""

    sent: int
    completed: int
    tag: str
    failures: list[str]


# -- reading the logs ------------------------------------------------------------------------
def read_logs(target: Target) -> list[LogRead]:
    """Every hop log of the target's components as read now (each paged, with its role's
    admin credential)."""
    with requests.Session() as session:
        api = StackApi(session, target)
        return [
            log_read(role, rep.name, api.colour_hop_pages(rep.url, target.fault_headers(role)))
            for role in LOG_ROLES
            for rep in target.replicas(role)
        ]


def read_sent(configuration: Configuration | None) -> list[Mapping[str, object]]:
    """The coloured requests this run's ``send_coloured_requests`` saw completed."""
    rows = run_json_lines(configuration, SENT_NAME)
    return [row for row in rows if isinstance(row.get("request_id"), str)]


def colouring_fidelity(
    settle_s: float = DEFAULT_SETTLE_S,
    configuration: Configuration | None = None,
) -> FidelityJson:
    """Per hop, how many requests completed at the router kept their colour there (the
    figures ``colouring_fidelity_at_least`` judges).

    Every component keeps the hops it saw (``GET /v1/colour/hops``, paged, with its admin
    credential). Only this experiment's requests are judged (those that reached the router
    since its load started, ``load.json``), and only where they can be: one that reached the
    router after a log it should reach had restarted or overwritten its oldest hops, or less
    than ``settle_s`` before the read (its shadow copies may still run), is counted as not
    checkable, never as faithful.
    """
    return _read_fidelity(configuration, settle_s).as_json()


def _read_fidelity(configuration: Configuration | None, settle_s: float) -> Fidelity:
    """``fidelity`` of every hop log read now, for this experiment's requests."""
    with on_target(configuration, "reading the hop logs") as target:
        read_at = time.time()
        logs = read_logs(target)
    started = (load_state(configuration) or {}).get("started_at")
    since = float(started) if isinstance(started, int | float) and started > 0 else None
    sent = read_sent(configuration)
    return fidelity(logs, read_at=read_at, settle_s=settle_s, since=since, sent=sent)


def colouring_fidelity_at_least(
    ratio: float = 1.0,
    min_requests: int = 20,
    settle_s: float = DEFAULT_SETTLE_S,
    configuration: Configuration | None = None,
) -> Slo:
    """SLO: at least ``ratio`` of the completed requests (and at least ``min_requests``
    judged) kept their request id, trace id and tag at every hop they reached; measured
    is the lowest per-hop share. Its ``why`` names the hop that lost the colour first and
    example request ids."""
    if not 0 < float(ratio) <= 1:
        raise ActivityFailed(f"argument ratio must be above 0 and at most 1, got {ratio!r}")
    if before_anything(configuration):
        return not_measured(CHECK, ratio, UNIT, NOT_YET)
    foreign = foreign_gate(configuration)
    if foreign:
        return not_applicable(CHECK, ratio, UNIT, f"{foreign}: no colour hop logs to read")
    try:
        fid = _read_fidelity(configuration, settle_s)
    except ActivityFailed as exc:
        return failed_result(CHECK, ratio, UNIT, f"the hop logs could not be read: {exc}")
    return fidelity_result(fid, float(ratio), int(min_requests))


# -- actions ---------------------------------------------------------------------------------
def send_coloured_requests(
    count: int = 30,
    tag: str = DEFAULT_TAG,
    max_tokens: int = 4,
    configuration: Configuration | None = None,
) -> ColouredSent:
    """Send ``count`` small completions through the router, each with its own
    ``x-request-id``, a new W3C ``traceparent`` and ``x-traffic-tag: tag``, one at a time.
    Returns how many completed; none completing is a failure."""
    n = int(positive("count", count, 1000))
    tokens = int(positive("max_tokens", max_tokens, 64))
    if not isinstance(tag, str) or not tag or len(tag) > 128:
        raise ActivityFailed(f"argument tag must be a non-empty string, got {tag!r}")
    failures: list[str] = []
    completed: list[SentColour] = []
    with stack_api(configuration, "sending coloured requests") as api:
        url = api.target.service_url("router") + "/v1/completions"
        for i in range(n):
            rid = f"colour-{_secrets.token_hex(6)}-{i}"
            colour = Colour(request_id=rid, trace_id=_secrets.token_hex(16), tag=tag)
            body = {"prompt": f"colouring check {i}", "max_tokens": tokens}
            started = time.time()
            try:
                resp = api.completion(body, colour_headers(colour, _secrets.token_hex(8)))
            except ApiError as exc:
                failures.append(f"{rid}: {exc.cause}")
                continue
            if resp.status_code == 200:
                completed.append({**colour, "at": started})
            else:
                failures.append(f"{rid}: HTTP {resp.status_code}")
    append_run_json_lines(configuration, SENT_NAME, completed)
    if not completed:
        raise ActivityFailed(
            f"none of {n} coloured requests to {url} completed: " + "; ".join(failures[:3])
        )
    return {"sent": n, "completed": len(completed), "tag": tag, "failures": failures[:10]}


def drop_colour(
    component: str,
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Make every replica of ``component`` treat incoming requests as untagged for
    ``ttl_s`` seconds (the ``drop_colour`` fault): the colouring probe must then name
    that hop."""
    ttl = positive("ttl_s", ttl_s, MAX_TTL_S)
    what = f"dropping the colour at {component}"
    return inject_fault(configuration, what, component, "drop_colour", ttl, {})
