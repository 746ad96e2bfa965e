"""``gameday.redis_watch``: the services watched while Redis is harmed, against a
tiny HTTP server standing in for a router, the broker and two model servers.

- a tick per interval, each given to the caller as it is taken; a service that does not
  answer (or not 200) is an unhealthy tick, never an error, and so is a Redis that does
  not answer PING;
- the model servers' dependency results are summed per variant; a replica that cannot be
  reached leaves what was read before it;
- a session handed in carries every read, each with the 1 s timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from gameday import redis_faults as dep
from gameday import redis_watch as watching
from gameday.evidence.redis_outage import WatchTick
from gameday.redis_faults import Endpoint

METRICS = (
    "# TYPE canarystack_dependency_requests_total counter\n"
    'canarystack_dependency_requests_total{result="ok"} 7\n'
    'canarystack_dependency_requests_total{result="timeout"} 2\n'
)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = {"/ok/health": (200, "{}"), "/sick/health": (503, "{}"),
                        "/m/metrics": (200, METRICS)}.get(self.path, (404, ""))  # fmt: skip
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@dataclass
class Rep:
    name: str
    url: str


@dataclass
class FakeTarget:
    reps: dict[str, list[Rep]]
    broker: str

    def replicas(self, role: str) -> list[Rep]:
        return self.reps.get(role, [])

    def service_url(self, role: str) -> str:
        return self.broker


def test_every_tick_is_handed_over_and_unhealthy_ones_counted(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = Endpoint("127.0.0.1", 1, "redis-server", "redis://127.0.0.1:1", 10)
    monkeypatch.setattr(dep, "endpoint", lambda target: closed)
    routers = [Rep("router-0", f"{server}/ok"), Rep("router-1", f"{server}/sick")]
    target = FakeTarget({"router": routers}, f"{server}/ok")
    seen: list[WatchTick] = []
    got = watching.watch(target, 0.3, 0.1, seen.append)  # type: ignore[arg-type]
    assert got["ticks"] == len(seen) >= 2
    assert got["unhealthy_ticks"] == {"router-0": 0, "router-1": len(seen), "broker": 0}
    assert all(t["redis"] is False and t["health"]["router-0"] for t in seen)


def test_model_results_per_variant_and_what_was_read_before_a_failure(server: str) -> None:
    both = FakeTarget({"model-baseline": [Rep("b", f"{server}/m")],
                       "model-canary": [Rep("c", f"{server}/m"), Rep("c1", f"{server}/m")]},
                      server)  # fmt: skip
    got = watching.model_results(both)  # type: ignore[arg-type]
    assert got == {"baseline": {"ok": 7.0, "timeout": 2.0}, "canary": {"ok": 14.0, "timeout": 4.0}}
    gone = FakeTarget({"model-baseline": [Rep("b", f"{server}/m")],
                       "model-canary": [Rep("c", "http://127.0.0.1:1")]}, server)  # fmt: skip
    assert watching.model_results(gone) == {"baseline": {"ok": 7.0, "timeout": 2.0}}  # type: ignore[arg-type]


def test_a_session_handed_in_carries_the_reads(server: str) -> None:
    class Counting(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            self.urls: list[str] = []

        def request(self, method: str | bytes, url: str | bytes, **kwargs: Any) -> Any:  # type: ignore[override]
            self.urls.append(str(url))
            assert kwargs["timeout"] == 1.0
            return super().request(method, url, **kwargs)

    with Counting() as session:
        assert watching.healthy(f"{server}/ok", session=session)
        assert not watching.healthy(f"{server}/sick", session=session)
        one = FakeTarget({"model-canary": [Rep("c", f"{server}/m")]}, server)
        got = watching.model_results(one, session=session)  # type: ignore[arg-type]
    assert got == {"baseline": {}, "canary": {"ok": 7.0, "timeout": 2.0}}
    assert session.urls == [f"{server}/ok/health", f"{server}/sick/health", f"{server}/m/metrics"]
