"""The ``gameday`` extension of a Chaos Toolkit experiment: what the experiment breaks,
what the gate must do about it and the SLOs its probes check::
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from canary_contract._record import Number, Record, Text
from canary_contract.json import JsonObject

EXTENSION_NAME = "gameday"
_VAR = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")


class Expect(enum.StrEnum):
    TRIP = "trip"  # the gate must trip the canary
    NO_TRIP = "no_trip"  # the gate must leave the canary alone
    BLIND = "blind"  # a fault the gate cannot see, by design: the blind finding is expected
    COLOUR_LOST = "colour_lost"  # a hop drops the traffic colour: the probe names it (lost_at)


class TargetKind(enum.StrEnum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


class GamedayExtension(Record):
    """The extension as an experiment file writes it::

    extensions:
    - name: gameday
      component: router
      fault: latency
      expect: no_trip        # trip | no_trip | blind | colour_lost (with lost_at: HOP)
      slo:
        ttft_p99_s: ${ttft_p99_s}   # a number, or ${key} of the configuration
      target: kubernetes     # optional: the experiment needs this target kind
      requires: [pins]       # optional: capabilities the target must have
    """

    name: Literal["gameday"]
    component: Annotated[Text, Field(min_length=1)]
    fault: Annotated[Text, Field(min_length=1)]
    expect: Expect
    slo: dict[str, Number | Text] = Field(default_factory=dict)
    drift_kl: Number | Text | None = None
    target: TargetKind | None = None
    lost_at: Text | None = None  # expect colour_lost: the hop that drops the colour
    # Capabilities the target must have beyond what the method's activities show
    # (gameday.run.capabilities: a target without one gets "not applicable").
    requires: list[Text] | None = None

    omitted_when_none = frozenset({"drift_kl", "target", "lost_at", "requires"})

    @field_validator("slo")
    @classmethod
    def _numbers_or_references(cls, slo: dict[str, float | str]) -> dict[str, float | str]:
        for key, value in slo.items():
            if isinstance(value, str) and not _VAR.match(value.strip()):
                raise ValueError(
                    f"slo.{key} is {value!r}: give a number or ${{key}} naming an entry of "
                    "the experiment's configuration"
                )
        return slo

    @model_validator(mode="after")
    def _lost_at_with_colour_lost(self) -> GamedayExtension:
        if (self.expect is Expect.COLOUR_LOST) != (self.lost_at is not None):
            raise ValueError(
                "expect colour_lost goes with lost_at (the hop that drops the colour, e.g. "
                "lost_at: router), and lost_at only with expect colour_lost"
            )
        return self


def gameday_extension(experiment: JsonObject) -> GamedayExtension | None:
    """The experiment's ``gameday`` extension, None when it has none; ``ContractError``
    naming the field when it has a wrong one."""
    extensions = experiment.get("extensions")
    if not isinstance(extensions, list):
        return None
    for item in extensions:
        if isinstance(item, dict) and item.get("name") == EXTENSION_NAME:
            return GamedayExtension.from_wire(item)
    return None
