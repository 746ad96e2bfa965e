"""Traffic colouring, verified (issue #16 item 4): do a request's id, trace id and tag
survive every hop?

Every component keeps the hops it saw (``GET /v1/colour/hops``, paged, with its admin
credential). ``colouring_fidelity`` reads every replica's log and computes, per hop of
``HOP_RULES`` (THE table of where a request's colour must be seen), the share of requests
completed at the router (a 2xx answer on an inference route) whose request id, trace id
and tag that hop saw unchanged; ``colouring_fidelity_at_least(ratio=1.0)`` is the SLO
result (``check: colouring_fidelity``) whose failure names the hop that lost the colour
and an example request id. ``fidelity`` is the pure computation the report can reuse.

Only this experiment's requests are judged (those that reached the router since its load
started, ``load.json``), and only where they can be: one that reached the router after a log it
should reach had restarted or overwritten its oldest hops, or less than ``settle_s``
before the read (its shadow copies may still run), is counted as not checkable, never as
faithful. No request to judge is a failure after the method (fail-closed), and
``not_measured`` before it.

``send_coloured_requests`` (an action) sends a few tagged, traced requests through the
router, so an experiment can measure the tag even when its load sends none;
``drop_colour`` (an action) makes one component lose the tag for ``ttl_s`` (the
``drop_colour`` fault every component has).

Nothing here imports ``canarystack``.
"""

from __future__ import annotations

import json
import secrets as _secrets
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday import faults as gd_faults
from gameday.evidence.slo import Slo, failed_result, not_measured, result
from gameday.oracle.wire import loads
from gameday.targets import Target
from probes._context import (
    Configuration,
    get_target,
    harness_errors,
    ledger,
    positive,
    run_dir,
)
from probes._evidence import NOT_YET, before_anything, load_state

__all__ = [
    "colouring_fidelity",
    "colouring_fidelity_at_least",
    "drop_colour",
    "send_coloured_requests",
]

CHECK = "colouring_fidelity"
UNIT = "ratio"
HOPS_PATH = "/v1/colour/hops"
PAGE_LIMIT = 10000
MAX_PAGES = 50
HTTP_TIMEOUT_S = 5.0
DEFAULT_SETTLE_S = 3.0
DEFAULT_TAG = "gameday"
# The router's inference routes: a 2xx there means a model server answered.
INFERENCE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MODEL_ROLES = ("model-baseline", "model-canary")
LOG_ROLES = ("router", *MODEL_ROLES, "gate", "broker")
MAX_EXAMPLES = 3
MAX_TTL_S = 600.0
# What send_coloured_requests sent and saw completed, in the run folder (JSON lines).
SENT_NAME = "coloured_requests.jsonl"


@dataclass(frozen=True)
class HopRule:
    """Where a completed request's colour must be seen.

    ``hop``: the hop name components record; ``roles``: whose logs hold it; ``reach``:
    True when every request the rule applies to must be seen there (else only the ones
    seen there are judged: their colour must be the router's); ``applies``: which
    requests (``all``; ``shadowed``: the router made shadow copies of it; ``sent``: the
    harness sent it with a known colour and it completed)."""

    hop: str
    roles: tuple[str, ...]
    reach: bool
    applies: str
    says: str


# THE table (checked against a live stack by tests/test_colour_fidelity.py). Order is the
# path a request takes: a failure names the first hop that lost the colour.
HOP_RULES: tuple[HopRule, ...] = (
    HopRule(
        "router",
        ("router",),
        True,
        "sent",
        "the first hop, for the tagged requests the harness sent",
    ),
    HopRule("model", MODEL_ROLES, True, "all", "the model server that answered it"),
    HopRule(
        "shadow",
        ("router", *MODEL_ROLES),
        True,
        "shadowed",
        "each shadow copy: the router's copy and the model side it reached",
    ),
    HopRule("redis", MODEL_ROLES, False, "all", "the model server's Redis call"),
    HopRule("gate_sample", ("gate",), False, "all", "the gate, for the request's sample"),
    HopRule("trip_evidence", ("broker",), False, "all", "the broker, in a trip's evidence"),
)


