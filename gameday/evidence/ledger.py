"""The fault ledger's entries, as the evidence core reads them: what a run injected,
cleared, killed or harmed, one ``FaultEntry`` per line of the run's ``faults.jsonl``.

The injectors (``gameday.faults``, ``gameday.redis_faults``) write entries; the evidence
core (``gameday.evidence``) and the probes read them. Both import them from here, so the
core never imports the injectors. This module must never do I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from canary_contract.faults import FaultAction
from gameday.errors import GamedayError

# The ledger's ``component`` for the shared dependency (Redis) the dependency injector harms.
DEPENDENCY_ROLE = "redis"


class FaultError(GamedayError, RuntimeError, ValueError):
    """A fault could not be injected or cleared, or its arguments are wrong; the message
    names the replica or the argument."""


@dataclass
class FaultEntry:
    # Always a FaultAction once built; a str is taken (and checked) for callers that have
    # not switched to the enum yet.
    action: FaultAction | str
    time: float
    component: str
    replica: str
    url: str
    kind: str
    fault_id: str | None = None
    ttl_s: float | None = None
    # The fault's settings and what its injector saw (the kill's PID, the rollout's times);
    # their keys differ per kind, and the readers narrow them.
    params: Mapping[str, object] = field(default_factory=dict)
    detail: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.action = FaultAction(self.action)
        except ValueError:
            raise FaultError(
                f"fault ledger entry: action {self.action!r} is not one of "
                f"{', '.join(a.value for a in FaultAction)}"
            ) from None

    def cleared(self, detail: Mapping[str, object]) -> FaultEntry:
        """The ledger's record that this injection was cleared now, with ``detail``."""
        return FaultEntry(
            action=FaultAction.CLEAR,
            time=time.time(),
            component=self.component,
            replica=self.replica,
            url=self.url,
            kind=self.kind,
            fault_id=self.fault_id,
            detail=detail,
        )
