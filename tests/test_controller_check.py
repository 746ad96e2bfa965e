"""A progressive-delivery controller's check as the harness core runs it
(``gameday.targets.controllers.stopped_check``): the status is waited on, refused alone
when it never says the canary was stopped, and otherwise paired with the traffic served
after it. The status and the traffic are plain functions here (no cluster); the probes
over a faked API are in tests/test_k8s_probes.py."""

from __future__ import annotations

from typing import Any

import pytest

from canary_contract.json import JsonObject
from gameday.evidence.controllers import ArgoView
from gameday.targets import controllers

STOPPED = ArgoView(phase="Degraded", abort=True, aborted_condition=True, aborted_at=100.0,
                   message=None, canary_weight=0)  # fmt: skip
RUNNING = ArgoView(phase="Progressing", abort=False, aborted_condition=False, aborted_at=None,
                   message=None, canary_weight=None)  # fmt: skip


def _check(views: list[ArgoView], wait: float, traffic: JsonObject) -> tuple[Any, list[float]]:
    asked: list[float] = []

    def traffic_after(since: float) -> JsonObject:
        asked.append(since)
        return traffic

    reads = iter(views)
    out = controllers.stopped_check(
        controllers.ARGO, "llm", lambda: next(reads), 5.0, 0.0, wait, traffic_after
    )
    return out, asked


def test_a_status_that_never_says_stopped_is_refused_without_reading_traffic() -> None:
    out, asked = _check([RUNNING.copy()], 0.0, {})
    assert (out["ok"], out["measured"], asked) == (False, None, [])
    assert "should be aborted" in out["detail"]["why"]


def test_the_status_is_read_again_until_it_says_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controllers, "POLL_S", 0.0)
    views = [RUNNING.copy(), STOPPED.copy()]
    out, asked = _check(views, 30.0, {"canary": 0, "total": 40})
    assert asked == [105.0]  # the abort + grace_s
    assert (out["check"], out["ok"], out["measured"]) == ("argo_rollout_aborted", True, 0.0)


def test_canary_traffic_after_the_abort_is_a_controller_that_failed_open() -> None:
    out, _ = _check([STOPPED.copy()], 0.0, {"canary": 3, "total": 40})
    assert (out["ok"], out["measured"]) == (False, 3.0)
    assert "failed open" in out["detail"]["why"]


def test_the_controllers_table_names_each_check_and_its_status() -> None:
    argo, flagger = controllers.ARGO, controllers.FLAGGER
    assert (argo.crd, argo.check, argo.since_key) == (
        ("argoproj.io", "v1alpha1", "rollouts"), "argo_rollout_aborted", "aborted_at")  # fmt: skip
    assert (flagger.crd, flagger.check, flagger.since_key) == (
        ("flagger.app", "v1beta1", "canaries"), "flagger_canary_failed", "changed_at")  # fmt: skip
