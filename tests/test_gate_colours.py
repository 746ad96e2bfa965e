"""Colours in the gate's samples and trip evidence (issue #16, item 4).

A comparison or outcome may carry the request's colour (``request_id``, ``trace_id``,
``tag``, as ``canarystack.common.colour`` renders them). The gate refuses a bad one (400
naming the field), records a ``gate_sample`` hop per coloured sample, keeps the colours of
the most recent samples per bucket (bounded) and puts up to 8 of the samples behind a trip
into the evidence it writes; the broker stores them (tests/test_broker_colours.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from canarystack.common.errors import BadRequest, parse_model
from canarystack.gate.server import SERVICE, build_app
from canarystack.gate.state import (
    COLOURS_PER_BUCKET,
    MAX_TRIP_COLOURS,
    GateConfig,
    ReleaseGate,
    SampleBatch,
)
from tests.procs import Spawner, wait_for
from tests.test_gate_service import batch as http_batch
from tests.test_gate_service import comparison as http_comparison
from tests.test_gate_service import gate_state, post, setup_stack
from tests.test_gate_stats import comparison, outcome, release


def coloured(sample: dict[str, Any], i: int, tag: str | None = "gameday") -> dict[str, Any]:
    return {**sample, "request_id": f"req-{i}", "trace_id": f"{i:032x}", "tag": tag}


def record(i: int, tag: str | None = "gameday") -> dict[str, Any]:
    return {"request_id": f"req-{i}", "trace_id": f"{i:032x}", "tag": tag}


def batch(
    comparisons: Sequence[dict[str, Any]] = (),
    outcomes: Sequence[dict[str, Any]] = (),
    batch_id: str | None = None,
) -> SampleBatch:
    body: dict[str, Any] = {
        "router_id": "r0",
        "release": "default",
        "comparisons": list(comparisons),
        "outcomes": list(outcomes),
    }
    if batch_id is not None:
        body["batch_id"] = batch_id
    return SampleBatch.model_validate(body)


def progressing_gate() -> ReleaseGate:
    g = ReleaseGate("default", GateConfig())
    g.on_release(release(), 0.0)
    return g


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("comparisons", "trace_id", "XYZ"),
        ("comparisons", "trace_id", "A" * 32),  # upper case: not what traceparent carries
        ("comparisons", "trace_id", "0" * 31),
        ("comparisons", "request_id", "has space"),
        ("comparisons", "request_id", "r" * 129),
        ("comparisons", "tag", "tag\nnewline"),
        ("outcomes", "tag", ""),
        ("outcomes", "request_id", "é"),
        ("outcomes", "trace_id", 12345),
    ],
)
def test_a_bad_colour_field_is_refused_naming_the_field(where: str, field: str, value: Any) -> None:
    good_c = coloured(comparison(1.0, "4k+", 0.01), 1)
    good_o = coloured(outcome(1.0, "canary", "4k+", 0.1), 2)
    body: dict[str, Any] = {
        "router_id": "r0",
        "release": "default",
        "comparisons": [good_c, dict(good_c)],
        "outcomes": [good_o, dict(good_o)],
    }
    body[where][1][field] = value
    with pytest.raises(BadRequest) as err:
        parse_model(SampleBatch, body, what="sample batch")
    assert err.value.param == f"{where}[1].{field}"
    assert field in err.value.message


def test_colour_fields_are_optional_and_a_valid_colour_is_kept() -> None:
    b = batch(
        [comparison(1.0, "4k+", 0.01), coloured(comparison(1.1, "4k+", 0.01), 7)],
        [coloured(outcome(1.2, "canary", "4k+", 0.1), 8, tag=None)],
    )
    assert b.comparisons[0].trace_id is None and b.comparisons[0].colour_record() is None
    assert b.comparisons[1].colour_record() == record(7)
    assert b.outcomes[0].colour_record() == record(8, tag=None)


# ------------------------------------------------------------- recent colours, trips
def test_trip_evidence_carries_the_colours_of_the_last_samples_behind_it() -> None:
    g = progressing_gate()
    # Healthy, coloured samples in another bucket, and drifted ones in 4k+: only the
    # drifted bucket's comparisons are behind the trip.
    g.ingest(batch([coloured(comparison(0.5, "0-512", 0.0), 900)]), 0.5, 0.5)
    sent: list[int] = []
    for i in range(2000):
        c = comparison(1.0 + 0.01 * i, "4k+", 0.03)
        if i % 3 != 2:  # some samples are not coloured (an older router)
            c = coloured(c, i)
            sent.append(i)
        g.ingest(batch([c]), 1.0 + i, 1.0 + i)
        if g.trip is not None:
            break
    assert g.trip is not None and g.trip["test"] == "drift"
    assert len(sent) > MAX_TRIP_COLOURS  # more coloured samples than the evidence keeps
    assert g.trip["colours"] == [record(i) for i in sent[-MAX_TRIP_COLOURS:]]


def test_an_errors_trip_names_the_failed_canary_requests() -> None:
    g = progressing_gate()
    for i in range(400):
        t = 1.0 + 0.01 * i
        outs = [
            coloured(outcome(t, "baseline", "0-512", 0.1), 10_000 + i),
            coloured(outcome(t, "canary", "0-512", 0.1), 20_000 + i),  # healthy canary
            coloured(outcome(t, "canary", "0-512", None, error="500"), 30_000 + i),
        ]
        g.ingest(batch(outcomes=outs), t, t)
        if g.trip is not None:
            break
    assert g.trip is not None and g.trip["test"] == "errors"
    colours = g.trip["colours"]
    assert len(colours) == MAX_TRIP_COLOURS
    assert all(c["request_id"].startswith("req-3") for c in colours), colours


def test_recent_colours_per_bucket_are_bounded() -> None:
    g = progressing_gate()
    comps = [coloured(comparison(1.0 + 0.001 * i, "4k+", 0.0), i) for i in range(500)]
    g.ingest(batch(comps), 1.0, 1.0)
    kept = g.buckets["4k+"].colours["comparison"]
    assert len(kept) == COLOURS_PER_BUCKET
    assert [r for _, r in kept] == [record(i) for i in range(500 - COLOURS_PER_BUCKET, 500)]


def test_a_no_data_trip_has_no_colours() -> None:
    g = progressing_gate()
    g.decide_no_data(100.0, 100.0)
    assert g.trip is not None and g.trip["colours"] == []


# ------------------------------------------------------------------------- hops
def test_each_coloured_sample_of_an_accepted_batch_is_a_gate_sample_hop() -> None:
    app = build_app(
        GateConfig(), "http://127.0.0.1:9", ["default"], admin_token=None, max_fault_ttl_s=60
    )
    service = app[SERVICE]
    service.gates["default"].on_release(release(), 0.0)
    body = {
        "router_id": "r0",
        "release": "default",
        "batch_id": "b1",
        "comparisons": [
            coloured(comparison(1.0, "4k+", 0.0), 1, tag="shadow"),
            comparison(1.1, "4k+", 0.0),  # not coloured: no hop
        ],
        "outcomes": [coloured(outcome(1.2, "baseline", "4k+", 0.1), 2, tag=None)],
    }
    asyncio.run(service.ingest(body))
    asyncio.run(service.ingest(dict(body)))  # a resend counts nothing and is no new hop
    hops, _ = service.component.hops.since(0)
    seen = [(h.hop, h.request_id, h.trace_id, h.tag) for _, h in hops if h.hop == "gate_sample"]
    assert seen == [
        ("gate_sample", "req-1", f"{1:032x}", "shadow"),
        ("gate_sample", "req-2", f"{2:032x}", None),
    ]


# -------------------------------------------------------------------- end to end
def test_the_broker_stores_the_colours_of_a_trip_the_gate_wrote(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, gate = setup_stack(spawn, tmp_path)
    for i in range(60):
        c = http_comparison("4k+", 1.0, top1_agree=0.0)
        r = post(gate, http_batch([coloured(c, i)]))
        assert r.status_code == 200, r.text
        if r.json()["state"] == "tripped":
            break
    trip = wait_for(
        lambda: (rel := api.release("default"))["phase"] == "tripped" and rel["trip"],
        what="phase=tripped in the broker",
    )
    assert isinstance(trip, dict)
    colours = trip["colours"]
    assert 1 <= len(colours) <= MAX_TRIP_COLOURS
    assert colours == [record(int(c["request_id"][4:])) for c in colours]
    last = int(colours[-1]["request_id"][4:])
    assert colours == [record(i) for i in range(last - len(colours) + 1, last + 1)]
    assert gate_state(gate)["trip"]["colours"] == colours
