"""The milestones of a game day, each from the record that shows it.

fault injected → first drifted sample → gate trip → weight 0 at every router → last
canary-served request → rollback complete. The probes time them live (``probes.slo``);
the report draws them from the run's files (``gameday.report.timeline``); both call these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gameday.evidence.events import annotation_events, event_time

ROUTERS_APPLIED = "routers_applied"
# Broker, router and harness clocks are the same machine's here; allow a little skew elsewhere.
CLOCK_SLACK_S = 1.0


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
    own time stands in: later, by the executor's and the broker's latency. Without any
    annotation, the routers themselves: when every live router the broker lists reports
    a ``canary_off_since`` since the trip, the latest of them. ``source`` says which
    (``canary_off_at`` | ``annotation_time`` | ``routers``).
    """

    time: float
    source: str
    annotation: Mapping[str, object] | None  # the broker's routers_applied event
    routers: int = 0  # how many routers reported, for source "routers"

    @property
    def annotation_time(self) -> float | None:
        return None if self.annotation is None else event_time(self.annotation)

    def sentence(self) -> str:
        annotated = self.annotation_time
        if self.source == "canary_off_at" and annotated is not None:
            return (
                "routers_applied annotation, canary_off_at (the last live router's canary "
                f"weight became 0; annotated {annotated - self.time:.2f} s later)"
            )
        if self.source == "routers":
            return (
                f"the {self.routers} live routers' own canary_off_since (no routers_applied "
                "annotation): when the last of them stopped sending the canary traffic"
            )
        return (
            "routers_applied annotation's time (no canary_off_at in it: a router did not "
            "report when its canary weight became 0)"
        )

    def detail(self) -> dict[str, object]:
        change = (self.annotation or {}).get("change")
        change = change if isinstance(change, dict) else {}
        keys = ("revision", "routers", "waited_s", "retries")
        out: dict[str, object] = {k: change.get(k) for k in keys}
        out.update(
            source=self.source,
            time_source=self.source,
            source_text=self.sentence(),
            annotation_time=self.annotation_time,
        )
        if self.source == "routers":
            out["routers"] = self.routers
        if self.source in ("canary_off_at", "routers"):
            out["canary_off_at"] = self.time
        if self.source == "canary_off_at" and self.annotation_time is not None:
            out["annotation_after_off_s"] = round(self.annotation_time - self.time, 6)
        return out


def weights_applied(
    events: Iterable[Mapping[str, object]],
    after: float | None,
    routers: Sequence[Mapping[str, object]] = (),
) -> WeightsApplied | None:
    """The first ``routers_applied`` annotation at or after ``after`` (the trip, when it
    is known; else the fault), else the ``routers`` the broker lists (their heartbeats),
    read as ``WeightsApplied`` says; None when neither shows weight 0 everywhere."""
    found = annotation_events(events, ROUTERS_APPLIED, after)
    if found:
        event = found[0]
        change = event.get("change")
        off = _finite(change.get("canary_off_at")) if isinstance(change, dict) else None
        if off is not None:
            return WeightsApplied(off, "canary_off_at", event)
        return WeightsApplied(event_time(event), "annotation_time", event)
    offs = [_finite(r.get("canary_off_since")) for r in routers]
    floor = None if after is None else after - CLOCK_SLACK_S
    if not offs or any(o is None or (floor is not None and o < floor) for o in offs):
        return None
    return WeightsApplied(max(o for o in offs if o is not None), "routers", None, len(offs))


def last_canary_request(
    served_by: np.ndarray[Any, Any], start_time: np.ndarray[Any, Any], fault_time: float
) -> tuple[float | None, int]:
    """The latest start of a canary-served request at or after the fault, and how many
    there were (``None, 0``: none started after it)."""
    canary = (served_by == "canary") & (start_time >= fault_time)
    count = int(canary.sum())
    return (float(start_time[canary].max()) if count else None), count
