"""Event history is paged everywhere the harness reads it (#12 item 9).

A broker answers at most 10,000 events a page, the *oldest* first. A real broker with a
long history (seeded into its own SQLite file while it is stopped, as a long-lived staging
broker would have it) must still show the harness its newest events: the trip at the end.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gameday.api import StackApi
from gameday.evidence.events import phase_events
from gameday.run.collect import collect_timeline
from gameday.targets.base import parse_target
from gameday.targets.broker_writes import over_api
from gameday.targets.history import HistoryError, read_event_records, read_events
from tests.broker_support import Api, start_broker
from tests.procs import Spawner

SEEDED = 10_050  # more than one full page of the broker (10,000)


def seed(db_path: Path, release: str, n: int, revision: int) -> None:
    now = time.time()
    rows = [
        (release, now, revision, "seed", json.dumps({"annotation": "noise", "i": i}), "seeded")
        for i in range(n)
    ]
    trip = json.dumps({"phase": {"old": "canary", "new": "tripped"}})
    rows.append((release, now + 1, revision, "gate", trip, "the newest event: a trip"))
    with sqlite3.connect(db_path) as db:
        db.executemany(
            "INSERT INTO events (release, time, revision, actor, change, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )


@pytest.fixture
def long_history(spawn: Spawner, tmp_path: Path) -> tuple[str, str, Path]:
    state = tmp_path / "broker"
    broker = start_broker(spawn, state)
    api = Api(broker.url)
    api.register("v1")
    api.register("v2")
    rel = api.create("long")
    broker.stop()
    seed(state / "broker.sqlite", "long", SEEDED, int(rel["revision"]))
    broker = start_broker(spawn, state)
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "stack.json").write_text(
        json.dumps({"release": "long", "broker_url": broker.url, "components": []})
    )
    return broker.url, "long", stack


def assert_whole(events: Sequence[Mapping[str, Any]]) -> None:
    seqs = [e["seq"] for e in events]
    assert len(events) > SEEDED and seqs == sorted(set(seqs))
    assert events[-1]["reason"] == "the newest event: a trip"


def test_every_harness_reader_sees_past_the_first_page(
    long_history: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, release, stack = long_history
    events = read_events(url, release)
    assert_whole(events)
    # small pages give the same history, page by page
    after = events[-40]["seq"]
    assert isinstance(after, int)
    tail = read_events(url, release, after_seq=after, limit=7)
    assert tail == events[-39:]
    # the same history as the contract's records, the trip last
    records = read_event_records(url, release, after_seq=after, limit=7)
    assert [r.to_wire() for r in records] == tail
    assert records[-1].change == {"phase": {"old": "canary", "new": "tripped"}}

    target = parse_target({"kind": "local", "state_dir": str(stack)})
    # what the probes read (gate and SLO probes look for trips here): before, only the
    # oldest 10,000
    probed = over_api(target, StackApi.events)
    assert_whole(probed)
    assert len(phase_events(probed, "tripped")) == 1
    # the run's timeline.json
    folder = tmp_path / "exp"
    folder.mkdir()
    collected, problem = collect_timeline(target, folder)
    assert problem == "" and collected is not None
    assert_whole(collected)
    assert_whole(json.loads((folder / "timeline.json").read_text())["events"])


def test_a_missing_release_or_a_bad_limit_is_a_clear_error(spawn: Spawner, tmp_path: Path) -> None:
    url = start_broker(spawn, tmp_path / "broker").url
    with pytest.raises(HistoryError, match="HTTP 404") as info:
        read_events(url, "no-such-release")
    assert info.value.status == 404
    with pytest.raises(ValueError, match="limit is 0: give 1 to 10000"):
        read_events(url, "long", limit=0)


def test_an_event_that_is_not_one_fails_the_typed_read_naming_it(
    spawn: Spawner, tmp_path: Path
) -> None:
    state = tmp_path / "broker"
    broker = start_broker(spawn, state)
    api = Api(broker.url)
    api.register("v1")
    api.register("v2")
    api.create("odd")
    broker.stop()
    with sqlite3.connect(state / "broker.sqlite") as db:  # a store another version wrote
        db.execute(
            "INSERT INTO events (release, time, revision, actor, change, reason) "
            "VALUES ('odd', 1.0, 1, 'x', '[1, 2]', 'a change that is a list')"
        )
    url = start_broker(spawn, state).url
    assert len(read_events(url, "odd")) == 2  # the raw read takes it as it comes
    with pytest.raises(HistoryError, match=r"event 1 \(seq 2\) of 'odd'.*field 'change'"):
        read_event_records(url, "odd")
