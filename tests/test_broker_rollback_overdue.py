"""The rollback executor's dead-man switch (#27): a release the gate tripped sits in
``tripped`` for good when no executor moves it, and until this switch nothing said so. The
broker (it sees every phase change) reports a release tripped or rolling back with no
phase change for ``--rollback-overdue-s``: ``/health`` degraded (HTTP 200: the broker
still serves) naming it and what to do, the release's ``rollback_overdue``, and the
gauge ``canarystack_broker_rollbacks_overdue``. The canary stays off all the while."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from canary_contract.broker import Release
from canary_contract.phases import is_canary_off
from canarystack.broker.__main__ import main as broker_main
from tests.broker_support import Api, broker_with_versions, drive_to
from tests.procs import Spawner, wait_for

OVERDUE_S = "1"  # the test's --rollback-overdue-s (the default is 60 s)


def _overdue_gauge(api: Api) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("canarystack_broker_rollbacks_overdue "):
            return float(line.split()[1])
    raise AssertionError("no canarystack_broker_rollbacks_overdue gauge in /metrics")


def _overdue_in(api: Api, phase: str) -> dict[str, Any] | None:
    """The release's ``rollback_overdue`` once it is reported for ``phase``, else None."""
    late = api.release("default").get("rollback_overdue")
    return late if late is not None and late["phase"] == phase else None


def test_a_tripped_release_no_executor_moves_is_reported_until_it_moves(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api = broker_with_versions(spawn, tmp_path / "state", "--rollback-overdue-s", OVERDUE_S)
    api.create("calm", weight=5)  # progressing: never reported
    assert api.get("/health").json()["rollbacks_overdue"] == {}
    tripped = drive_to(api, "default", "tripped")
    assert "rollback_overdue" not in tripped  # just tripped: not late yet

    late = wait_for(lambda: _overdue_in(api, "tripped"), what="the overdue report")
    assert isinstance(late, dict)
    assert late["limit_s"] == 1 and late["for_s"] > 1
    assert late["revision"] == tripped["revision"]
    health = api.get("/health")
    # Degraded but serving: a 503 would let a probe take away the broker an executor needs.
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "degraded" and body["serving"] is True
    assert list(body["rollbacks_overdue"]) == ["default"]
    (reason,) = body["degraded_reasons"]
    assert "release 'default' has been tripped for" in reason
    assert "rolling_back" in reason and "--rollback-overdue-s" in reason
    assert "Check the rollback executor" in reason and "/v1/rollbacks/default" in reason
    assert _overdue_gauge(api) == 1
    listed = {
        r["name"]: r.get("rollback_overdue") for r in api.get("/v1/releases").json()["releases"]
    }
    assert listed["calm"] is None and listed["default"]["phase"] == "tripped"
    # The contract's typed Release reads it.
    record = Release.from_wire(api.release("default"))
    assert record.rollback_overdue is not None and record.rollback_overdue.phase == "tripped"
    # The canary is off the whole time: by phase, whatever the weight says.
    assert is_canary_off(api.release("default")["phase"])

    # The executor's first step: the phase moved, so the clock starts again.
    rolling = api.patch_ok("default", phase="rolling_back", weights={"canary": 0})
    assert "rollback_overdue" not in rolling
    assert is_canary_off(rolling["phase"])
    late = wait_for(lambda: _overdue_in(api, "rolling_back"), what="rolling_back overdue")
    assert isinstance(late, dict)
    assert "has been rolling_back for" in late["reason"] and "rolled_back" in late["reason"]
    assert "rolling_back for" in api.get("/health").json()["degraded_reasons"][0]

    # Rolled back: done, nothing is overdue any more.
    done = api.patch_ok("default", phase="rolled_back")
    assert "rollback_overdue" not in done and is_canary_off(done["phase"])
    wait_for(lambda: api.get("/health").json()["status"] == "ok", what="health ok again")
    body = api.get("/health").json()
    assert body["rollbacks_overdue"] == {} and "degraded_reasons" not in body
    assert "rollback_overdue" not in api.release("default")
    assert _overdue_gauge(api) == 0


def test_a_restarted_broker_reports_a_rollback_that_was_already_late(
    spawn: Spawner, tmp_path: Path
) -> None:
    """The phase's age survives a restart (from the release's ``updated_at``): a restart
    does not hide a rollback that is overdue."""
    state = tmp_path / "state"
    first, api = broker_with_versions(spawn, state, "--rollback-overdue-s", OVERDUE_S)
    drive_to(api, "default", "tripped")
    wait_for(lambda: _overdue_in(api, "tripped"), what="the overdue report")
    first.stop()
    again = spawn(
        "canarystack.broker", "--state-dir", str(state), "--rollback-overdue-s", OVERDUE_S
    )
    api = Api(again.url)
    late = _overdue_in(api, "tripped")  # at once: it was late before the restart
    assert late is not None and late["for_s"] > 1
    assert api.get("/health").json()["status"] == "degraded"


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_rollback_overdue_flag_must_be_finite_seconds(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        broker_main(["--state-dir", str(tmp_path / "s"), "--rollback-overdue-s", value])
    assert "--rollback-overdue-s must be a finite number of seconds > 0" in capsys.readouterr().err
