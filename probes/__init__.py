"""Chaos Toolkit activities (probes, actions, controls) for canary game days.

Every activity reads ``gameday_target`` and ``gameday_run_dir`` from its configuration
(``probes._context``); ``chaos discover --no-install chaostoolkit-canary-gameday`` lists
them all (packaged as that distribution: probes/pyproject.toml). Activities are thin
adapters over ``gameday.evidence`` (what they measure), ``gameday.api`` (how they reach
the stack), ``gameday.faults`` and ``gameday.load``. Nothing here runs at import time,
and nothing imports ``canarystack``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Chaos Toolkit's discovery format, as chaoslib declares it
    from chaoslib.types import Discovery

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
    "probes.broker_store",
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
        "mark_broker_before_loss",
        "lose_broker_store",
        "accept_store_loss",
        "restore_broker_store",
    }
)
CONTROL_HOOK_SUFFIX = "_control"


def _kind(name: str) -> str:
    if name.endswith(CONTROL_HOOK_SUFFIX):
        return "control"
    return "action" if name in ACTIONS else "probe"


def discover(discover_system: bool = True) -> Discovery:
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