@dataclass
class LogRead:
    """One replica's hop log as read: its hops, when the process started, and the time
    before which it cannot vouch (its oldest held hop, when older ones were overwritten)."""

    role: str
    replica: str
    hops: list[JsonObject]
    started_at: float
    lost_before: float | None = None


@dataclass
class HopFigure:
    hop: str
    judged: int = 0
    faithful: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.faithful / self.judged if self.judged else None

    def as_json(self) -> JsonObject:
        return {
            "judged": self.judged,
            "faithful": self.faithful,
            "ratio": None if self.ratio is None else round(self.ratio, 6),
            "examples": self.examples,
        }


@dataclass
class Fidelity:
    completed: int  # requests completed at the router (judged or not)
    judged: int
    faithful: int  # judged requests faithful at every hop that applies
    tagged: int  # judged requests that carried a tag at the router
    not_checkable: int
    hops: dict[str, HopFigure]

    @property
    def ratio(self) -> float | None:
        return self.faithful / self.judged if self.judged else None

    def worst(self) -> HopFigure | None:
        """The first hop (in path order) below 1, or None."""
        for rule in HOP_RULES:
            fig = self.hops.get(rule.hop)
            if fig is not None and fig.judged and fig.faithful < fig.judged:
                return fig
        return None

    def as_json(self) -> JsonObject:
        return {
            "completed": self.completed,
            "judged": self.judged,
            "faithful": self.faithful,
            "tagged": self.tagged,
            "not_checkable": self.not_checkable,
            "hops": {name: fig.as_json() for name, fig in self.hops.items()},
        }


def _covers(log: LogRead, at: float) -> bool:
    return log.started_at <= at and (log.lost_before is None or log.lost_before <= at)


def _same(hop: Mapping[str, Any], router_hop: Mapping[str, Any]) -> bool:
    return hop.get("trace_id") == router_hop["trace_id"] and hop.get("tag") == router_hop["tag"]


def _describe(router_hop: Mapping[str, Any], seen: Sequence[Mapping[str, Any]]) -> str:
    rid = router_hop["request_id"]
    if not seen:
        return f"{rid} (never seen there)"
    bad = next((h for h in seen if not _same(h, router_hop)), seen[0])
    parts = []
    if bad.get("tag") != router_hop["tag"]:
        parts.append(f"tag {router_hop['tag']!r} -> {bad.get('tag')!r}")
    if bad.get("trace_id") != router_hop["trace_id"]:
        parts.append(f"trace {router_hop['trace_id']} -> {bad.get('trace_id')}")
    return f"{rid} ({', '.join(parts) or 'too few sightings'})"


def _router_figure(
    logs: Sequence[LogRead], sent: Sequence[Mapping[str, Any]], fig: HopFigure
) -> int:
    """The ``router`` rule: each request the harness sent (and saw completed) is a router
    hop with the request id, trace id and tag it was sent with. Returns how many could
    not be checked (a router that restarted or overwrote hops since)."""
    routers = [lg for lg in logs if lg.role == "router"]
    at_router: dict[str, list[JsonObject]] = defaultdict(list)
    for log in routers:
        for hop in log.hops:
            if hop.get("hop") == "router" and isinstance(hop.get("request_id"), str):
                at_router[hop["request_id"]].append(hop)
    unchecked = 0
    for want in sent:
        at = float(want.get("at") or 0.0)
        if not routers or not all(_covers(lg, at) for lg in routers):
            unchecked += 1
            continue
        got = [h for h in at_router.get(str(want.get("request_id")), [])]
        traced = [h for h in got if h.get("trace_id") == want.get("trace_id")]
        fig.judged += 1
        if traced and all(h.get("tag") == want.get("tag") for h in traced):
            fig.faithful += 1
        elif len(fig.examples) < MAX_EXAMPLES:
            fig.examples.append(_describe(want, traced or got))
    return unchecked


