"""The harness's Redis faults (gameday.redis_faults, issue #16 item 4) against a real
``redis-server``: a stall Redis ends itself, pool exhaustion by a holder child that
restores ``maxclients`` at its deadline, the rollback that ends both (also after the
holder was killed), the starting-state check, and the blast radius."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gameday import redis_faults as dep
from gameday.evidence.ledger import FaultError
from gameday.faults import FaultLedger
from gameday.targets.base import BlastRadiusError, Target, parse_target
from tests.procs import free_port, wait_for
from tests.test_dependency_support import RedisServer, needs_redis, redis_server

pytestmark = needs_redis


@pytest.fixture
def rds(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


def target_for(tmp_path: Path, rds: RedisServer, components: list[str]) -> Target:
    maxclients = int(str(rds.client().config_get("maxclients")["maxclients"]))
    state = tmp_path / "stack"
    state.mkdir(exist_ok=True)
    closed = free_port()  # nothing listens: the broker annotation is best effort
    (state / "stack.json").write_text(json.dumps({
        "release": "default", "broker_url": f"http://127.0.0.1:{closed}",
        "router_url": f"http://127.0.0.1:{closed}", "components": [],
        "admin_token_file": str(state / "none"), "supervisor_socket": str(state / "none.sock"),
        "dependencies": [{"name": "redis", "role": "redis", "program": "redis", "url": rds.url,
                          "port": rds.port, "maxclients": maxclients}],
    }))  # fmt: skip
    return parse_target(
        {"kind": "local", "state_dir": str(state), "blast_radius": {"components": components}}
    )


def refused(rds: RedisServer) -> bool:
    try:
        redis.Redis(host="127.0.0.1", port=rds.port, socket_timeout=2).ping()
    except redis.ConnectionError as exc:
        return "max number of clients" in str(exc)
    return False


def alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_faults_outside_the_blast_radius_are_refused_before_redis_is_touched(
    tmp_path: Path, rds: RedisServer
) -> None:
    target = target_for(tmp_path, rds, ["router", "model-canary"])
    book = FaultLedger(tmp_path / "faults.jsonl")
    for fault in (lambda: dep.pause(target, 1000, book), lambda: dep.exhaust(target, 5, 2, book),
                  lambda: dep.kill(target, book)):  # fmt: skip
        with pytest.raises(BlastRadiusError, match=r"Add redis to blast_radius\.components"):
            fault()
    assert book.entries() == []
    assert dep.problems(target) == []


def test_a_pause_is_recorded_and_the_rollback_ends_it(tmp_path: Path, rds: RedisServer) -> None:
    target = target_for(tmp_path, rds, ["redis"])
    book = FaultLedger(tmp_path / "faults.jsonl")
    entry = dep.pause(target, 1500, book)
    assert entry.kind == "pause" and entry.ttl_s == 1.5
    # The rollback returns once Redis answers again (it waits out the pause, which
    # Redis 7.0 will not end early) and records the clearing.
    cleared = dep.clear(target, book)
    assert [c.fault_id for c in cleared] == [entry.fault_id]
    assert [e.action for e in book.entries()] == ["dependency", "dependency-clear"]
    assert rds.client().set("after", "1") is True
    assert dep.clear(target, book) == []  # idempotent


def test_bad_fault_arguments_are_refused_by_name(tmp_path: Path, rds: RedisServer) -> None:
    target = target_for(tmp_path, rds, ["redis"])
    with pytest.raises(FaultError, match="ms is 0"):
        dep.pause(target, 0)
    with pytest.raises(FaultError, match="connections is 0"):
        dep.exhaust(target, 5, 0)
    with pytest.raises(FaultError, match="ttl_s is 9999"):
        dep.exhaust(target, 9999, 2)


def test_pool_exhaustion_refuses_new_clients_until_the_rollback(
    tmp_path: Path, rds: RedisServer
) -> None:
    target = target_for(tmp_path, rds, ["redis"])
    book = FaultLedger(tmp_path / "faults.jsonl")
    before = rds.client()
    before.ping()  # an existing client: the holder disconnects it
    entry = dep.exhaust(target, 120, 3, book)
    holder = entry.detail["holder_pid"]
    assert isinstance(holder, int) and alive(holder)
    assert refused(rds)
    assert any("max number of clients" in p for p in dep.problems(target))
    with pytest.raises(redis.ConnectionError):
        before.ping()
    dep.clear(target, book)
    assert not alive(holder)
    assert dep.problems(target) == []
    assert rds.client().ping()


def test_the_holder_restores_maxclients_and_exits_at_its_deadline(
    tmp_path: Path, rds: RedisServer
) -> None:
    target = target_for(tmp_path, rds, ["redis"])
    entry = dep.exhaust(target, 1, 2, FaultLedger(tmp_path / "faults.jsonl"))
    holder = entry.detail["holder_pid"]
    assert isinstance(holder, int)
    wait_for(lambda: not alive(holder), timeout=15, what="the holder exits")
    assert dep.problems(target) == []


def test_the_rollback_restores_maxclients_after_the_holder_was_killed(
    tmp_path: Path, rds: RedisServer
) -> None:
    target = target_for(tmp_path, rds, ["redis"])
    book = FaultLedger(tmp_path / "faults.jsonl")
    entry = dep.exhaust(target, 120, 2, book)
    holder = entry.detail["holder_pid"]
    assert isinstance(holder, int)
    os.kill(holder, signal.SIGKILL)  # no chance to restore
    wait_for(lambda: not alive(holder), timeout=10, what="holder gone")
    # Redis closes the dead holder's connections on its own schedule; until it has, a new
    # client is refused ("max number of clients reached") and that is what problems says.
    wait_for(
        lambda: any("maxclients is 2" in p for p in dep.problems(target)),
        timeout=10,
        what="redis reports maxclients still lowered once the holder's sockets are closed",
    )
    dep.clear(target, book)
    assert dep.problems(target) == []
