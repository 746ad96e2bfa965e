"""Traffic colouring in every component (issue #16 item 4), against real processes: the
middleware's hop log and ``x-request-id`` echo, ``GET /v1/colour/hops`` (credential,
bounded paging, 400s), the ``drop_colour`` fault with its TTL, the route and the fault in
the OpenAPI document, and OpenTelemetry spans exported over OTLP/HTTP to the harness's
receiver (``gameday.otel``), which refuses nothing loopback and never slows a request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.common import otel
from tests.model_helpers import FAST, module_spawner, stream
from tests.procs import ADMIN_TOKEN, Proc, Spawner, free_port, inject_fault, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
BODY = {"prompt": "a b c", "max_tokens": 3}


def hops(proc: Proc, **query: Any) -> dict[str, Any]:
    resp = requests.get(proc.url + "/v1/colour/hops", params=query, headers=ADMIN, timeout=10)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def completion(proc: Proc, headers: dict[str, str]) -> requests.Response:
    resp = requests.post(proc.url + "/v1/completions", json=BODY, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def hop_of(proc: Proc, request_id: str) -> dict[str, Any]:
    found = [h for h in hops(proc, limit=10000)["hops"] if h["request_id"] == request_id]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("otel")
    with module_spawner(tmp) as spawn:
        yield spawn("gameday.otel", "--out", str(tmp / "spans.jsonl"), admin_token=None)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, receiver: Proc) -> Iterator[Proc]:
    with module_spawner(tmp_path_factory.mktemp("colour-model")) as spawn:
        yield spawn(
            "canarystack.model",
            "--version",
            "v1",
            *FAST,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
        )


def test_a_coloured_request_is_one_hop_with_its_ids_tag_status_and_route(model: Proc) -> None:
    headers = {"x-request-id": "colour-1", "traceparent": TRACEPARENT, "x-traffic-tag": "gameday"}
    resp, _, _ = stream(model, "/v1/completions", BODY, headers=headers)
    assert resp.headers["x-request-id"] == "colour-1"
    hop = hop_of(model, "colour-1")
    assert hop["hop"] == "model"
    assert hop["trace_id"] == TRACE and hop["tag"] == "gameday"
    assert hop["status"] == 200 and hop["path"] == "/v1/completions"


def test_a_request_without_colour_gets_an_id_that_is_echoed_and_recorded(model: Proc) -> None:
    before = hops(model)["last_seq"]
    resp = requests.get(model.url + "/v1/models", timeout=10)
    assert resp.status_code == 200
    rid = resp.headers["x-request-id"]
    hop = hop_of(model, rid)
    assert hop["seq"] > before and hop["tag"] is None and hop["path"] == "/v1/models"
    # An error answer is a hop too, with its status.
    bad = requests.post(model.url + "/v1/completions", json={"prompt": 5}, timeout=10)
    assert bad.status_code == 400
    assert hop_of(model, bad.headers["x-request-id"])["status"] == 400


def test_health_metrics_openapi_and_the_hop_log_itself_are_not_hops(model: Proc) -> None:
    before = hops(model)["last_seq"]
    for path in ("/health", "/metrics", "/openapi.json"):
        resp = requests.get(model.url + path, timeout=10)
        assert resp.status_code == 200 and "x-request-id" not in resp.headers
    hops(model)
    assert hops(model)["last_seq"] == before


def test_the_hop_log_pages_in_order(model: Proc) -> None:
    ids = [f"page-{i}" for i in range(5)]
    for rid in ids:
        completion(model, {"x-request-id": rid, "x-traffic-tag": "gameday"})
    start = hop_of(model, ids[0])["seq"] - 1
    seen: list[str] = []
    after = start
    for _ in range(10):
        page = hops(model, after_seq=after, limit=2)
        assert len(page["hops"]) <= 2 and page["first_seq"] <= after + 1 and not page["lost"]
        seen += [h["request_id"] for h in page["hops"]]
        if not page["hops"]:
            break
        assert [h["seq"] for h in page["hops"]] == list(
            range(after + 1, after + 1 + len(page["hops"]))
        )
        after = page["next_after_seq"]
    assert [r for r in seen if r.startswith("page-")] == ids


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("after_seq=-1", "after_seq"),
        ("after_seq=abc", "after_seq"),
        ("after_seq=99999999999999999999999", "after_seq"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=1.5", "limit"),
        ("after_seq=%EF%BC%91", "after_seq"),  # a full-width digit: isdigit() but not ASCII
    ],
)
def test_bad_paging_is_a_400_naming_the_parameter(model: Proc, query: str, param: str) -> None:
    resp = requests.get(f"{model.url}/v1/colour/hops?{query}", headers=ADMIN, timeout=10)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and param in err["message"]


def test_a_repeated_paging_parameter_is_a_400(model: Proc) -> None:
    resp = requests.get(f"{model.url}/v1/colour/hops?limit=1&limit=2", headers=ADMIN, timeout=10)
    assert resp.status_code == 400 and "once" in resp.json()["error"]["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
def test_the_hop_log_needs_the_admin_credential(model: Proc, headers: dict[str, str]) -> None:
    resp = requests.get(model.url + "/v1/colour/hops", headers=headers, timeout=10)
    assert resp.status_code == 401
    assert "Authorization" in resp.json()["error"]["message"]


def test_drop_colour_makes_requests_untagged_until_it_ends(model: Proc) -> None:
    fault = inject_fault(model.url, {"kind": "drop_colour", "ttl_s": 30})
    try:
        completion(
            model,
            {"x-request-id": "dropped-1", "x-traffic-tag": "gameday", "traceparent": TRACEPARENT},
        )
        dropped = hop_of(model, "dropped-1")
        # Only the tag is lost: the request id and the trace survive.
        assert dropped["tag"] is None and dropped["trace_id"] == TRACE
    finally:
        cleared = requests.delete(
            model.url + f"/admin/faults/{fault['id']}", headers=ADMIN, timeout=10
        )
        assert cleared.status_code == 200
    completion(model, {"x-request-id": "kept-1", "x-traffic-tag": "gameday"})
    assert hop_of(model, "kept-1")["tag"] == "gameday"


def test_drop_colour_needs_a_ttl(model: Proc) -> None:
    resp = requests.post(
        model.url + "/admin/faults", json={"kind": "drop_colour"}, headers=ADMIN, timeout=10
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "ttl_s"


def test_the_route_and_the_fault_are_in_the_openapi_document(model: Proc) -> None:
    doc = requests.get(model.url + "/openapi.json", timeout=10).json()
    assert doc["x-undocumented-routes"] == [] and doc["x-unrouted-operations"] == []
    op = doc["paths"]["/v1/colour/hops"]["get"]
    assert {p["name"] for p in op["parameters"]} == {"after_seq", "limit"}
    kinds = {
        v["properties"]["kind"]["const"]
        for v in doc["components"]["schemas"]["ModelFaultRequest"]["anyOf"]
    }
    assert "drop_colour" in kinds


def _spans(receiver: Proc, trace_id: str) -> list[dict[str, Any]]:
    resp = requests.get(receiver.url + "/v1/spans", params={"trace_id": trace_id}, timeout=10)
    assert resp.status_code == 200
    return list(resp.json()["spans"])


def test_each_request_is_a_server_span_exported_to_the_receiver(
    model: Proc, receiver: Proc
) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    completion(
        model,
        {
            "x-request-id": "span-1",
            "traceparent": f"00-{trace}-00f067aa0ba902b7-01",
            "x-traffic-tag": "gameday",
        },
    )
    spans = wait_for(lambda: _spans(receiver, trace), timeout=15, what="the span at the receiver")
    assert isinstance(spans, list)
    (span,) = spans
    assert span["service"] == "model" and span["kind"] == 2  # SERVER
    assert span["parent_span_id"] == "00f067aa0ba902b7"
    assert span["attributes"]["request.id"] == "span-1"
    assert span["attributes"]["traffic.tag"] == "gameday"
    assert span["attributes"]["http.response.status_code"] == 200
    assert span["name"] == "POST /v1/completions"


def test_a_request_without_traceparent_starts_a_trace_its_hop_names(
    model: Proc, receiver: Proc
) -> None:
    completion(model, {"x-request-id": "root-1"})
    trace = hop_of(model, "root-1")["trace_id"]
    spans = wait_for(lambda: _spans(receiver, trace), timeout=15, what="the root span")
    assert isinstance(spans, list)
    (span,) = spans
    assert span["parent_span_id"] is None and span["attributes"]["request.id"] == "root-1"


def test_a_dead_collector_never_fails_a_request(spawn: Spawner) -> None:
    # Nothing listens on this port: every export fails, in the exporter's thread.
    dead = f"http://127.0.0.1:{free_port()}"
    proc = spawn(
        "canarystack.model", "--version", "v1", *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": dead}
    )
    for i in range(20):
        completion(proc, {"x-request-id": f"dead-{i}", "x-traffic-tag": "gameday"})
    assert hops(proc)["last_seq"] == 20
    assert proc.alive()


@pytest.mark.parametrize(
    "endpoint", ["http://10.0.0.1:4318", "http://localhost:4318", "http://collector.example:4318"]
)
def test_a_non_loopback_collector_refuses_the_start(
    tmp_path: Path, spawn: Spawner, endpoint: str
) -> None:
    with pytest.raises(AssertionError, match="did not start") as info:
        spawn(
            "canarystack.model",
            "--version",
            "v1",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
            timeout=20,
        )
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in str(info.value) and "loopback" in str(info.value)


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"},
            "http://127.0.0.1:4318/v1/traces",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4318"}, "http://[::1]:4318/v1/traces"),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/t",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://10.0.0.1",
            },
            "http://127.0.0.1:9/t",
        ),
    ],
)
def test_the_traces_endpoint_comes_from_the_environment(
    env: dict[str, str], url: str | None
) -> None:
    assert otel.traces_endpoint(env) == url


@pytest.mark.parametrize(
    ("env", "text"),
    [
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://192.168.1.5:4318/v1/traces"},
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://127.0.0.1:4317"}, "http://"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:notaport"}, "not a URL"),
    ],
)
def test_a_bad_endpoint_is_refused_naming_the_variable(env: dict[str, str], text: str) -> None:
    with pytest.raises(otel.OtelConfigError, match=text):
        otel.traces_endpoint(env)


def test_the_receiver_refuses_what_is_not_otlp(receiver: Proc) -> None:
    url = receiver.url + "/v1/traces"
    garbage = requests.post(
        url, data=b"\xff\xff\xff", headers={"Content-Type": "application/x-protobuf"}, timeout=10
    )
    assert garbage.status_code == 400 and "OTLP" in garbage.json()["error"]["message"]
    as_json = requests.post(url, json={"resourceSpans": []}, timeout=10)
    assert as_json.status_code == 415 and "protobuf" in as_json.json()["error"]["message"]
    bad_trace = requests.get(receiver.url + "/v1/spans", params={"trace_id": "xyz"}, timeout=10)
    assert bad_trace.status_code == 400


def test_hops_carry_the_wall_clock_time_of_arrival(model: Proc) -> None:
    t0 = time.time()
    completion(model, {"x-request-id": "clock-1"})
    assert t0 - 1 <= hop_of(model, "clock-1")["at"] <= time.time()


def test_a_request_through_the_router_is_one_trace_across_components(
    spawn: Spawner, tmp_path: Path, receiver: Proc, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.router_support import start_router

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    model = spawn("canarystack.model", "--version", "v1", *FAST)
    router = start_router(spawn, tmp_path / "router", [model.url])
    trace, client_span = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
    headers = {
        "x-request-id": "through-1",
        "traceparent": f"00-{trace}-{client_span}-01",
        "x-traffic-tag": "gameday",
    }
    completion(router, headers)

    def both() -> list[dict[str, Any]] | None:
        spans = _spans(receiver, trace)
        return spans if {s["service"] for s in spans} >= {"router", "model"} else None

    spans = wait_for(both, timeout=15, what="router and model spans in one trace")
    assert isinstance(spans, list)
    by_service = {s["service"]: s for s in spans if s["kind"] == 2}
    assert by_service["router"]["parent_span_id"] == client_span
    # The model's parent is a span the router made (never the client's own).
    assert by_service["model"]["parent_span_id"] not in (None, client_span)
    for span in by_service.values():
        assert span["attributes"]["request.id"] == "through-1"
        assert span["attributes"]["traffic.tag"] == "gameday"


def test_drop_colour_ends_by_itself_when_its_ttl_runs_out(model: Proc) -> None:
    inject_fault(model.url, {"kind": "drop_colour", "ttl_s": 0.5})
    n = iter(range(10_000))

    def tag_kept() -> bool:
        rid = f"ttl-{next(n)}"
        completion(model, {"x-request-id": rid, "x-traffic-tag": "gameday"})
        return bool(hop_of(model, rid)["tag"] == "gameday")

    wait_for(tag_kept, timeout=15, interval=0.1, what="the drop_colour fault to expire")
    assert requests.get(model.url + "/admin/faults", headers=ADMIN, timeout=10).json() == {
        "faults": []
    }


def test_the_receiver_keeps_a_gzip_export_as_sent(receiver: Proc) -> None:
    import gzip

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    attr = rs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "hand-made"
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id = bytes.fromhex("c" * 32), bytes.fromhex("d" * 16)
    span.name, span.kind = "by hand", 3
    a = span.attributes.add()
    a.key, a.value.int_value = "n", 7
    resp = requests.post(
        receiver.url + "/v1/traces",
        data=gzip.compress(req.SerializeToString()),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    (got,) = _spans(receiver, "c" * 32)
    assert got["service"] == "hand-made" and got["name"] == "by hand" and got["kind"] == 3
    assert got["span_id"] == "d" * 16 and got["parent_span_id"] is None
    assert got["attributes"] == {"n": 7}


def test_a_request_in_flight_is_a_hop_without_a_status_until_it_is_answered(
    model: Proc,
) -> None:
    import threading

    slow = inject_fault(model.url, {"kind": "latency", "ttl_s": 30, "ttft_ms": 3000})
    answered: list[int] = []
    thread = threading.Thread(
        target=lambda: answered.append(
            completion(model, {"x-request-id": "in-flight-1"}).status_code
        )
    )
    thread.start()
    try:

        def seen() -> dict[str, Any] | None:
            found = [
                h for h in hops(model, limit=10000)["hops"] if h["request_id"] == "in-flight-1"
            ]
            return found[0] if found else None

        hop = wait_for(seen, timeout=10, what="the in-flight hop")
        assert isinstance(hop, dict) and hop["status"] is None and not answered
    finally:
        requests.delete(f"{model.url}/admin/faults/{slow['id']}", headers=ADMIN, timeout=10)
        thread.join(30)
    assert answered == [200] and hop_of(model, "in-flight-1")["status"] == 200
