"""``gameday.targets.rollout.fresh_canary``'s choices with the broker a stub (no cluster):
a release that is already fresh is left alone, one with another weight only re-weighted.
The rollout of a new version runs against a real broker and a faked API in
tests/test_k8s_fresh_canary.py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from canary_contract.json import JsonObject
from gameday.targets.rollout import Broker, CanaryChange, fresh_canary


def _broker(release: JsonObject, writes: list[Any]) -> Broker:
    def patch(change: Mapping[str, object], reason: str) -> JsonObject:
        writes.append((change, reason))
        return {**release, **change}

    def never(*args: Any) -> Any:
        raise AssertionError(f"no new version expected: {args}")

    return Broker(lambda: release, patch, never, never)


def _change() -> CanaryChange:
    no_target: Any = None  # these choices never reach the cluster
    return CanaryChange(no_target, None, "model-canary", 5.0, time.monotonic())


RELEASE = {"phase": "progressing", "canary": {"version": "v2"}, "weights": {"canary": 5}}


def test_a_fresh_release_with_the_weight_is_left_alone() -> None:
    writes: list[Any] = []
    out = fresh_canary(_change(), 5, _broker(RELEASE, writes))
    assert (out, writes) == ({"changed": False, "phase": "progressing", "canary_version": "v2"}, [])


def test_a_fresh_release_with_another_weight_is_only_reweighted() -> None:
    writes: list[Any] = []
    out = fresh_canary(_change(), 20, _broker(RELEASE, writes))
    assert out == {"changed": True, "phase": "progressing", "canary_version": "v2", "weight": 20}
    assert writes == [({"weights": {"canary": 20}}, "gameday: canary weight for the run")]
