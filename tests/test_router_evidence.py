"""What the router takes for gate evidence, and the colour it carries (#16 items 3-4).

A shared dependency outage is no evidence: a model server answers ``x-dependency:
degraded`` when its Redis context lookup failed (here: a Redis URL where nothing
listens), and both variants share that dependency. A comparison whose sides differ in
that header, or where either is degraded, is dropped and counted; the outcome of a
degraded answer is not pushed either.

Colour: every upstream call the router makes for a request (the chosen variant and the
shadow copy) carries the request's id, trace id and tag, each as a span of its own; the
gate's records carry them too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.router.divergence import SideResult
from canarystack.router.shadow_session import dependency_shared
from tests import router_support as rs
from tests.procs import Proc, Spawner, free_port, wait_for

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ("ok", "ok", True),
        (None, None, True),
        ("ok", None, False),
        (None, "ok", False),
        ("ok", "degraded", False),
        ("degraded", "ok", False),
        ("degraded", "degraded", False),
    ],
)
def test_only_sides_that_saw_the_dependency_alike_and_whole_are_evidence(
    a: str | None, b: str | None, shared: bool
) -> None:
    assert dependency_shared(SideResult(dependency=a), SideResult(dependency=b)) is shared


def _dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}"  # nothing listens: every lookup fails


def test_a_degraded_dependency_is_no_canary_evidence(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    baseline = rs.start_model(spawn, "v1", "--redis-url", _dead_redis())
    canary = rs.start_model(spawn, "v2")
    rs.write_release_cache(tmp_path, weight=50)
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--shadow-rates", "0-512=1", gate=gate.url
    )
    served: dict[str, list[str]] = {"baseline": [], "canary": []}
    n = 24
    for i in range(n):
        rid = f"dep{i}"
        r = rs.completion(router.url, headers={"x-request-id": rid, "x-user-id": f"user-{i}"})
        assert r.status_code == 200, r.text
        variant = r.headers["x-served-by"]
        served[variant].append(rid)
        # The setup: the baseline answers without its dead dependency, the canary has none.
        assert r.headers.get("x-dependency") == ("degraded" if variant == "baseline" else None)
    assert served["baseline"] and served["canary"], served  # 24 users at 50 %: both serve

    # Every request had a baseline-canary copy, and not one of them is evidence.
    wait_for(
        lambda: (
            rs.metric(
                router,
                "router_shadow_requests_total",
                pair="baseline-canary",
                result="dependency_degraded",
            )
            == n
        ),
        what=f"{n} comparisons dropped as dependency_degraded",
    )
    assert rs.metric(router, "router_shadow_comparisons_total") == 0
    # The canary's own (whole) answers are outcomes; the degraded baseline's are not.
    wait_for(
        lambda: (
            sorted(o["request_id"] for o in gate.records("outcomes")) == sorted(served["canary"])
        ),
        what="the canary's outcomes at the gate",
    )
    skipped = rs.metric(router, "router_outcomes_skipped_total", reason="dependency_degraded")
    assert skipped == len(served["baseline"])
    assert gate.records("comparisons") == []


def _model_lines(model: Proc, request_id: str) -> list[dict[str, Any]]:
    return [
        e
        for e in model.log_events()
        if e.get("event") == "request_done" and e.get("request_id") == request_id
    ]


def test_the_colour_reaches_the_variant_the_shadow_copy_and_the_gate(
    spawn: Spawner, tmp_path: Path, gate: rs.GateReceiver
) -> None:
    baseline = rs.start_model(spawn, "v1")
    canary = rs.start_model(spawn, "v2")
    rs.write_release_cache(tmp_path, weight=100)  # the canary serves, the copy goes to baseline
    router = rs.start_router(
        spawn, tmp_path, [baseline.url], [canary.url], "--shadow-rates", "0-512=1", gate=gate.url
    )
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = rs.completion(
        router.url,
        headers={
            "x-request-id": "coloured-1",
            "traceparent": f"00-{trace_id}-{client_span}-01",
            "x-traffic-tag": "gameday-colour",
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-served-by"] == "canary"
    assert r.headers["x-request-id"] == "coloured-1"

    primary = wait_for(lambda: _model_lines(canary, "coloured-1"), what="the canary's line")
    copy = wait_for(lambda: _model_lines(baseline, "coloured-1"), what="the shadow copy's line")
    assert isinstance(primary, list) and isinstance(copy, list)
    spans = {client_span}
    for line in (primary[0], copy[0]):
        m = TRACEPARENT.match(str(line["traceparent"]))
        assert m is not None, line
        assert m.group(1) == trace_id  # the client's trace
        assert m.group(2) not in spans  # each call its own span
        spans.add(m.group(2))
        assert line["traffic_tag"] == "gameday-colour"

    colour = {"request_id": "coloured-1", "trace_id": trace_id, "tag": "gameday-colour"}
    wait_for(lambda: gate.records("comparisons"), what="the comparison at the gate")
    wait_for(lambda: gate.records("outcomes"), what="the outcome at the gate")
    for kind in ("comparisons", "outcomes"):
        (record,) = gate.records(kind)
        assert {k: record.get(k) for k in colour} == colour, record

    # The router's hop log: the request as it arrived, and the shadow copy it sent.
    r = requests.get(router.url + "/v1/colour/hops", headers=rs.ADMIN, timeout=5)
    assert r.status_code == 200, r.text
    hops = [h for h in r.json()["hops"] if h["request_id"] == "coloured-1"]
    assert sorted(h["hop"] for h in hops) == ["router", "shadow"], hops
    for hop in hops:
        assert {k: hop[k] for k in colour} == colour, hop
