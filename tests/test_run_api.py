"""``gameday.api`` against real components: a broker whose history is longer than one
page and a gate that follows it. The client reads every page, refuses what is not the
stack's answer, and names the URL and what to do when it cannot read."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import requests

from gameday.api import HOPS_PATH, ApiError, StackApi
from gameday.observers.broker import BrokerObserver
from gameday.targets import parse_target
from tests.broker_support import broker_with_versions, drive_to, preload_history, start_broker
from tests.procs import ADMIN_TOKEN, Spawner, free_port, wait_for

PRELOADED = 10_020  # more than one page of the broker (10,000 events)


def _target(tmp_path: Path, **urls: str) -> Any:
    stack = tmp_path / "stack"
    stack.mkdir(exist_ok=True)
    (stack / "stack.json").write_text(json.dumps({"release": "default", "components": [], **urls}))
    return parse_target({"kind": "local", "state_dir": str(stack)})


@pytest.fixture
def broker_url(spawn: Spawner, tmp_path: Path) -> str:
    preload_history(tmp_path / "broker", PRELOADED)
    return start_broker(spawn, tmp_path / "broker").url


def test_the_history_is_read_past_the_first_page(broker_url: str, tmp_path: Path) -> None:
    with requests.Session() as session:
        api = StackApi(session, _target(tmp_path, broker_url=broker_url))
        events: Sequence[Mapping[str, Any]] = api.events()
        release: Mapping[str, Any] = api.release()
        assert api.routers() == []  # no router has sent a heartbeat
    # Every event once, oldest first, the newest included (one request holds 10,000).
    seqs = [e["seq"] for e in events]
    assert len(events) > PRELOADED and seqs == sorted(set(seqs))
    assert sum(1 for e in events if e["change"].get("annotation") == "filler") == PRELOADED
    assert release["name"] == "default" and release["phase"] == "progressing"
    with requests.Session() as session:
        api = StackApi(session, _target(tmp_path, broker_url=broker_url))
        assert api.version_known(release["canary"]["version"]) is True
        assert api.version_known("no-such-version") is False
    # after_seq reads only what came later.
    with requests.Session() as session:
        tail = StackApi(session, _target(tmp_path, broker_url=broker_url)).events(seqs[-5])
    assert [e["seq"] for e in tail] == seqs[-4:]


def test_a_missing_release_and_an_unreachable_broker_are_named(
    broker_url: str, tmp_path: Path
) -> None:
    stack = tmp_path / "other"
    stack.mkdir()
    (stack / "stack.json").write_text(
        json.dumps({"release": "nope", "broker_url": broker_url, "components": []})
    )
    with requests.Session() as session:
        api = StackApi(session, parse_target({"kind": "local", "state_dir": str(stack)}))
        for read in (api.release, api.events):
            with pytest.raises(ApiError, match="release 'nope' does not exist on the broker") as e:
                read()
            assert e.value.status == 404 and "check 'release' in the target file" in str(e.value)
    dead = f"http://127.0.0.1:{free_port()}"
    with requests.Session() as session:
        api = StackApi(session, _target(tmp_path, broker_url=dead))
        with pytest.raises(ApiError, match="cannot reach") as e:
            api.release()
    assert e.value.status == 0 and e.value.url == f"{dead}/v1/releases/default"
    assert "is the component up" in str(e.value) and e.value.cause == "ConnectionError"


def test_the_gate_state_and_replica_health(spawn: Spawner, broker_url: str, tmp_path: Path) -> None:
    gate = spawn("canarystack.gate", "--broker", broker_url)
    target = _target(tmp_path, broker_url=broker_url, gate_url=gate.url)
    with requests.Session() as session:
        api = StackApi(session, target)
        revision = wait_for(lambda: api.gate_state().get("revision"), what="the gate's release")
        assert revision == api.release()["revision"]  # the gate follows this broker
        assert api.gate_state()["state"] == "watching"  # no sample yet
        assert api.health_status(gate.url) == 200
        assert api.health(gate.url)
        assert "# TYPE" in api.metrics_text(gate.url)
        # A path the gate does not serve is an error naming the URL and the status.
        with pytest.raises(ApiError, match=r"answered HTTP 404") as e:
            api.get_json(f"{gate.url}/no/such/page")
        assert e.value.status == 404 and e.value.url == f"{gate.url}/no/such/page"
        # The gate's colour hop log (each request above is a hop), read page by page.
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        whole = api.colour_hop_pages(gate.url, admin)
        paged = api.colour_hop_pages(gate.url, admin, limit=2)
        with pytest.raises(ApiError, match="answered HTTP 401") as e:
            api.colour_hop_pages(gate.url, {"Authorization": "Bearer wrong"})
    assert e.value.url == f"{gate.url}{HOPS_PATH}"
    hops = [p["hops"] for p in whole[:1] + paged]
    assert all(isinstance(h, list) for h in hops)
    first, *pages = cast(list[list[dict[str, int]]], hops)
    seqs = [h["seq"] for h in first]
    assert len(seqs) >= 3 and seqs == sorted(set(seqs))
    assert len(pages) >= 2 and all(len(p) <= 2 for p in pages)
    # Reading on adds the reads' own hops: the pages hold at least the one-page read's.
    assert [h["seq"] for p in pages for h in p][: len(seqs)] == seqs


def test_canarystack_gate_is_read_through_the_same_observer_interface(
    spawn: Spawner, tmp_path: Path
) -> None:
    """canarystack's gate sits behind the observer interface foreign gates use: its
    snapshot says progressing at the broker's weight with a gate that can see nothing yet
    (no canary sample: not inconclusive at first), then tripped at weight 0 once the
    broker's phase is tripped, and the history every check reads is the broker's own."""
    proc, broker = broker_with_versions(spawn, tmp_path / "broker")
    gate = spawn("canarystack.gate", "--broker", proc.url)
    target = _target(tmp_path, broker_url=proc.url, gate_url=gate.url)
    assert target.observer() is None  # no observer in the file: canarystack's own gate
    with requests.Session() as session:
        api = StackApi(session, target)
        observer = api.gate()
        assert isinstance(observer, BrokerObserver) and observer.gate_api
        assert api.gate() is observer  # one per client: its log is what that client saw
        wait_for(lambda: api.gate_state().get("revision"), what="the gate's release")
        before = observer.snapshot(session)
        assert before.tripped is False and before.canary_weight == 5.0
        assert before.pins_to_canary is True and before.why == []
        drive_to(broker, "default", "tripped")
        after = observer.snapshot(session)
        assert after.tripped is True and after.canary_weight == 0.0
        assert after.signal == "phase tripped" and after.pins_to_canary is False
        # The checks read the broker's history through the observer, not the snapshots.
        history: Sequence[Mapping[str, Any]] = api.events()
        phases = [e["change"]["phase"]["new"] for e in history if "phase" in e["change"]]
        assert phases == ["progressing", "tripped"]  # its creation, then the trip
        assert api.gate().where() == f"{gate.url}/v1/gate/default"
    assert [s.tripped for s in observer.log.snapshots()] == [False, True]
