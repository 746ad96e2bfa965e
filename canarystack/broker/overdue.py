"""The rollback executor's dead-man switch, as rules: a release left in ``tripped`` or
``rolling_back`` with no phase change for longer than ``--rollback-overdue-s`` has a
rollback that is not moving (the executor stopped, hung, or cannot reach the broker).

This module must never read a clock or do I/O: ``service.Broker`` passes the times in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from canarystack.broker.phases import Phase
from canarystack.broker.records import OverdueJson, ReleaseJson

# The executor moves a release out of these phases (tripped -> rolling_back -> rolled_back).
AWAITING_ROLLBACK: frozenset[str] = frozenset({Phase.TRIPPED.value, Phase.ROLLING_BACK.value})
# Above the executor's longest healthy step at its defaults: step 2 waits up to
# --apply-timeout-s 5 s x (1 + --apply-retries 6) = 35 s for lagging routers, plus its
# backoff (at most 2 s) and a broker restart or two (docs/stack.md).
DEFAULT_ROLLBACK_OVERDUE_S = 60.0


@dataclass(frozen=True)
class Overdue:
    """A release whose rollback has not moved for ``for_s`` seconds (``limit_s`` allowed)."""

    release: str
    phase: str
    revision: int
    for_s: float
    limit_s: float

    def reason(self) -> str:
        nxt = "rolling_back" if self.phase == Phase.TRIPPED else "rolled_back"
        return (
            f"rollback_overdue: release {self.release!r} has been {self.phase} for "
            f"{self.for_s:.0f} s (limit {self.limit_s:g} s, --rollback-overdue-s) without "
            f"moving to {nxt}; its canary gets no traffic, but nothing finishes the "
            "rollback. Check the rollback executor (is it running? its /health and GET "
            f"/v1/rollbacks/{self.release} say why it waits), or start it"
        )

    def to_json(self) -> OverdueJson:
        return {
            "phase": self.phase,
            "revision": self.revision,
            "for_s": round(self.for_s, 3),
            "limit_s": self.limit_s,
            "reason": self.reason(),
        }


def overdue(
    release: ReleaseJson, phase_since: float | None, now: float, limit_s: float
) -> Overdue | None:
    """``release``'s overdue rollback, or None; ``phase_since`` is when it entered its phase
    (on the same clock as ``now``; None: unknown, never overdue)."""
    if release["phase"] not in AWAITING_ROLLBACK or phase_since is None:
        return None
    age = now - phase_since
    if age <= limit_s:
        return None
    return Overdue(release["name"], release["phase"], release["revision"], age, limit_s)


def all_overdue(
    releases: Mapping[str, ReleaseJson],
    phase_since: Mapping[str, float],
    now: float,
    limit_s: float,
) -> list[Overdue]:
    """Every release's overdue rollback, by name."""
    found = (overdue(releases[n], phase_since.get(n), now, limit_s) for n in sorted(releases))
    return [o for o in found if o is not None]
