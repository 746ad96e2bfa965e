"""Chaos Toolkit activities (probes, actions, controls) for canary game days.

Modules, named by what an experiment author reads in ``module:``:

- ``probes.faults``  actions: ``inject_latency``, ``make_canary_faulty``, ``kill_pod``,
  ``clear_faults`` — every fault with a TTL, inside the target's blast radius;
- ``probes.stack``   probes: ``stack_healthy``, ``release_phase``, ``canary_weight``,
  ``wait_for_release_phase``, ``no_active_faults``;
- ``probes.gate``    probes: ``wait_for_trip`` (seconds from the fault to the trip, with a
  deadline), ``gate_did_not_trip``;
- ``probes.slo``     SLO probes over the run's records and the broker's history, each
  returning ``{"check", "measured", "allowed", "unit", "ok", "detail"}``, and the
  ``slo_met`` tolerance;
- ``probes.load``    the control that runs Locust around the method;
- ``probes.hostile`` the hostile game day: a flood of hostile input pinned to the canary,
  pins sent after a trip, and the SLO probes that judge them;
- ``probes.dependency`` the shared Redis stalled, filled and killed (``pause_redis``,
  ``exhaust_redis``, ``kill_redis``, ``clear_redis_faults``) and what users saw of it;
- ``probes.colouring`` colouring fidelity (``colouring_fidelity_at_least``) and the
  actions ``send_coloured_requests`` and ``drop_colour``.

Every activity reads two configuration entries: ``gameday_target`` (the target file;
env ``GAMEDAY_TARGET``) and ``gameday_run_dir`` (where the ledger and records go; env
``GAMEDAY_RUN_DIR``). ``chaos discover --no-install chaostoolkit-canary-gameday``
lists them all (``probes`` is packaged as that distribution: probes/pyproject.toml).

Activities are thin adapters: what they measure is ``gameday.evidence`` (the same core the
report uses), how they reach the stack is ``gameday.api``, faults and load are
``gameday.faults`` and ``gameday.load``. Nothing here runs at import time, and nothing
imports ``canarystack``.
"""

from __future__ import annotations

from canary_contract.json import JsonObject

__version__ = "0.1.0"
__all__ = ["__version__", "discover"]

# Every exported activity module; each function is an action, a probe or a control
# hook by its name (chaoslib's control hooks have fixed names).
MODULES = (
    "probes.faults",
    "probes.stack",
    "probes.gate",
    "probes.slo",
    "probes.load",
    "probes.journal",
    "probes.kubernetes",
    "probes.fresh_canary",
    "probes.progressive",
    "probes.prometheus",
    "probes.hostile",
    "probes.evidence",
    "probes.dependency",
    "probes.colouring",
)
ACTIONS = frozenset(
    {
        "inject_latency",
        "make_canary_faulty",
        "kill_pod",
        "clear_faults",
        "start_fresh_canary",
        "flood_pinned_canary",
        "break_gate_credential",
        "pin_canary_after_trip",
        "roll_out_bad_canary",
        "undo_canary_rollout",
        "pause_redis",
        "exhaust_redis",
        "kill_redis",
        "clear_redis_faults",
        "send_coloured_requests",
        "drop_colour",
    }
)
CONTROL_HOOK_SUFFIX = "_control"


def _kind(name: str) -> str:
    if name.endswith(CONTROL_HOOK_SUFFIX):
        return "control"
    return "action" if name in ACTIONS else "probe"


def discover(discover_system: bool = True) -> JsonObject:
    """What this extension offers, in Chaos Toolkit's discovery format.

    ``chaos discover --no-install chaostoolkit-canary-gameday`` calls this (the
    ``probes`` package is its own distribution, see probes/pyproject.toml).
    """
    from chaoslib.discovery import initialize_discovery_result
    from chaoslib.discovery.discover import discover_activities

    discovery = initialize_discovery_result("chaostoolkit-canary-gameday", __version__, "gameday")
    for module in MODULES:
        for activity in discover_activities(module, "probe"):
            activity["type"] = _kind(activity["name"])
            discovery["activities"].append(activity)
    if discover_system:
        discovery["system"] = None  # the target is described by a target file, not found
    return dict(discovery)
