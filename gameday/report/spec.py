"""The experiment's ``gameday`` extension (§7.1): what it expects, read fail-closed.

Must never guess an expectation: without a valid ``expect`` the verdict fails (a
``Missing`` that fails it), and a folder name only places an experiment in the matrix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from canary_contract.json import JsonValue
from gameday.report.missing import Missing


def as_dict(value: object) -> Mapping[str, object]:
    """``value`` when it is a JSON object, else an empty one (input is never trusted)."""
    return value if isinstance(value, dict) else {}


@dataclass
class GamedaySpec:
    """The experiment's ``gameday`` extension: what it expects (§7.1)."""

    component: str | None
    fault: str | None
    expect: str | None  # "trip" | "no_trip" | "blind" | "colour_lost"
    slo: dict[str, float]
    drift_kl: float | None
    notes: list[str] = field(default_factory=list)
    from_extension: bool = True
    lost_at: str | None = None  # expect colour_lost: the hop that drops the colour


_NAME_FAULTS = (
    "faulty-kernel",
    "broken-kernel",
    "pod-kill",
    "latency",
    "client-flood",
    "pins-after-trip",
    "wrong-credential",
    "benign-noise",
    "small-drift",
)
_NAME_COMPONENTS = ("router", "broker", "rollback", "hostile", "control")


def spec_from_name(name: str) -> GamedaySpec:
    """Where an experiment sits in the matrix when only its folder name is known."""
    low = name.lower()
    component = next((c for c in _NAME_COMPONENTS if c in low), None)
    fault = next((f for f in _NAME_FAULTS if f in low), None)
    if component == "control":
        fault = "none"
    return GamedaySpec(
        component=component,
        fault=fault,
        expect=None,
        slo={},
        drift_kl=None,
        notes=["placed by its folder name: no gameday extension was read"],
        from_extension=False,
    )


def spec_from_definition(
    definition: Mapping[str, object] | None, name: str, missing: list[Missing]
) -> GamedaySpec:
    ext = None
    if definition is not None:
        # as decoded, iterated as it always was (a number or true there raises)
        extensions: JsonValue = definition.get("extensions")
        for item in extensions or []:
            if isinstance(item, dict) and item.get("name") == "gameday":
                ext = item
                break
    if ext is None:
        if definition is not None:
            missing.append(
                Missing(
                    name,
                    "gameday extension",
                    "absent from the experiment",
                    "the report cannot tell whether a trip was expected",
                    True,
                )
            )
        return spec_from_name(name)
    config = definition.get("configuration") if isinstance(definition, dict) else None
    notes: list[str] = []
    slo: dict[str, float] = {}
    raw_slo = as_dict(ext.get("slo"))
    for key, value in raw_slo.items():
        number = _resolve_number(value, config)
        if number is None:
            notes.append(f"slo.{key} = {value!r} is not a number: the default is used")
        else:
            slo[str(key)] = number
    drift = _resolve_number(ext.get("drift_kl", raw_slo.get("drift_kl")), config)
    expect = ext.get("expect")
    if expect not in ("trip", "no_trip", "blind", "colour_lost"):
        missing.append(
            Missing(
                name,
                "gameday extension",
                f"expect is {expect!r}, not trip|no_trip|blind|colour_lost",
                "the report cannot tell whether a trip was expected",
                True,
            )
        )
        expect = None
    return GamedaySpec(
        component=ext.get("component") if isinstance(ext.get("component"), str) else None,
        fault=ext.get("fault") if isinstance(ext.get("fault"), str) else None,
        expect=expect,
        lost_at=ext.get("lost_at") if isinstance(ext.get("lost_at"), str) else None,
        slo=slo,
        drift_kl=drift,
        notes=notes,
    )


_VAR = re.compile(r"^\$\{([^}]+)\}$")


def _resolve_number(value: object, configuration: object) -> float | None:
    """A number, a numeric string, or ``${key}`` from the experiment's configuration.

    The journal keeps the experiment as written, so ``${detection_s}`` arrives
    unsubstituted; an ``env`` entry resolves to its default (the environment of the run
    is not recorded).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    match = _VAR.match(value.strip())
    if match and isinstance(configuration, dict):
        entry = configuration.get(match.group(1))
        if isinstance(entry, dict):
            entry = entry.get("default")
        return _resolve_number(entry, None)
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
