"""Colouring fidelity, computed: per hop of ``HOP_RULES``, the share of requests completed
at the router whose request id, trace id and tag that hop saw unchanged.

Pure: hop logs in, figures out (``probes.colouring`` reads the logs' pages through
``gameday.api``; ``log_read`` makes one log of them). It must never count a
request it cannot check (a log that restarted or overwrote its hops since) as faithful.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from canary_contract.json import record_json
from gameday.evidence.slo import Slo, failed_result, result

DEFAULT_SETTLE_S = 3.0
# The router's inference routes: a 2xx there means a model server answered.
INFERENCE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MODEL_ROLES = ("model-baseline", "model-canary")
MAX_EXAMPLES = 3
CHECK = "colouring_fidelity"
UNIT = "ratio"


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


# A hop as a component's ``GET /v1/colour/hops`` gives it (``seq``, ``hop``, ``request_id``,
# ``trace_id``, ``tag``, ``at``, ``status``, ``path``), every value narrowed where it is read.
Hop = Mapping[str, object]


class Colour(TypedDict):
    """A request's colour as the harness sends it."""

    request_id: str
    trace_id: str
    tag: str


class SentColour(Colour):
    """A coloured request the harness sent and saw completed, and when it sent it."""

    at: float


class HopFigureJson(TypedDict):
    judged: int
    faithful: int
    ratio: float | None
    examples: list[str]


class FidelityJson(TypedDict):
    """``Fidelity`` as the colouring probe answers it (and its SLO's detail holds)."""

    completed: int
    judged: int
    faithful: int
    tagged: int
    not_checkable: int
    hops: dict[str, HopFigureJson]


def _time(value: object) -> float:
    """A time of a hop log (0.0 when it gives none)."""
    return float(value) if isinstance(value, int | float) else 0.0


def _hops(value: object) -> list[Hop]:
    """The hops of a page that are objects."""
    return [h for h in value if isinstance(h, dict)] if isinstance(value, list) else []


@dataclass
class LogRead:
    """One replica's hop log as read: its hops, when the process started, and the time
    before which it cannot vouch (its oldest held hop, when older ones were overwritten)."""

    role: str
    replica: str
    hops: Sequence[Hop]
    started_at: float
    lost_before: float | None = None


def colour_headers(colour: Colour, span_id: str) -> dict[str, str]:
    """The headers that send ``colour`` (its ``request_id``, ``trace_id`` and ``tag``):
    ``x-request-id``, a sampled W3C ``traceparent`` (parent span ``span_id``) and
    ``x-traffic-tag``. ``colour`` is what the router must then see."""
    return {
        "x-request-id": str(colour["request_id"]),
        "traceparent": f"00-{colour['trace_id']}-{span_id}-01",
        "x-traffic-tag": str(colour["tag"]),
    }


def log_read(role: str, replica: str, pages: Sequence[Mapping[str, object]]) -> LogRead:
    """One replica's ``LogRead`` from the pages of its ``GET /v1/colour/hops``, oldest
    first: the hops that are objects, its start from the first page and, when that page
    says older hops were overwritten (``lost``), the time of its oldest held hop."""
    first = pages[0] if pages else {}
    held = first.get("hops")
    lost_before = None
    if first.get("lost") and isinstance(held, list) and held:
        oldest = held[0] if isinstance(held[0], dict) else {}
        lost_before = _time(oldest.get("at"))
    hops = [h for page in pages for h in _hops(page.get("hops"))]
    return LogRead(role, replica, hops, _time(first.get("started_at")), lost_before)


@dataclass
class HopFigure:
    hop: str
    judged: int = 0
    faithful: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.faithful / self.judged if self.judged else None

    def as_json(self) -> HopFigureJson:
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

    def as_json(self) -> FidelityJson:
        hops = {name: fig.as_json() for name, fig in self.hops.items()}
        return record_json(self, FidelityJson, hops=hops)


def _covers(log: LogRead, at: float) -> bool:
    return log.started_at <= at and (log.lost_before is None or log.lost_before <= at)


def _same(hop: Hop, router_hop: Hop) -> bool:
    return bool(
        hop.get("trace_id") == router_hop["trace_id"] and hop.get("tag") == router_hop["tag"]
    )


def _describe(router_hop: Hop, seen: Sequence[Hop]) -> str:
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
    logs: Sequence[LogRead], sent: Sequence[Mapping[str, object]], fig: HopFigure
) -> int:
    """The ``router`` rule: each request the harness sent (and saw completed) is a router
    hop with the request id, trace id and tag it was sent with. Returns how many could
    not be checked (a router that restarted or overwrote hops since)."""
    routers = [lg for lg in logs if lg.role == "router"]
    at_router: dict[str, list[Hop]] = defaultdict(list)
    for log in routers:
        for hop in log.hops:
            rid = hop.get("request_id")
            if hop.get("hop") == "router" and isinstance(rid, str):
                at_router[rid].append(hop)
    unchecked = 0
    for want in sent:
        at = _time(want.get("at"))
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


def _completed(routers: Sequence[LogRead], since: float | None) -> list[tuple[LogRead, Hop, str]]:
    """The requests completed at a router (a 2xx of an inference path, since ``since``):
    each with its router's log and its request id (a hop without one cannot be judged)."""
    completed: list[tuple[LogRead, Hop, str]] = []
    for log in routers:
        for hop in log.hops:
            status, rid = hop.get("status"), hop.get("request_id")
            if (
                hop.get("hop") == "router"
                and hop.get("path") in INFERENCE_PATHS
                and isinstance(status, int)
                and 200 <= status < 300
                and isinstance(rid, str)
                and (since is None or _time(hop.get("at")) >= since)
            ):
                completed.append((log, hop, rid))
    return completed


def fidelity(
    logs: Sequence[LogRead],
    *,
    read_at: float,
    settle_s: float = DEFAULT_SETTLE_S,
    since: float | None = None,
    sent: Sequence[Mapping[str, object]] = (),
) -> Fidelity:
    """Per hop of ``HOP_RULES``, the share of requests completed at the router whose
    colour that hop saw unchanged (pure: ``logs`` as read at ``read_at``; requests that
    reached the router before ``since``, e.g. an earlier experiment's, are left out;
    ``sent``: the requests the harness sent coloured, ``{request_id, trace_id, tag, at}``)."""
    by_role: dict[str, list[LogRead]] = defaultdict(list)
    for log in logs:
        by_role[log.role].append(log)
    # request id -> hop name -> sightings (with the role that saw each)
    seen: dict[str, dict[str, list[Hop]]] = defaultdict(lambda: defaultdict(list))
    for log in logs:
        for hop in log.hops:
            rid = hop.get("request_id")
            if isinstance(rid, str):
                seen[rid][str(hop.get("hop"))].append(hop)
    completed = _completed(by_role.get("router", []), since)
    per_id: dict[str, int] = defaultdict(int)
    for _, _, rid in completed:
        per_id[rid] += 1
    figures = {rule.hop: HopFigure(rule.hop) for rule in HOP_RULES}
    judged = faithful = tagged = 0
    not_checkable = _router_figure(logs, sent, figures["router"])
    for router_log, rhop, rid in completed:
        at = _time(rhop.get("at"))
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


def fidelity_result(fid: Fidelity, ratio: float, min_requests: int) -> Slo:
    """The SLO result: at least ``ratio`` kept their colour at every hop (measured: the
    lowest per-hop share), judged over at least ``min_requests`` requests; its ``why``
    names the hop that lost the colour first (``lost_at``) and example request ids."""
    detail = fid.as_json()
    if fid.judged < min_requests:
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
    ok = measured >= ratio
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
