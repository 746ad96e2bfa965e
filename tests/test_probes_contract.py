"""Every activity of ``probes/`` follows the Chaos Toolkit contract, checked the way Chaos
Toolkit checks it: chaoslib's own ``validate_python_activity`` on each one, flat
JSON-friendly arguments, ``configuration`` last (no ``secrets``: no activity reads them), and
discovery."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from chaoslib.control.python import validate_python_control
from chaoslib.exceptions import InvalidActivity
from chaoslib.provider.python import run_python_activity, validate_python_activity

import probes

ACTIVITY_MODULES = (
    "probes.faults",
    "probes.stack",
    "probes.gate",
    "probes.slo",
    "probes.hostile",
    "probes.evidence",
)

# Arguments as an experiment gives them; every activity is validated with these.
EXAMPLE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "inject_latency": {"component": "router", "ms": 200, "ttl_s": 90},
    "make_canary_faulty": {
        "mode": "fp8-kv-scale",
        "min_prompt_tokens": 2048,
        "magnitude": 1.0,
        "ttl_s": 60,
    },
    "kill_pod": {"component": "router", "replica": "router-0"},
    "inject_errors": {"component": "model-canary", "rate": 1.0, "ttl_s": 60},
    "record_external_fault": {"component": "model-canary", "kind": "kernel", "source": "chaosk8s"},
    "clear_faults": {"component": "router"},
    "stack_healthy": {"wait_s": 10},
    "release_phase": {"expected": "progressing"},
    "canary_weight": {"expected": 5},
    "wait_for_release_phase": {"phase": "rolled_back", "deadline_s": 30},
    "no_active_faults": {},
    "starting_state": {"canary_weight": 5},
    "wait_for_trip": {"deadline_s": 20},
    "wait_for_noise_floor": {"deadline_s": 30, "poll_s": 0.5, "min_samples": 20},
    "gate_did_not_trip": {"observe_s": 15},
    "baseline_ttft_p99_below": {"max_s": 2.0},
    "error_rate_below": {"max_ratio": 0.0},
    "no_canary_served_after": {"max_s": 5},
    "drifted_responses_at_most": {"max_count": 3},
    "errors_only_in_flight_at_kill": {"grace_s": 1.0},
    "trip_within": {"max_s": 5},
    "weights_applied_within": {"max_s": 5},
    "rollback_complete_within": {"max_s": 30},
    "no_trip": {},
    "slo_met": {},
    "gate_sees_every_router": {},
    "break_gate_credential": {"ttl_s": 60},
    "flood_pinned_canary": {"duration_s": 10, "rate_per_s": 20},
    "stall_readers": {"streams": 72, "max_tokens": 4000, "hold_s": 40},
    "stalled_streams_cut": {},
    "hang_canary": {"after_events": 1, "interval_s": 15, "ttl_s": 120},
    "pause_pod": {"component": "gate", "seconds": 30},
    "resume_paused_pods": {},
    "routers_fail_safe_without_gate": {"deadline_s": 15},
    "hostile_input_not_5xx": {},
    "pin_canary_after_trip": {"count": 20},
    "pins_reach_no_canary": {},
    "gate_evidence": {"min_comparisons": 30, "min_canary_outcomes": 10},
}
JSON_FRIENDLY = {str, int, float, bool, type(None), list, dict}


def _activities() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for module in ACTIVITY_MODULES:
        mod = importlib.import_module(module)
        out.extend((module, name) for name in mod.__all__)
    return out


def _types_of(hint: Any) -> set[Any]:
    if isinstance(hint, types.UnionType) or getattr(hint, "__origin__", None) is not None:
        args = getattr(hint, "__args__", ())
        origin = getattr(hint, "__origin__", None)
        if origin in (list, dict):
            return {origin}
        return set().union(*(_types_of(a) for a in args))
    return {hint}


def test_every_exported_activity_has_an_example() -> None:
    assert {name for _, name in _activities()} == set(EXAMPLE_ARGUMENTS)


@pytest.mark.parametrize(("module", "func"), _activities())
def test_chaoslib_validates_the_activity(module: str, func: str) -> None:
    kind = "action" if module == "probes.faults" else "probe"
    activity = {
        "type": kind,
        "name": func.replace("_", "-"),
        "provider": {
            "type": "python",
            "module": module,
            "func": func,
            "arguments": EXAMPLE_ARGUMENTS[func],
        },
    }
    validate_python_activity(activity)  # raises InvalidActivity when it does not fit


@pytest.mark.parametrize(("module", "func"), _activities())
def test_signature_is_flat_with_configuration_last(module: str, func: str) -> None:
    assert_flat_signature(module, func)


def assert_flat_signature(module: str, func: str) -> None:
    """A Chaos Toolkit activity: JSON-friendly plain arguments, then ``configuration``
    (default None), and a docstring. No ``secrets``: credentials come from the target file,
    and chaoslib hands ``secrets`` only to a function that declares it (as chaostoolkit-
    kubernetes' activities declare only what they read)."""
    fn = getattr(importlib.import_module(module), func)
    params = list(inspect.signature(fn).parameters.values())
    assert params[-1].name == "configuration" and params[-1].default is None
    assert "secrets" not in {p.name for p in params}
    hints = get_type_hints(fn)
    for p in params[:-1]:
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, p
        assert _types_of(hints[p.name]) <= JSON_FRIENDLY, (func, p.name, hints[p.name])
    assert inspect.getdoc(fn), f"{func} needs a docstring (chaos discover shows it)"


def test_an_experiment_that_declares_secrets_still_runs_an_activity() -> None:
    """An experiment may name secrets on any provider (a shared template does): chaoslib
    then hands them only to a function that declares ``secrets``, so the activity runs with
    its arguments and its configuration, and the secret goes nowhere."""
    activity = {
        "type": "probe",
        "name": "slo-met",
        "provider": {
            "type": "python",
            "module": "probes.slo",
            "func": "slo_met",
            "secrets": ["vault"],
            "arguments": {"value": {"ok": True}},
        },
    }
    validate_python_activity(activity)
    secrets = {"vault": {"token": "not-for-activities"}}
    assert run_python_activity(activity, {"gameday_target": "t.yaml"}, secrets) is True


def test_a_wrong_argument_is_refused_with_its_name() -> None:
    activity = {
        "type": "action",
        "name": "slow",
        "provider": {
            "type": "python",
            "module": "probes.faults",
            "func": "inject_latency",
            "arguments": {"component": "router", "ms": 5, "millis": 5},
        },
    }
    with pytest.raises(InvalidActivity, match="millis"):
        validate_python_activity(activity)
    del activity["provider"]["arguments"]["ms"]  # type: ignore[index]
    with pytest.raises(InvalidActivity, match="'ms' is missing"):
        validate_python_activity(activity)


def test_the_load_control_validates() -> None:
    validate_python_control(
        {"name": "user-load", "provider": {"type": "python", "module": "probes.load"}}
    )


def test_discover_lists_every_activity_and_the_control() -> None:
    found = probes.discover(discover_system=False)
    listed = {(a["mod"], a["name"], a["type"]) for a in found["activities"]}
    for module, name in _activities():
        kind = "action" if name in probes.ACTIONS else "probe"
        assert (module, name, kind) in listed
    assert ("probes.load", "before_method_control", "control") in listed
    assert "discover" in probes.__all__


def test_python_m_probes_prints_the_discovery() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "probes"], capture_output=True, text=True, timeout=60, check=True
    )
    assert '"make_canary_faulty"' in out.stdout


