"""Journals for the verdict tests (``gameday.run.verdict.decide``)."""

from __future__ import annotations

from typing import Any


def passing_journal(expect: str = "trip") -> dict[str, Any]:
    """A Chaos Toolkit journal of a run that went as planned: completed, not deviated, its
    hypothesis (one probe) met before and after a one-probe method, and the ``gameday``
    extension saying the experiment expects ``expect``."""
    return {
        "status": "completed",
        "deviated": False,
        "experiment": {
            "extensions": [{"name": "gameday", "expect": expect}],
            "method": [{"name": "m"}],
            "steady-state-hypothesis": {"probes": [{"name": "p"}]},
        },
        "steady_states": {
            "before": {"steady_state_met": True, "probes": []},
            "after": {"steady_state_met": True, "probes": []},
        },
        "run": [{"status": "succeeded", "activity": {"name": "m", "type": "probe"}}],
        "rollbacks": [],
    }