def fidelity(
    logs: Sequence[LogRead],
    *,
    read_at: float,
    settle_s: float = DEFAULT_SETTLE_S,
    since: float | None = None,
    sent: Sequence[Mapping[str, Any]] = (),
) -> Fidelity:
    """Per hop of ``HOP_RULES``, the share of requests completed at the router whose
    colour that hop saw unchanged (pure: ``logs`` as read at ``read_at``; requests that
    reached the router before ``since``, e.g. an earlier experiment's, are left out;
    ``sent``: the requests the harness sent coloured, ``{request_id, trace_id, tag, at}``)."""
    by_role: dict[str, list[LogRead]] = defaultdict(list)
    for log in logs:
        by_role[log.role].append(log)
    # request id -> hop name -> sightings (with the role that saw each)
    seen: dict[str, dict[str, list[JsonObject]]] = defaultdict(lambda: defaultdict(list))
    for log in logs:
        for hop in log.hops:
            rid = hop.get("request_id")
            if isinstance(rid, str):
                seen[rid][str(hop.get("hop"))].append(hop)
    completed: list[tuple[LogRead, JsonObject]] = []
    for log in by_role.get("router", []):
        for hop in log.hops:
            status = hop.get("status")
            if (
                hop.get("hop") == "router"
                and hop.get("path") in INFERENCE_PATHS
                and isinstance(status, int)
                and 200 <= status < 300
                and (since is None or float(hop.get("at") or 0.0) >= since)
            ):
                completed.append((log, hop))
    per_id: dict[str, int] = defaultdict(int)
    for _, rhop in completed:
        per_id[rhop["request_id"]] += 1
    figures = {rule.hop: HopFigure(rule.hop) for rule in HOP_RULES}
    judged = faithful = tagged = 0
    not_checkable = _router_figure(logs, sent, figures["router"])
    for router_log, rhop in completed:
        at = float(rhop.get("at") or 0.0)
        rid = rhop["request_id"]
        reach_logs = [lg for role in MODEL_ROLES for lg in by_role.get(role, [])]
        if (
            at + settle_s > read_at
            or not reach_logs
            or not all(_covers(lg, at) for lg in reach_logs)
            or not _covers(router_log, at)
        ):
            not_checkable += 1
            continue
        judged += 1
        tagged += rhop.get("tag") is not None
        sightings = seen.get(rid, {})
        if per_id[rid] > 1:
            # A client sent this id with more than one request: tell them apart by trace.
            sightings = {
                name: [h for h in got if h.get("trace_id") == rhop["trace_id"]]
                for name, got in sightings.items()
            }
        ok_all = True
        models = sightings.get("model", [])
        shadows = [h for h in sightings.get("shadow", []) if h is not rhop]
        for rule in HOP_RULES:
            fig = figures[rule.hop]
            if rule.applies == "sent" or (rule.applies == "shadowed" and not shadows):
                continue
            if rule.hop == "shadow":
                # Each copy is seen at the router and by one more model server.
                got = shadows + models
                ok = len(models) >= 1 + len(shadows) and all(_same(h, rhop) for h in got)
            elif rule.reach:
                got = sightings.get(rule.hop, [])
                ok = bool(got) and all(_same(h, rhop) for h in got)
            else:
                got = sightings.get(rule.hop, [])
                if not got:
                    continue
                ok = all(_same(h, rhop) for h in got)
            fig.judged += 1
            if ok:
                fig.faithful += 1
            else:
                ok_all = False
                if len(fig.examples) < MAX_EXAMPLES:
                    fig.examples.append(_describe(rhop, got))
        faithful += ok_all
    return Fidelity(len(completed), judged, faithful, tagged, not_checkable, figures)


