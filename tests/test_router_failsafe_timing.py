"""The router's broker fail-safe as documented (#27, finding 6): counted from the broker's
last answer, so a broker that stops answering in the middle of a long poll (SIGSTOP) puts
the router at 0 % canary while it is still stopped, never earlier than the bound; and the
first answer after it resumes ends the fail-safe for good (no flapping)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import requests

from tests import router_support as rs
from tests.procs import Proc, Spawner, wait_for

models = rs.models_fixture(b0="v1", c0="v2")

FAILSAFE_S = 3.0


def failsafe_events(router: Proc) -> list[dict[str, object]]:
    return [e for e in router.log_events() if e.get("event") == "config_failsafe"]


def test_a_stopped_broker_puts_the_router_at_zero_within_the_bound_and_back_once(
    spawn: Spawner, tmp_path: Path, models: dict[str, Proc]
) -> None:
    # A long poll far longer than the bound: the router must not wait for it to be overdue.
    router, api, release = rs.router_on_release(
        spawn, tmp_path, *rs.pools(models), "--watch-error-failsafe-s", str(FAILSAFE_S),
        "--watch-timeout-s", "30", weight=5,
    )  # fmt: skip
    assert rs.health(router)["config"]["effective_canary_weight"] == 5
    broker_pid = int(requests.get(api.url + "/health", timeout=5).json()["pid"])

    os.kill(broker_pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: rs.health(router)["config"]["source"] == "failsafe",
            timeout=20,
            what="the router to go fail-safe while the broker is stopped",
        )
        config = rs.health(router)["config"]
        assert config["effective_canary_weight"] == 0
        assert config["revision"] == release["revision"]  # kept: nothing newer is known
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    (event,) = failsafe_events(router)
    # Never before the bound: the router was silent for at least that long.
    assert float(event["failing_s"]) >= FAILSAFE_S  # type: ignore[arg-type]

    wait_for(
        lambda: rs.health(router)["config"]["source"] == "broker",
        timeout=20,
        what="the router to leave the fail-safe once the broker answers",
    )
    assert rs.health(router)["config"]["effective_canary_weight"] == 5
    # Several watch rounds later (each change is a broker answer), still no second fail-safe.
    for weight in (6, 7, 8):
        changed = api.patch(weights={"canary": weight})
        rs.wait_revision(router, changed["revision"])
    assert len(failsafe_events(router)) == 1
