"""The milestones of a game day, each from the record that shows it.

fault injected → first drifted sample → gate trip → weight 0 at every router → last
canary-served request → rollback complete. The probes time them live (``probes.slo``);
the report draws them from the run's files (``gameday.report.timeline``); both call these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from canary_contract.json import JsonObject
from gameday.evidence.events import annotation_events, event_time

ROUTERS_APPLIED = "routers_applied"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class WeightsApplied:
    """When canary weight 0 was in force at every live router.

    From the rollback executor's ``routers_applied`` annotation, which it writes once
    every live router reports the rollback revision. Its ``canary_off_at`` is the latest
    ``canary_off_since`` those routers reported in their heartbeats: when the last of
    them stopped sending the canary traffic (a router stops as soon as it applies the
    trip, before the executor sees it). That is the milestone when the annotation has
    it. Without it (an older executor, or a router that did not say) the annotation's
    own time stands in: later, by the executor's and the broker's latency. ``source``
    says which (``canary_off_at`` | ``annotation_time``).
    """

    time: float
    source: str
    annotation: JsonObject

    @property
    def annotation_time(self) -> float:
        return event_time(self.annotation)

    def sentence(self) -> str:
        if self.source == "canary_off_at":
            return (
                "routers_applied annotation, canary_off_at (the last live router's canary "
                f"weight became 0; annotated {self.annotation_time - self.time:.2f} s later)"
            )
        return (
            "routers_applied annotation's time (no canary_off_at in it: a router did not "
            "report when its canary weight became 0)"
        )

    def detail(self) -> dict[str, Any]:
        change = self.annotation.get("change")
        change = change if isinstance(change, dict) else {}
        out: dict[str, Any] = {
            k: change.get(k) for k in ("revision", "routers", "waited_s", "retries")
        }
        out.update(
            source=self.source,
            time_source=self.source,
            source_text=self.sentence(),
            annotation_time=self.annotation_time,
        )
        if self.source == "canary_off_at":
            out["canary_off_at"] = self.time
            out["annotation_after_off_s"] = round(self.annotation_time - self.time, 6)
        return out


def weights_applied(events: Iterable[JsonObject], after: float | None) -> WeightsApplied | None:
    """The first ``routers_applied`` annotation at or after ``after`` (the trip, when it
    is known; else the fault), read as ``WeightsApplied`` says."""
    found = annotation_events(events, ROUTERS_APPLIED, after)
    if not found:
        return None
    event = found[0]
    change = event.get("change")
    off = _finite(change.get("canary_off_at")) if isinstance(change, dict) else None
    if off is not None:
        return WeightsApplied(off, "canary_off_at", event)
    return WeightsApplied(event_time(event), "annotation_time", event)


def last_canary_request(
    served_by: np.ndarray[Any, Any], start_time: np.ndarray[Any, Any], fault_time: float
) -> tuple[float | None, int]:
    """The latest start of a canary-served request at or after the fault, and how many
    there were (``None, 0``: none started after it)."""
    canary = (served_by == "canary") & (start_time >= fault_time)
    count = int(canary.sum())
    return (float(start_time[canary].max()) if count else None), count