def test_chaos_discover_lists_the_extension(tmp_path) -> None:
    """`chaos discover` resolves the distribution to the `probes` package (its own dist)."""
    chaos = Path(sys.executable).with_name("chaos")
    out = tmp_path / "discovery.json"
    subprocess.run(
        [str(chaos), "--log-file", str(tmp_path / "chaos.log"), "discover", "--no-install",
         "--no-system-info", "chaostoolkit-canary-gameday", "--discovery-path", str(out)],
        capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path,
    )  # fmt: skip
    found = json.loads(out.read_text())
    names = {(a["mod"], a["name"], a["type"]) for a in found["activities"]}
    assert ("probes.faults", "make_canary_faulty", "action") in names
    assert ("probes.gate", "wait_for_trip", "probe") in names
    assert ("probes.progressive", "argo_rollout_aborted", "probe") in names
    assert ("probes.load", "before_method_control", "control") in names


def test_discover_lists_the_dependency_and_colouring_activities() -> None:
    found = probes.discover(discover_system=False)
    listed = {(a["mod"], a["name"]): a["type"] for a in found["activities"]}
    for name in ("pause_redis", "exhaust_redis", "kill_redis", "clear_redis_faults"):
        assert listed[("probes.dependency", name)] == "action"
    assert listed[("probes.dependency", "recovered_within")] == "probe"
    assert listed[("probes.colouring", "drop_colour")] == "action"
    assert listed[("probes.colouring", "send_coloured_requests")] == "action"
    assert listed[("probes.colouring", "colouring_fidelity_at_least")] == "probe"
