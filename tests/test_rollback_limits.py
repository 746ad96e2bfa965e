"""The rollback executor's writes fit the broker's limits, and a refused step is reported
once, never retried for ever (issue #12, found by the API fuzz).

A manual rollback whose reason ``ManualRollback`` allows (up to 4000 characters) used to be
written as ``'rollback step 1 (manual): ' + reason``, which the broker refuses above 4000
characters; the runner then retried the refused step on every re-check, the POST answered
202 without step 1 after ``MANUAL_WAIT_S``, and nothing was rolled back. Real broker and
executor processes; the refusal itself is made real by writing a reason past the limit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from canarystack.rollback import executor
from canarystack.rollback.executor import (
    BROKER_MAX_CHANGE_BYTES,
    BROKER_MAX_REASON_CHARS,
    ExecutorConfig,
    Observed,
    RollbackError,
    RollbackRunner,
    fit_change,
    fit_reason,
)
from tests.broker_support import broker_with_versions, trip_evidence
from tests.procs import ADMIN_TOKEN, Spawner, wait_for
from tests.test_rollback import assert_each_step_once, rolled_back, setup, step_events

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_manual_rollback_with_the_longest_reason_allowed_completes(
    spawn: Spawner, tmp_path: Path
) -> None:
    _, api, rollback = setup(spawn, tmp_path, "--empty-routers-grace-s", "0.2")
    reason = "r" * 3990 + " the end"  # 3998 characters: ManualRollback's limit is 4000
    resp = requests.post(
        rollback.url + "/v1/rollbacks/default",
        json={"reason": reason},
        headers=ADMIN,
        timeout=15,
    )
    assert resp.status_code == 202, resp.text
    assert resp.json()["steps"][0]["name"] == "weights_zero"
    rolled_back(api)
    once = assert_each_step_once(api)
    written = once["weights_zero"]["reason"]
    assert len(written) == BROKER_MAX_REASON_CHARS
    assert written.startswith("rollback step 1 (manual): rrr")
    assert written.endswith(f"[cut: {len('rollback step 1 (manual): ') + len(reason)} characters]")
    health = requests.get(rollback.url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["degraded_reasons"] == []


def test_the_executors_limits_are_the_brokers() -> None:
    from pydantic import ValidationError

    from canarystack.broker.schemas import MAX_EVENT_FIELD_BYTES, Annotation, PatchRelease

    assert BROKER_MAX_CHANGE_BYTES == MAX_EVENT_FIELD_BYTES
    PatchRelease(expected_revision=1, reason="x" * BROKER_MAX_REASON_CHARS)
    with pytest.raises(ValidationError):
        PatchRelease(expected_revision=1, reason="x" * (BROKER_MAX_REASON_CHARS + 1))
    # What the executor writes always passes the broker's own models.
    PatchRelease(expected_revision=1, reason=fit_reason("y" * 100_000))
    assert fit_reason("short") == "short"
    routers = [f"router-{i:04d}-" + "z" * 150 for i in range(400)]
    change: dict[str, Any] = {
        "annotation": "routers_applied",
        "revision": 7,
        "routers": routers,
        "router_states": [{"router_id": r, "applied_revision": 7} for r in routers],
        "lagging": [],
    }
    with pytest.raises(ValidationError):
        Annotation(change=change)
    fitted = fit_change(change)
    Annotation(change=fitted)
    assert fitted["cut"]["router_states"] == 400
    assert fitted["revision"] == 7 and fitted["routers"] == routers[: len(fitted["routers"])]
    assert fit_change({"annotation": "x", "routers": ["a"]}) == {
        "annotation": "x",
        "routers": ["a"],
    }


def test_a_step_the_broker_refuses_is_reported_once_not_retried(
    spawn: Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the reason no longer cut (as before the fix), the broker really refuses step
    1 with a 400: the runner raises once, records the step, drops the manual request, and
    does not write it again; the service's health names it; a trip then rolls back."""
    from canarystack.common.app import Component
    from canarystack.common.faults import FaultRegistry
    from canarystack.rollback.server import FAULT_KINDS, RollbackService

    broker, api = broker_with_versions(spawn, tmp_path / "broker")
    monkeypatch.setattr(executor, "fit_reason", lambda reason, limit=0: reason)

    async def scenario() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            from canarystack.broker.client import BrokerClient

            client = BrokerClient(session, broker.url, ADMIN_TOKEN, actor="rollback")
            config = ExecutorConfig(empty_routers_grace_s=0.0)
            runner = RollbackRunner(client, "default", config)
            comp = Component(
                name="rollback",
                version="test",
                admin_token=None,
                faults=FaultRegistry("rollback", FAULT_KINDS, max_ttl_s=60),
            )
            service = RollbackService(comp, broker.url, ["default"], config)
            service.runners["default"] = runner
            runner.manual_reason = "x" * 4000
            with pytest.raises(RollbackError, match=r"step 1 \(weights_zero\).*HTTP 400"):
                await runner.run()
            refused = runner.refused_step
            assert refused is not None and refused["step"] == 1 and refused["status"] == 400
            assert runner.manual_reason is None
            events_after_refusal = len(api.events("default"))
            # Run again (the drive loop's re-check): nothing is written, nothing raised.
            sit = await runner.run()
            assert sit.observed is Observed.IDLE
            assert len(api.events("default")) == events_after_refusal
            health = service.health()
            assert health["status"] == "degraded"
            assert any(
                r.startswith("refused_step:") and "weights_zero" in r and "HTTP 400" in r
                for r in health["degraded_reasons"]
            ), health["degraded_reasons"]
            assert runner.status()["refused_step"]["name"] == "weights_zero"
            # A trip moves the release: the rollback runs, and the refusal is history.
            api.patch_ok("default", phase="tripped", trip=trip_evidence(), reason="gate")
            done = await runner.run()
            assert done.observed is Observed.DONE
            assert runner.refused_step is None
            return service.health()

    health = asyncio.run(scenario())
    assert health["degraded_reasons"] == []
    assert len(step_events(api)["weights_zero"]) == 1
    wait_for(lambda: api.release("default")["phase"] == "rolled_back", timeout=5, what="done")
