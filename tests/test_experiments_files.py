"""The experiment files: each passes ``chaos validate`` (the real CLI), says what it
expects (the ``gameday`` extension), rolls back whatever happens, clears its faults,
gives every fault a TTL, checks its starting state first, runs the load, keeps every
SLO and duration in configuration with an environment override, and fits the time
budget. Also the target file and the Makefile targets that run them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gameday.targets.base import parse_target
from tests.run_support import REPO

COMPONENTS = ("router", "broker", "rollback", "hostile")
# The local game day (experiments/k8s/ and experiments/stack-configs/ are not experiments
# of this matrix).
EXPERIMENTS = sorted(
    [REPO / "experiments" / "control.yaml"]
    + list((REPO / "experiments" / "control").glob("*.yaml"))  # benign controls (#14)
    + [p for c in COMPONENTS for p in (REPO / "experiments" / c).glob("*.yaml")]
)
BY_NAME = {str(p.relative_to(REPO / "experiments").with_suffix("")): p for p in EXPERIMENTS}
# The dependency row (#16) has its own file rules (tests/test_dependency_experiments.py);
# what every game day must measure is checked here for it too.
WITH_DEPENDENCY = {
    **BY_NAME,
    **{
        f"dependency/{p.stem}": p
        for p in sorted((REPO / "experiments" / "dependency").glob("*.yaml"))
    },
}
FAULTS = ("latency", "pod-kill", "faulty-kernel")
# The hostile game day (issue #12): a broken engine, hostile clients, pins after a trip.
HOSTILE = (
    "broken-kernel",
    "client-flood",
    "pins-after-trip",
    "pins-after-errors",
    "wrong-credential",
    "colour-dropped",
    # No user waits on a broken part (#27): the stack's deadlines, caps and dead-man switch.
    "stalled-readers",
    "hung-canary",
    "gate-stopped",
)
# What each fault must do to a healthy gate: trip, or not.
EXPECT = {
    "latency": "no_trip",
    "pod-kill": "trip",
    "faulty-kernel": "trip",
    "broken-kernel": "trip",
    "client-flood": "no_trip",
    "pins-after-trip": "trip",
    # A bad canary every gate, even an alert on errors, must catch (#25), and the pins
    # after such a trip (so they run against a foreign stack too).
    "canary-errors": "trip",
    "pins-after-errors": "trip",
    "wrong-credential": "blind",
    # Traffic colouring (#16): the tag dropped at the model servers must be found there.
    "colour-dropped": "colour_lost",
    "stalled-readers": "no_trip",
    "hung-canary": "trip",
    "gate-stopped": "trip",
    # Benign negative controls (#14): a healthy build the gate must not trip on.
    "benign-noise": "no_trip",
    "small-drift": "no_trip",
}
FAULT_ACTIONS = {"inject_latency", "make_canary_faulty", "kill_pod", "inject_errors"}
# #27's fail-safe experiments state their own detection SLO in their file: a hung stream
# is evidence only at the router's 10 s idle deadline; a stopped gate trips only once it
# runs again (30 s). Users are protected there by the deadline and the routers' dead-man
# switch (rollback_s), which is what they judge.
OWN_DETECTION_S = {"hung-canary": 30, "gate-stopped": 40}
# gate-stopped: the broken canary serves its 5 % of ~40 req/s until the routers' 10 s
# dead-man time (~9 s after the fault): ~18.
OWN_DRIFTED_MAX = {"gate-stopped": 30}
# Actions that make the canary bad (the trip experiments' faults); those that serve no
# drifted answer to count (an error, a hang) need no drifted-responses check.
BAD_CANARY = {"make_canary_faulty", "inject_errors", "hang_canary"}
NOT_DRIFT = {"inject_errors", "hang_canary"}
REPORT_SLO_KEYS = {"detection_s", "weights_applied_s", "rollback_s", "rollback_complete_s"}
STACK_START_S, STACK_STOP_S, LOAD_STOP_S, CHAOS_START_S = 8, 8, 4, 2
BUDGET_S = 90


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def default(experiment: dict[str, Any], key: str) -> Any:
    entry = experiment["configuration"][key]
    return entry["default"] if isinstance(entry, dict) else entry


def resolve(experiment: dict[str, Any], value: Any) -> Any:
    match = re.fullmatch(r"\$\{([a-z_0-9]+)\}", str(value))
    return default(experiment, match.group(1)) if match else value


def activities(experiment: dict[str, Any]) -> list[dict[str, Any]]:
    return [*experiment["method"], *experiment.get("rollbacks", [])]


def test_every_component_gets_every_fault_plus_the_control() -> None:
    expected = {f"{c}/{f}" for c in ("router", "broker", "rollback") for f in FAULTS}
    expected |= {"control", "router/broken-kernel", "router/canary-errors"}
    expected |= {f"hostile/{f}" for f in HOSTILE}
    expected |= {"control/benign-noise", "control/small-drift"}
    expected |= {"broker/store-lost"}  # #27: a store that knows when it went backwards
    assert set(BY_NAME) == expected


def assert_all_valid(procs: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """Every ``chaos validate`` (by experiment name) exits 0 and says the experiment is
    valid; the failures, with the end of their output, otherwise."""
    failures = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0 or b"experiment syntax and semantic look valid" not in out:
            failures[name] = out.decode(errors="replace")[-800:]
    assert not failures, failures


def test_chaos_validate_accepts_every_experiment(tmp_path: Path) -> None:
    # All at once (each `chaos validate` is a Python start-up); each checked on its own.
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chaostoolkit",
                "--no-version-check",
                "--log-file",
                str(tmp_path / f"{name.replace('/', '-')}.log"),
                "validate",
                str(path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        for name, path in BY_NAME.items()
    }
    assert_all_valid(procs)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_gameday_extension_says_what_is_expected(name: str) -> None:
    exp = load(BY_NAME[name])
    ext = next(e for e in exp["extensions"] if e["name"] == "gameday")
    component, _, fault = name.partition("/")
    assert ext["component"] == component
    assert ext["fault"] == (fault or "none")
    assert ext["expect"] == EXPECT.get(fault, "no_trip")
    slo = {k: resolve(exp, v) for k, v in ext["slo"].items()}
    assert all(isinstance(v, int | float) for v in slo.values()), slo
    if ext["expect"] == "trip":
        assert set(slo) >= REPORT_SLO_KEYS
        errors = any(a["provider"].get("func") == "inject_errors" for a in activities(exp))
        # DESIGN.md §4: detection p95 <= 5 s for a faulty kernel; an error fault's SLO is
        # stated in its file (10 s: judged on canary outcomes, not comparisons)
        limit = OWN_DETECTION_S.get(fault, 10 if errors else 5)
        assert slo["detection_s"] <= limit, "DESIGN.md §4"
        if "drifted_max" in slo:  # (an error fault serves no drifted answer to count)
            most = OWN_DRIFTED_MAX.get(fault, 3)
            assert slo["drifted_max"] <= most, "DESIGN.md §4: <= 3 canary-served bad responses"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rollbacks_always_run_and_clear_the_faults(name: str) -> None:
    exp = load(BY_NAME[name])
    assert exp["runtime"]["rollbacks"]["strategy"] == "always"
    funcs = [(a["provider"]["module"], a["provider"]["func"]) for a in exp["rollbacks"]]
    assert ("probes.faults", "clear_faults") in funcs
    clear = next(a for a in exp["rollbacks"] if a["provider"]["func"] == "clear_faults")
    assert not clear["provider"].get("arguments"), "the rollback clears every fault of the run"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_faults_have_ttls_and_every_experiment_starts_from_the_same_state(name: str) -> None:
    exp = load(BY_NAME[name])
    for act in activities(exp):
        func = act["provider"]["func"]
        args = act["provider"].get("arguments", {})
        if func in ("inject_latency", "make_canary_faulty", "drop_colour"):
            ttl = resolve(exp, args["ttl_s"])
            assert 0 < ttl <= 600
    start = exp["steady-state-hypothesis"]["probes"][1]
    assert start["provider"]["func"] == "starting_state" and start["tolerance"] is True
    assert start["provider"]["arguments"] == {"canary_weight": "${canary_weight}"}
    assert exp["method"][0]["pauses"] in (  # the load warms up before the first fault
        {"before": "${warmup_s}"},
        {"after": "${warmup_s}"},
        {"before": "${warmup_s}", "after": "${kill_delay_s}"},
    )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_load_runs_and_slos_are_checked_after_it(name: str) -> None:
    exp = load(BY_NAME[name])
    assert [c["provider"]["module"] for c in exp["controls"]] == ["probes.load", "probes.journal"]
    probes = exp["steady-state-hypothesis"]["probes"]
    assert probes[0]["provider"]["func"] == "stack_healthy"
    for probe in probes[2:]:
        assert probe["provider"]["module"] in ("probes.slo", "probes.hostile", "probes.colouring")
        assert probe["tolerance"]["provider"]["func"] == "slo_met"
    funcs = {p["provider"]["func"] for p in probes}
    assert {"baseline_ttft_p99_below", "error_rate_below"} <= funcs
    if EXPECT.get(name.partition("/")[2]) == "trip":
        assert {"trip_within", "no_canary_served_after"} <= funcs
        no_drift = any(
            a["provider"].get("func") in NOT_DRIFT for a in activities(exp)
        )  # an error or a hang serves no drifted answer to count
        assert no_drift or "drifted_responses_at_most" in funcs
        method = [a["provider"]["func"] for a in exp["method"]]
        assert BAD_CANARY & set(method) and "wait_for_trip" in method
    else:
        assert "no_trip" in funcs
        assert "gate_did_not_trip" in [a["provider"]["func"] for a in exp["method"]]


@pytest.mark.parametrize("name", sorted(WITH_DEPENDENCY))
def test_every_game_day_measures_colouring_fidelity(name: str) -> None:
    """#16 item 4: the hypothesis (before and after the method) holds the colouring probe,
    judged by slo_met, with its goal in configuration (100 % by default)."""
    exp = load(WITH_DEPENDENCY[name])
    found = [
        p
        for p in exp["steady-state-hypothesis"]["probes"]
        if p["provider"]["module"] == "probes.colouring"
    ]
    assert len(found) == 1, name
    (probe,) = found
    assert probe["provider"]["func"] == "colouring_fidelity_at_least"
    assert probe["tolerance"]["provider"]["func"] == "slo_met"
    assert probe["provider"]["arguments"] == {"ratio": "${colour_fidelity}"}
    assert default(exp, "colour_fidelity") == 1.0
    assert exp["configuration"]["colour_fidelity"]["key"] == "GAMEDAY_SLO_COLOUR_FIDELITY"


def test_the_colour_dropped_experiment_drops_the_tag_where_it_expects_it_lost() -> None:
    from probes.colouring import HOP_RULES

    exp = load(BY_NAME["hostile/colour-dropped"])
    ext = next(e for e in exp["extensions"] if e["name"] == "gameday")
    assert ext["lost_at"] in {r.hop for r in HOP_RULES}
    method = {a["provider"]["func"]: a["provider"].get("arguments", {}) for a in exp["method"]}
    assert method["drop_colour"]["component"] == ext["lost_at"]
    assert "send_coloured_requests" in method
    assert method["colouring_fidelity_at_least"] == {"ratio": "${colour_fidelity}"}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_configuration_has_environment_overrides(name: str) -> None:
    exp = load(BY_NAME[name])
    for key, entry in exp["configuration"].items():
        assert isinstance(entry, dict) and entry["type"] == "env", key
        assert entry["key"].startswith("GAMEDAY_"), key
        assert "default" in entry, key
    assert exp["configuration"]["gameday_target"]["key"] == "GAMEDAY_TARGET"
    assert exp["configuration"]["gameday_run_dir"]["key"] == "GAMEDAY_RUN_DIR"
    # the load fits a 2-core machine running the whole stack
    assert default(exp, "load_users") <= 16 and default(exp, "load_max_tokens") <= 64


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_default_durations_fit_the_budget(name: str) -> None:
    exp = load(BY_NAME[name])
    waits = [default(exp, "warmup_s"), default(exp, "observe_s")]
    text = BY_NAME[name].read_text()
    if "wait_for_trip" in text:
        waits.append(5.0)  # the detection SLO: the trip itself
    if "kill_pod" in text:
        waits.append(3.0)  # a restart
    overhead = STACK_START_S + STACK_STOP_S + LOAD_STOP_S + CHAOS_START_S
    assert sum(waits) + overhead <= BUDGET_S, (name, waits)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_faults_stay_inside_the_default_blast_radius(name: str) -> None:
    exp = load(BY_NAME[name])
    allowed = set(load(REPO / "targets" / "local.yaml")["blast_radius"]["components"])
    for act in activities(exp):
        func = act["provider"]["func"]
        args = act["provider"].get("arguments", {})
        if func in ("inject_latency", "kill_pod", "drop_colour", "pause_pod"):
            assert args["component"] in allowed
        if func in ("make_canary_faulty", "hang_canary"):
            assert "model-canary" in allowed


def test_the_target_file_and_its_kubernetes_example_load() -> None:
    path = REPO / "targets" / "local.yaml"
    target = parse_target(load(path))
    assert target.kind == "local"
    # The gate may be paused (hostile/gate-stopped: SIGSTOP, always resumed), nothing else:
    # no experiment kills it or injects a fault into it.
    assert "gate" in target.blast_radius.components
    for experiment in EXPERIMENTS:
        for act in activities(load(experiment)):
            args = act["provider"].get("arguments", {})
            if args.get("component") == "gate":
                assert act["provider"]["func"] == "pause_pod", experiment
    example = path.read_text().split("# kind: kubernetes", 1)[1]
    uncommented = "kind: kubernetes\n" + "\n".join(
        line[2:] if line.startswith("# ") else line.lstrip("#") for line in example.splitlines()
    )
    k8s = parse_target(yaml.safe_load(uncommented))
    assert k8s.kind == "kubernetes" and k8s.describe()["namespace"] == "llm-canary"


def _recipe(makefile: str, target: str) -> str:
    return makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def test_the_makefile_runs_each_component_and_the_whole_game_day() -> None:
    text = (REPO / "Makefile").read_text()
    for component in COMPONENTS:
        recipe = _recipe(text, f"chaos-{component}")
        assert "$(STAMP)" in recipe  # installs on first use
        assert re.search(rf"gameday run experiments/{component}/\*\.yaml .*\$\(RUN_ARGS\)", recipe)
    recipe = _recipe(text, "gameday")
    for part in ("experiments/control.yaml", *(f"experiments/{c}/*.yaml" for c in COMPONENTS)):
        assert part in recipe
