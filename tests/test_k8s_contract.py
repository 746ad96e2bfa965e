"""The cluster activities follow the Chaos Toolkit contract, checked as Chaos Toolkit checks
it: chaoslib's ``validate_python_activity`` / ``validate_python_control`` on each one,
flat JSON-friendly arguments, ``configuration`` last, a docstring."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from chaoslib.control.python import validate_python_control
from chaoslib.exceptions import InvalidActivity
from chaoslib.provider.python import validate_python_activity

from tests.test_probes_contract import assert_flat_signature

ACTIVITIES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("probes.kubernetes", "wait_for_ready"): ("probe", {"component": "router", "timeout_s": 60}),
    ("probes.kubernetes", "start_fresh_canary"): ("action", {"weight": 5, "deadline_s": 300}),
    ("probes.kubernetes", "roll_out_bad_canary"): (
        "action", {"kernel_fault": "fp8-kv-scale:2048", "deadline_s": 120},
    ),
    ("probes.kubernetes", "roll_out_bad_build"): (
        "action", {"args": ["--kv-cache-dtype", "fp8"], "min_prompt_tokens": 0, "deadline_s": 300},
    ),
    ("probes.kubernetes", "undo_canary_rollout"): ("action", {"deadline_s": 120}),
    ("probes.progressive", "argo_rollout_status"): ("probe", {"rollout": "llm"}),
    ("probes.progressive", "argo_rollout_aborted"): (
        "probe", {"rollout": "llm", "grace_s": 5, "timeout_s": 60,
                  "canary_promql": "sum(x[{window}])", "prometheus_url": "http://p:9090"},
    ),
    ("probes.progressive", "flagger_canary_status"): ("probe", {"canary": "llm"}),
    ("probes.progressive", "flagger_canary_failed"): (
        "probe", {"canary": "llm", "max_canary_requests": 0, "canary_version": "v2"},
    ),
    ("probes.prometheus", "query_value"): ("probe", {"promql": "up", "window_s": 30}),
    ("probes.prometheus", "metric_at_most"): ("probe", {"promql": "up", "max_value": 0}),
    ("probes.prometheus", "metric_at_least"): (
        "probe", {"promql": "up", "min_value": 1, "check": "up", "unit": "count"},
    ),
    ("probes.prometheus", "canary_drained"): ("probe", {"window_s": 30}),
}  # fmt: skip
CONTROLS = ("probes.kubernetes", "probes.fresh_canary")


def test_every_exported_activity_is_listed() -> None:
    exported = set()
    for module in ("probes.progressive", "probes.prometheus", "probes.kubernetes"):
        for name in importlib.import_module(module).__all__:
            if not name.endswith("_control"):
                exported.add((module, name))
    assert exported == set(ACTIVITIES)


@pytest.mark.parametrize(("module", "func"), sorted(ACTIVITIES))
def test_chaoslib_validates_the_activity_and_its_signature(module: str, func: str) -> None:
    kind, arguments = ACTIVITIES[(module, func)]
    activity = {"type": kind, "name": func.replace("_", "-"),
                "provider": {"type": "python", "module": module, "func": func,
                             "arguments": arguments}}  # fmt: skip
    validate_python_activity(activity)
    activity["provider"]["arguments"] = {**arguments, "no_such_argument": 1}  # type: ignore[index]
    with pytest.raises(InvalidActivity, match="no_such_argument"):
        validate_python_activity(activity)
    assert_flat_signature(module, func)


@pytest.mark.parametrize("module", CONTROLS)
def test_the_controls_validate(module: str) -> None:
    validate_python_control({"name": module, "provider": {"type": "python", "module": module}})
    mod = importlib.import_module(module)
    assert callable(mod.before_experiment_control)
