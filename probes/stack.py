"""Chaos Toolkit probes of the stack's state: health, the release's phase and canary weight.

Without ``expected`` a probe returns what it sees (for a tolerance); with it, it raises
``ActivityFailed`` naming expected and actual. Everything is read over HTTP from the
target, never from files or internals. These probes never change anything.
"""

from __future__ import annotations

import time

from chaoslib.exceptions import ActivityFailed

from canary_contract.phases import Phase
from gameday.targets.health import active_faults, unhealthy
from gameday.targets.waits import poll
from probes._context import (
    Configuration,
    deadline_after,
    ledger,
    release_phase_now,
    stack_api,
)
from probes._run_records import load_state

__all__ = [
    "canary_weight",
    "no_active_faults",
    "release_phase",
    "stack_healthy",
    "starting_state",
    "wait_for_release_phase",
]

PHASES = tuple(p.value for p in Phase)


def stack_healthy(
    wait_s: float = 0.0,
    configuration: Configuration | None = None,
) -> bool:
    """True when every replica of every component answers ``/health``; waits up to
    ``wait_s`` seconds for that (a killed pod being restarted), else raises naming the
    replicas that did not answer."""
    deadline = deadline_after(wait_s)
    with stack_api(configuration, "checking the stack's health") as api:
        problems, healthy = poll(lambda: unhealthy(api), lambda p: not p, deadline, 0.25)
        if healthy:
            return True
        raise ActivityFailed(
            f"expected every component to answer /health (waited {float(wait_s):g} s), "
            f"but {len(problems)} did not: " + "; ".join(problems)
        )


def release_phase(
    expected: str | None = None,
    configuration: Configuration | None = None,
) -> str:
    """The release's phase (``progressing``, ``tripped``, ``rolling_back``,
    ``rolled_back``, ``promoted``); with ``expected``, raises unless it is that.

    How a method checks that an experiment starts from the state it assumes::

        - type: probe
          name: release-is-progressing
          provider: {type: python, module: probes.stack, func: release_phase,
                     arguments: {expected: progressing}}
    """
    if expected is not None and expected not in PHASES:
        raise ActivityFailed(f"argument expected is {expected!r}: use one of {', '.join(PHASES)}")
    with stack_api(configuration, "reading the release phase") as api:
        phase, target = str(api.release().get("phase")), api.target
    if expected is not None and phase != expected:
        hint = ""
        if expected == "progressing":
            hint = (
                " — an earlier experiment or a real trip left it there: start a fresh stack "
                "(`gameday run` does, when it owns the stack) or deploy a new canary version"
            )
        raise ActivityFailed(
            f"release {target.release!r} is in phase {phase!r} but should be {expected!r}{hint}"
        )
    return phase


def canary_weight(
    expected: int | None = None,
    configuration: Configuration | None = None,
) -> int:
    """The canary's traffic weight in percent, as the broker has it; with ``expected``,
    raises unless it is that."""
    return _weight(expected, configuration)


def _weight(expected: int | None, configuration: Configuration | None) -> int:
    with stack_api(configuration, "reading the canary weight") as api:
        weights, target = api.release().get("weights"), api.target
    canary = weights.get("canary") if isinstance(weights, dict) else None
    weight = int(canary) if isinstance(canary, int | float) else 0
    if expected is not None and weight != int(expected):
        raise ActivityFailed(
            f"release {target.release!r} gives the canary {weight}% of traffic but the "
            f"experiment expects {int(expected)}% (its configuration canary_weight, env "
            "GAMEDAY_CANARY_WEIGHT)"
        )
    return weight


def wait_for_release_phase(
    phase: str,
    deadline_s: float = 30.0,
    poll_s: float = 0.1,
    configuration: Configuration | None = None,
) -> float:
    """Wait until the release is in ``phase``; returns the seconds waited, raises after
    ``deadline_s`` (Chaos Toolkit does not time out Python activities, so this does)."""
    if phase not in PHASES:
        raise ActivityFailed(f"argument phase is {phase!r}: use one of {', '.join(PHASES)}")
    t0 = time.monotonic()
    deadline = deadline_after(deadline_s)
    with stack_api(configuration, f"waiting for phase {phase}") as api:
        last, reached = poll(
            lambda: release_phase_now(api),
            lambda p: p == phase,
            deadline,
            max(0.02, float(poll_s)),
        )
        if reached:
            return round(time.monotonic() - t0, 3)
        raise ActivityFailed(
            f"release {api.target.release!r} should reach phase {phase!r} within "
            f"{float(deadline_s):g} s, but it is {last!r}"
        )


def starting_state(
    canary_weight: int | None = None,
    configuration: Configuration | None = None,
) -> bool:
    """Before anything happened in this experiment (no fault in its ledger, no load run):
    True when the release is progressing, gives the canary ``canary_weight`` percent and
    no replica holds a fault — else raises saying what differs, so the steady state is
    not met and the method never runs. Once the experiment has begun (the hypothesis
    after the method) it returns True: the start is history by then."""
    if ledger(configuration).entries() or load_state(configuration) is not None:
        return True
    release_phase(expected="progressing", configuration=configuration)
    if canary_weight is not None:
        _weight(canary_weight, configuration)
    return no_active_faults(configuration=configuration)


def no_active_faults(
    configuration: Configuration | None = None,
) -> bool:
    """True when no replica of any component holds a fault (the state an experiment must
    start from); raises listing the leftovers otherwise."""
    with stack_api(configuration, "listing active faults") as api:
        found = active_faults(api)
    if found:
        raise ActivityFailed(
            "expected no active faults before the experiment, found: "
            + "; ".join(found)
            + " — wait for their TTL or clear them (DELETE /admin/faults)"
        )
    return True
