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
- ``probes.load``    the control that runs Locust around the method.

Every activity reads two configuration entries: ``gameday_target`` (the target file;
env ``GAMEDAY_TARGET``) and ``gameday_run_dir`` (where the ledger and records go; env
``GAMEDAY_RUN_DIR``). ``chaos discover --no-install probes`` lists them all.

Activities are thin: the work is in ``gameday`` (targets, faults, load). Nothing here runs
at import time, and nothing imports ``canarystack``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "discover"]

ACTION_MODULES = ("probes.faults",)
PROBE_MODULES = ("probes.stack", "probes.gate", "probes.slo")
CONTROL_MODULES = ("probes.load",)


def discover(discover_system: bool = True) -> dict[str, Any]:
    """What this extension offers, in Chaos Toolkit's discovery format."""
    from chaoslib.discovery import (
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    discovery = initialize_discovery_result("canary-gameday-probes", __version__, "gameday")
    for module in ACTION_MODULES:
        discovery["activities"].extend(discover_actions(module))
    for module in PROBE_MODULES:
        discovery["activities"].extend(discover_probes(module))
    for module in CONTROL_MODULES:
        for control in discover_probes(module):
            control["type"] = "control"
            discovery["activities"].append(control)
    if discover_system:
        discovery["system"] = None  # the target is described by a target file, not found
    return dict(discovery)
