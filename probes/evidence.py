"""The evidence probe: what the gate saw, read at the end of the method (issue #14).

It never fails the experiment itself: an unreadable gate is written down as such, and
the verdict (``gameday.run.sufficiency``) makes it inconclusive. It only reads the target.
"""

from __future__ import annotations

from gameday.run.sufficiency import GATE_EVIDENCE_NAME, thresholds, write_gate_evidence
from probes._context import Configuration, get_target, reported, run_dir

__all__ = ["gate_evidence"]


def gate_evidence(
    min_comparisons: int | None = None,
    min_canary_outcomes: int | None = None,
    configuration: Configuration | None = None,
) -> dict[str, object]:
    """Write the gate's counters to gate-evidence.json; returns what was written.

    It reads the gate's counters (``GET /v1/gate/<release>``, over HTTP only) — baseline-canary
    comparisons and canary outcomes per bucket — and writes them, with the minimum evidence
    asked for, to ``gate-evidence.json`` in the run folder; too little seen makes the
    experiment ``inconclusive``. Without the arguments the thresholds come from
    ``GAMEDAY_MIN_COMPARISONS`` / ``GAMEDAY_MIN_CANARY_OUTCOMES``, else the defaults. Bad
    thresholds raise ``ActivityFailed`` naming the argument::

        - type: probe
          name: gate-evidence
          provider:
            type: python
            module: probes.evidence
            func: gate_evidence
            arguments: {min_comparisons: ${min_comparisons},
                        min_canary_outcomes: ${min_canary_outcomes}}
    """
    with reported(ValueError):
        limits = thresholds(min_comparisons, min_canary_outcomes)
    folder = run_dir(configuration)
    doc = write_gate_evidence(get_target(configuration), folder, limits, source="probe")
    return {"file": str(folder / GATE_EVIDENCE_NAME), **doc}
