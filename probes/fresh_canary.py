"""A Chaos Toolkit control that starts a Kubernetes experiment from a fresh canary, before
its steady-state hypothesis and before the load starts.

When that fails the experiment is interrupted (``InterruptExecution``): it must never run
from a state it did not choose.
"""

from __future__ import annotations

import time
from typing import Any

from chaoslib.exceptions import ActivityFailed, InterruptExecution

from probes._context import Configuration, Secrets, write_run_json
from probes.kubernetes import start_fresh_canary

__all__ = ["before_experiment_control"]

STATE_NAME = "fresh-canary.json"


def before_experiment_control(
    context: Any,
    weight: int = 5,
    deadline_s: float = 300.0,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """Start from a progressing release with a canary that is not quarantined.

    A cluster is not restarted between experiments the way ``gameday run`` restarts a local
    stack, so the previous experiment may have left the release tripped and rolled back with
    its canary quarantined. This runs ``probes.kubernetes.start_fresh_canary`` and writes
    what it did to ``fresh-canary.json`` in the run folder::

        controls:
          - name: fresh-canary
            provider: {type: python, module: probes.fresh_canary,
                       arguments: {weight: 5, deadline_s: 300}}
    """
    started = time.time()
    try:
        outcome = start_fresh_canary(weight, deadline_s, configuration)
    except ActivityFailed as exc:
        write_run_json(
            configuration, STATE_NAME, {"ok": False, "error": str(exc), "started_at": started}
        )
        raise InterruptExecution(
            f"the experiment needs a progressing release with a fresh canary and could not "
            f"get one, so it stops: {exc}"
        ) from None
    write_run_json(configuration, STATE_NAME, {"ok": True, "started_at": started, **outcome})