# -- reading the logs ------------------------------------------------------------------------
def _get(url: str, headers: Mapping[str, str], params: Mapping[str, Any] | None = None) -> Any:
    try:
        resp = requests.get(url, params=params, headers=dict(headers), timeout=HTTP_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ActivityFailed(f"reading {url}: {type(exc).__name__}: {exc}") from None
    if resp.status_code != 200:
        raise ActivityFailed(f"reading {url}: HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        return loads(resp.content)
    except ValueError as exc:
        raise ActivityFailed(f"reading {url}: not strict JSON: {exc}") from None


def read_log(target: Target, role: str, replica_name: str, url: str) -> LogRead:
    """Every hop one replica holds (paged), with its start time and what it lost."""
    headers = target.fault_headers(role)
    hops: list[JsonObject] = []
    after = 0
    started_at = 0.0
    lost_before: float | None = None
    for page_no in range(MAX_PAGES):
        page = _get(url + HOPS_PATH, headers, {"after_seq": after, "limit": PAGE_LIMIT})
        if not isinstance(page, dict) or not isinstance(page.get("hops"), list):
            raise ActivityFailed(f"{url}{HOPS_PATH}: the answer has no 'hops' list")
        if page_no == 0:
            started_at = float(page.get("started_at") or 0.0)
            if page.get("lost") and page["hops"]:
                lost_before = float(page["hops"][0].get("at") or 0.0)
        got = [h for h in page["hops"] if isinstance(h, dict)]
        hops += got
        nxt = page.get("next_after_seq")
        if not got or not isinstance(nxt, int) or nxt <= after:
            break
        after = nxt
    return LogRead(role, replica_name, hops, started_at, lost_before)


def read_logs(target: Target) -> list[LogRead]:
    logs = []
    for role in LOG_ROLES:
        for rep in target.replicas(role):
            logs.append(read_log(target, role, rep.name, rep.url))
    return logs


def read_sent(configuration: Configuration | None) -> list[JsonObject]:
    """The coloured requests this run's ``send_coloured_requests`` saw completed."""
    path = run_dir(configuration) / SENT_NAME
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            row = loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("request_id"), str):
            out.append(row)
    return out


def colouring_fidelity(
    settle_s: float = DEFAULT_SETTLE_S,
    configuration: Configuration | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> JsonObject:
    """Per hop, how many requests completed at the router kept their colour there (the
    figures ``colouring_fidelity_at_least`` judges)."""
    with harness_errors("reading the hop logs"):
        target = get_target(configuration)
        read_at = time.time()
        logs = read_logs(target)
    started = (load_state(configuration) or {}).get("started_at")
    since = float(started) if isinstance(started, int | float) and started > 0 else None
    sent = read_sent(configuration)
    return fidelity(logs, read_at=read_at, settle_s=settle_s, since=since, sent=sent).as_json()


def colouring_fidelity_at_least(
    ratio: float = 1.0,
    min_requests: int = 20,
    settle_s: float = DEFAULT_SETTLE_S,
    configuration: Configuration | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> Slo:
    """SLO: at least ``ratio`` of the completed requests (and at least ``min_requests``
    judged) kept their request id, trace id and tag at every hop they reached; measured
    is the lowest per-hop share. Its ``why`` names the hop that lost the colour first and
    example request ids."""
    if not 0 < float(ratio) <= 1:
        raise ActivityFailed(f"argument ratio must be above 0 and at most 1, got {ratio!r}")
    if before_anything(configuration):
        return not_measured(CHECK, ratio, UNIT, NOT_YET)
    try:
        with harness_errors("reading the hop logs"):
            target = get_target(configuration)
            read_at = time.time()
            logs = read_logs(target)
    except ActivityFailed as exc:
        return failed_result(CHECK, ratio, UNIT, f"the hop logs could not be read: {exc}")
    started = (load_state(configuration) or {}).get("started_at")
    since = float(started) if isinstance(started, int | float) and started > 0 else None
    fid = fidelity(
        logs, read_at=read_at, settle_s=settle_s, since=since, sent=read_sent(configuration)
    )
    detail = fid.as_json()
    if fid.judged < int(min_requests):
        return failed_result(
            CHECK,
            ratio,
            UNIT,
            f"only {fid.judged} completed request(s) could be judged (at least "
            f"{min_requests} needed; {fid.completed} completed at the router, "
            f"{fid.not_checkable} not checkable): colouring fidelity is unknown",
            **detail,
        )
    ratios = [fig.ratio for fig in fid.hops.values() if fig.ratio is not None]
    measured = min(ratios) if ratios else 1.0
    worst = fid.worst()
    ok = measured >= float(ratio)
    if worst is not None:
        rule = next(r for r in HOP_RULES if r.hop == worst.hop)
        why = (
            f"hop {worst.hop!r} ({rule.says}) lost the colour of "
            f"{worst.judged - worst.faithful} of {worst.judged} request(s), e.g. "
            + "; ".join(worst.examples)
        )
    else:
        why = f"every hop kept the colour of all {fid.judged} request(s) ({fid.tagged} tagged)"
    return result(
        CHECK, measured, ratio, UNIT, ok, why=why, lost_at=worst.hop if worst else None, **detail
    )


# -- actions ---------------------------------------------------------------------------------
def _sent_colour(headers: Mapping[str, str]) -> JsonObject:
    """What a request sent with ``headers`` must be seen as at the router."""
    return {
        "request_id": headers["x-request-id"],
        "trace_id": headers["traceparent"].split("-")[1],
        "tag": headers.get("x-traffic-tag"),
    }


def send_coloured_requests(
    count: int = 30,
    tag: str = DEFAULT_TAG,
    max_tokens: int = 4,
    configuration: Configuration | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> JsonObject:
    """Send ``count`` small completions through the router, each with its own
    ``x-request-id``, a new W3C ``traceparent`` and ``x-traffic-tag: tag``, one at a time.
    Returns how many completed; none completing is a failure."""
    n = int(positive("count", count, 1000))
    tokens = int(positive("max_tokens", max_tokens, 64))
    if not isinstance(tag, str) or not tag or len(tag) > 128:
        raise ActivityFailed(f"argument tag must be a non-empty string, got {tag!r}")
    with harness_errors("sending coloured requests"):
        target = get_target(configuration)
        url = target.service_url("router") + "/v1/completions"
    ids: list[str] = []
    failures: list[str] = []
    completed: list[JsonObject] = []
    with requests.Session() as session:
        for i in range(n):
            rid = f"colour-{_secrets.token_hex(6)}-{i}"
            headers = {
                "x-request-id": rid,
                "traceparent": f"00-{_secrets.token_hex(16)}-{_secrets.token_hex(8)}-01",
                "x-traffic-tag": tag,
            }
            body = {"prompt": f"colouring check {i}", "max_tokens": tokens}
            started = time.time()
            try:
                resp = session.post(url, json=body, headers=headers, timeout=HTTP_TIMEOUT_S * 2)
            except requests.RequestException as exc:
                failures.append(f"{rid}: {type(exc).__name__}")
                continue
            if resp.status_code == 200:
                ids.append(rid)
                completed.append({**_sent_colour(headers), "at": started})
            else:
                failures.append(f"{rid}: HTTP {resp.status_code}")
    folder = run_dir(configuration)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / SENT_NAME).open("a", encoding="utf-8") as out:
        for row in completed:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    if not ids:
        raise ActivityFailed(
            f"none of {n} coloured requests to {url} completed: " + "; ".join(failures[:3])
        )
    return {"sent": n, "completed": len(ids), "tag": tag, "failures": failures[:10]}


def drop_colour(
    component: str,
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
    secrets: Mapping[str, Any] | None = None,
) -> JsonObject:
    """Make every replica of ``component`` treat incoming requests as untagged for
    ``ttl_s`` seconds (the ``drop_colour`` fault): the colouring probe must then name
    that hop."""
    ttl = positive("ttl_s", ttl_s, MAX_TTL_S)
    with harness_errors(f"dropping the colour at {component}"):
        target = get_target(configuration)
        entries = gd_faults.inject(target, component, "drop_colour", ttl, {}, ledger(configuration))
    return {
        "component": component,
        "kind": "drop_colour",
        "ttl_s": ttl,
        "replicas": [e.replica for e in entries],
        "fault_ids": [e.fault_id for e in entries],
        "injected_at": min(e.time for e in entries) if entries else None,
    }
