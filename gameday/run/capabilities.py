"""What an experiment needs from its target, and what a target lacks: *not applicable*.

An experiment needs what its ``gameday`` extension declares (``requires: [...]``) plus what
its method and rollbacks do, read from their activities (``NEEDS``): a latency fault on
the router needs ``faults:router:latency``, a pod kill of the canary ``kill:model-canary``,
a Redis stall ``dependency``, a pin ``pins``, a canarystack rollout ``broker``. A target
that lacks one gets the verdict ``not_applicable`` with the reasons, before any fault and
without running ``chaos run``: never a silent pass, never a crash.

canarystack's targets (``local``, ``kubernetes``) have every capability. Steps that only
canarystack's gate can answer (its noise floor, its routers' health, colour hops) are not
requirements: their probes say *not applicable* on a foreign target and the run goes on.

This module only reads experiments and targets.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from gameday.targets import Target
from gameday.targets.health import StatedFaults

if TYPE_CHECKING:  # an experiment as Chaos Toolkit declares it
    from chaoslib.types import Activity, Experiment

__all__ = ["missing", "needs", "target_capabilities"]

MODEL_ROLES = ("model-baseline", "model-canary")
# A kernel fault's mode is a capability of the canary's engine: a real engine's pod states
# the builds it can make (/health kernel_modes, read by the runner), the simulator has all.
KERNEL_MODE = "kernel-mode:"
DEFAULT_KERNEL_MODE = "fp8-kv-scale"  # probes.faults.make_canary_faulty's default
# (module, func) -> a function of the activity's arguments giving the capabilities it needs.
NEEDS: dict[tuple[str, str], Any] = {
    ("probes.faults", "inject_latency"): lambda a: [
        f"faults:{r}:latency" for r in _roles(a.get("component"))
    ],
    ("probes.faults", "make_canary_faulty"): lambda a: [
        "faults:model-canary:kernel",
        f"{KERNEL_MODE}{a.get('mode') or DEFAULT_KERNEL_MODE}",
    ],
    ("probes.faults", "inject_errors"): lambda a: [
        f"faults:{r}:errors" for r in _roles(a.get("component") or "model-canary")
    ],
    ("probes.faults", "kill_pod"): lambda a: [f"kill:{r}" for r in _roles(a.get("component"))],
    ("probes.faults", "break_gate_credential"): lambda a: ["gate_api"],
    ("probes.faults", "hang_canary"): lambda a: ["faults:model-canary:hang"],
    ("probes.faults", "pause_pod"): lambda a: [f"pause:{r}" for r in _roles(a.get("component"))],
    ("probes.gate", "routers_fail_safe_without_gate"): lambda a: ["router_health"],
    ("probes.hostile", "stall_readers"): lambda a: ["router_deadlines"],
    ("probes.hostile", "pin_canary_after_trip"): lambda a: ["pins"],
    ("probes.hostile", "flood_pinned_canary"): lambda a: ["pins"],
    ("probes.colouring", "drop_colour"): lambda a: ["colour_hops"],
    ("probes.kubernetes", "roll_out_bad_build"): lambda a: ["rollout:model-canary"],
    # a rollout of a bad build (--kernel-fault MODE:N): the canary's engine must build MODE
    ("probes.kubernetes", "roll_out_bad_canary"): lambda a: [
        "broker",
        f"{KERNEL_MODE}{str(a.get('kernel_fault') or DEFAULT_KERNEL_MODE).partition(':')[0]}",
    ],
    ("probes.kubernetes", "undo_canary_rollout"): lambda a: ["rollout:model-canary"],
}
# Whole modules that only canarystack's own stack answers.
MODULE_NEEDS = {
    "probes.dependency": "dependency",
    "probes.kubernetes": "broker",
    "probes.progressive": "broker",
    "probes.fresh_canary": "broker",
    "probes.broker_store": "broker",  # the broker's own store and its loss (#27)
}
WHY = {
    "gate_api": "canarystack's gate API (/v1/gate)",
    "broker": "canarystack's version broker (releases, versions, rollouts)",
    "dependency": "the stack's shared Redis (experiments/dependency/)",
    "pins": "a pin header (pin: in the target file)",
    "colour_hops": "every component's colour hop log (/v1/colour/hops)",
    "router_health": "routers that report whether the gate hears them",
    "router_deadlines": "canarystack's router deadlines and stream caps (#27)",
}


def _roles(component: Any) -> list[str]:
    if component == "model":
        return list(MODEL_ROLES)
    return [str(component)] if component else []


def _activities(experiment: Experiment) -> list[Activity]:
    out: list[Activity] = []
    for key in ("method", "rollbacks"):
        for act in experiment.get(key) or []:
            if isinstance(act, dict) and isinstance(act.get("provider"), dict):
                out.append(act)
    return out


def _resolved(value: Any, config: dict[str, Any]) -> Any:
    """An argument ``"${name}"`` as ``chaos run`` will see it: the configuration's value,
    an ``env`` entry's variable (from this process's environment, which ``gameday run``
    passes on) or its default; ``${name}`` inside a longer string (``"${mode}:${n}"``)
    replaced by its value's text; anything else as written."""
    if not isinstance(value, str):
        return value
    if value.startswith("${") and value.endswith("}") and value.count("${") == 1:
        return _value(value[2:-1], value, config)
    return PLACEHOLDER.sub(lambda m: str(_value(m.group(1), m.group(0), config)), value)


PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


def _value(name: str, written: str, config: dict[str, Any]) -> Any:
    entry = config.get(name, written)
    if isinstance(entry, dict) and entry.get("type") == "env":
        return os.environ.get(str(entry.get("key")), entry.get("default", written))
    return entry


def needs(experiment: Experiment) -> dict[str, str]:
    """Capability -> the activity (or declaration) that needs it."""
    found: dict[str, str] = {}
    ext = next(
        (
            e
            for e in experiment.get("extensions") or []
            if isinstance(e, dict) and e.get("name") == "gameday"
        ),
        {},
    )
    for cap in ext.get("requires") or []:
        found.setdefault(str(cap), "declared in the experiment's gameday extension (requires)")
    raw_config = experiment.get("configuration")
    config = raw_config if isinstance(raw_config, dict) else {}
    for act in _activities(experiment):
        prov = act["provider"]
        module, func = str(prov.get("module") or ""), str(prov.get("func") or "")
        raw = prov.get("arguments") if isinstance(prov.get("arguments"), dict) else {}
        args = {k: _resolved(v, config) for k, v in raw.items()}
        rule = NEEDS.get((module, func))
        caps = list(rule(args)) if rule else []
        if module in MODULE_NEEDS and rule is None:
            caps.append(MODULE_NEEDS[module])
        if module.startswith("chaosk8s"):
            caps.append("kubernetes")
        for cap in caps:
            found.setdefault(cap, f"{act.get('type', 'activity')} {act.get('name')!r}")
    return found


def target_capabilities(target: Target) -> frozenset[str] | None:
    """What the target can do; None: everything (canarystack's own stack)."""
    caps = getattr(target, "capabilities", None)
    return caps() if callable(caps) else None


def _fault_cap(cap: str) -> tuple[str, str]:
    """(role, kind) of a ``faults:ROLE:KIND`` capability."""
    _, role, kind = [*cap.split(":"), "", ""][:3]
    return role, kind


def _say(cap: str) -> str:
    if cap.startswith("faults:"):
        role, kind = _fault_cap(cap)
        return f"a way to inject {kind} into {role} (components.{role}.faults)"
    if cap.startswith("rollout:"):
        role = cap.split(":", 1)[1]
        return f"a workload to roll a bad build out to for {role} (components.{role}.rollout)"
    if cap.startswith("pause:"):
        role = cap.split(":", 1)[1]
        return f"a way to pause a pod of {role} (SIGSTOP by PID: the local target)"
    if cap.startswith("kill:"):
        role = cap.split(":", 1)[1]
        return f"a way to kill a pod of {role} (components.{role}.kill)"
    return WHY.get(cap, cap)


def missing(
    target: Target, experiment: Experiment, stated: StatedFaults | None = None
) -> list[str]:
    """Why the experiment is not applicable to ``target`` (empty: it is). ``stated``: the
    faults the target's parts say they can be given (``/health``, read by the runner)."""
    have = target_capabilities(target)
    stated = stated or StatedFaults()
    out = []
    for cap, who in needs(experiment).items():
        why = _unstated(cap, stated)
        # (a kernel mode is only ever what a part states: a target file names fault kinds)
        if why is None and have is not None and cap not in have and not _is_mode(cap):
            why = f"lacks {_say(cap)}"
        if why is not None:
            out.append(f"not applicable: target {target.name!r} {why}, which {who} needs")
    return out


def _is_mode(cap: str) -> bool:
    return cap.startswith(KERNEL_MODE)


def _unstated(cap: str, stated: StatedFaults) -> str | None:
    """Why ``cap`` is outside what the target's parts state they can be given (None: it
    is not, or they state nothing)."""
    if _is_mode(cap):
        modes, mode = stated.kernel_modes, cap.removeprefix(KERNEL_MODE)
        if modes is None or mode in modes:
            return None
        return (
            f"has a canary whose engine builds the kernel modes "
            f"{', '.join(sorted(modes)) or 'none'} (its /health kernel_modes), not {mode!r} "
            "(a real engine makes builds, not NaN or garbage on request: run it against the "
            "simulator, or set the experiment's mode, GAMEDAY_KERNEL_MODE, to one of those)"
        )
    if cap.startswith("faults:"):
        role, kind = _fault_cap(cap)
        kinds = stated.kinds.get(role)
        if kinds is None or kind in kinds:
            return None
        return (
            f"has a {role} that takes the faults {', '.join(sorted(kinds)) or 'none'} (its "
            f"/health fault_kinds), not {kind}"
        )
    return None
