"""The colours in a trip's evidence (issue #16, item 4): the broker validates and stores
``trip.colours`` (at most 8 ``{request_id, trace_id, tag}``) and records a
``trip_evidence`` hop for each.

The broker runs in this process (its aiohttp app on a thread of its own, real HTTP on
127.0.0.1) so the test can read its hop log; the gate's side is tests/test_gate_colours.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from canary_contract.broker import MAX_TRIP_COLOURS
from canarystack.broker.server import build_app
from canarystack.common.app import COMPONENT
from canarystack.common.colour import HopLog
from tests.broker_support import Api, trip_evidence
from tests.procs import ADMIN_TOKEN


class InThreadBroker:
    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.app = build_app(state_dir, ADMIN_TOKEN)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(self.app)
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

        try:
            self.loop.run_until_complete(start())
        finally:
            self.ready.set()
        self.loop.run_forever()

    def start(self) -> str:
        self.thread.start()
        assert self.ready.wait(30) and self.port, "the broker did not start"
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    @property
    def hops(self) -> HopLog:
        return self.app[COMPONENT].hops


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[InThreadBroker, Api]]:
    b = InThreadBroker(tmp_path / "state")
    api = Api(b.start())
    try:
        for v in ("v1", "v2"):
            api.register(v)
        yield b, api
    finally:
        b.stop()


def evidence_hops(b: InThreadBroker) -> list[tuple[str, str, str, str | None]]:
    """The broker's ``trip_evidence`` hops (every request it serves is a hop of its own)."""
    hops, _ = b.hops.since(0)
    return [(h.hop, h.request_id, h.trace_id, h.tag) for _, h in hops if h.hop == "trip_evidence"]


def colour(i: int, tag: str | None = "gameday") -> dict[str, Any]:
    return {"request_id": f"req-{i}", "trace_id": f"{i:032x}", "tag": tag}


def test_trip_colours_are_stored_and_each_is_a_trip_evidence_hop(
    broker: tuple[InThreadBroker, Api],
) -> None:
    b, api = broker
    name = api.create()["name"]
    colours = [colour(1), colour(2, tag=None)]
    release = api.patch_ok(name, phase="tripped", trip=trip_evidence(colours=colours))
    assert release["trip"]["colours"] == colours
    assert api.release(name)["trip"]["colours"] == colours
    assert evidence_hops(b) == [
        ("trip_evidence", "req-1", f"{1:032x}", "gameday"),
        ("trip_evidence", "req-2", f"{2:032x}", None),
    ]


def test_a_trip_without_colours_is_stored_as_sent(broker: tuple[InThreadBroker, Api]) -> None:
    b, api = broker
    name = api.create()["name"]
    release = api.patch_ok(name, phase="tripped", trip=trip_evidence())
    assert "colours" not in release["trip"]
    assert evidence_hops(b) == []


@pytest.mark.parametrize(
    ("colours", "param"),
    [
        ([colour(i) for i in range(MAX_TRIP_COLOURS + 1)], "trip.colours"),
        ([{**colour(1), "trace_id": "XYZ"}], "trip.colours[0].trace_id"),
        ([colour(1), {**colour(2), "request_id": "has space"}], "trip.colours[1].request_id"),
        ([{**colour(1), "tag": "t" * 129}], "trip.colours[0].tag"),
        ([{"trace_id": f"{1:032x}"}], "trip.colours[0].request_id"),
        ([{**colour(1), "span_id": "00f067aa0ba902b7"}], "trip.colours[0].span_id"),
        ("req-1", "trip.colours"),
    ],
)
def test_bad_trip_colours_are_a_400_naming_the_field(
    broker: tuple[InThreadBroker, Api], colours: Any, param: str
) -> None:
    b, api = broker
    name = api.create()["name"]
    r = api.patch(name, 1, phase="tripped", trip=trip_evidence(colours=colours))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert api.release(name)["phase"] == "progressing"  # nothing was written
    assert evidence_hops(b) == []
