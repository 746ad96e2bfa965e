"""Did the gate have a noise floor of its own before the fault? (issue #14, item 5)

A faulty kernel judged against a floor of 0 tests nothing, and a control's "no trip"
against no floor shows no calibration: the gate must have measured the baseline-baseline
noise before the fault. ``probes.gate.wait_for_noise_floor`` waits for it and writes what
it found (``NOISE_WAIT_NAME`` in the run folder); ``noise_wait_reasons`` says why that
makes the experiment inconclusive. Pure: nothing here reads files or talks to a component.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, Required, TypedDict

__all__ = [
    "ALL_SCOPE",
    "DEFAULT_MIN_SAMPLES",
    "NOISE_WAIT_NAME",
    "ZERO_FLOOR_CHOICES",
    "ZERO_FLOOR_ENV",
    "FloorJson",
    "FloorReading",
    "NoiseWait",
    "floor_reading",
    "noise_wait_reasons",
    "unmeasured_message",
]

NOISE_WAIT_NAME = "noise-floor-wait.json"
ALL_SCOPE = "all"  # every bucket pooled: the floor a sparse bucket falls back to
DEFAULT_MIN_SAMPLES = 20  # the gate's --noise-min-samples default
# The experiments' zero_floor setting: "refuse" (the default) or "accept" a measured floor
# of exactly 0. Accept it only for an engine whose healthy replicas are bit-identical by
# nature (vLLM on a CPU, one OpenMP thread each: docs/engine.md, "vLLM"); the drift test's
# margin is then its tolerance alone, and the control experiment is what shows it holds.
ZERO_FLOOR_ENV = "GAMEDAY_ZERO_FLOOR"
ZERO_FLOOR_CHOICES = ("refuse", "accept")


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if math.isfinite(value) and value > 0 else 0


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


class FloorJson(TypedDict):
    """A ``FloorReading`` under its wire names (the release test's two only with it)."""

    samples: int
    source: str | None
    kl: float | None
    kl_mean: float | None
    noise_comparisons: int
    floor_state: NotRequired[str]
    gate_min_samples: NotRequired[int]


class NoiseWait(TypedDict, total=False):
    """``NOISE_WAIT_NAME``: what a wait for the noise floor found (``wait_record``), or
    that it does not apply to a foreign gate (``not_applicable``); the last reading's
    fields (``FloorJson``) with it, when there was one."""

    measured: Required[bool]
    waited_s: Required[float]
    min_samples: int
    read_at: float
    message: str
    not_applicable: str
    samples: int
    source: str | None
    kl: float | None
    kl_mean: float | None
    noise_comparisons: int
    floor_state: str
    gate_min_samples: int
    zero_floor: str


@dataclass(frozen=True)
class FloorReading:
    """The ``all`` scope's noise floor in one gate answer (``GET /v1/gate/<release>``).

    ``samples``: baseline-baseline comparisons in the floor's window; ``source``: the
    scope whose floor the gate uses (``"none"``: too few, the gate tests against 0);
    ``kl``: the floor (mean + 2 SE of their KL); ``noise_comparisons``: every
    baseline-baseline comparison the buckets counted. The fields are the wire names
    (``to_json``).
    """

    samples: int
    source: str | None
    kl: float | None
    kl_mean: float | None
    noise_comparisons: int
    # The release test's own word (``--test release-eprocess``): its floor's ``state``
    # (``too_few``, ``measured``: frozen at the next canary comparison, ``frozen``) and the
    # comparisons it needs; None under the default test.
    floor_state: str | None = None
    gate_min_samples: int | None = None

    def measured(self, min_samples: int, *, zero_ok: bool = False) -> bool:
        """A floor of the ``all`` scope's own, above 0 (a floor of exactly 0 is
        bit-identical replicas: nothing calibrated, unless ``zero_ok`` says the engine's
        replicas are bit-identical by nature, as vLLM's on a CPU are): under the release
        test, when the test says its floor is measured or frozen (its own count, which it
        freezes for the release, decides); else from at least ``min_samples``
        comparisons."""
        if self.kl is None or self.source != ALL_SCOPE or (self.kl <= 0 and not zero_ok):
            return False
        if self.floor_state is not None:
            return self.floor_state in ("measured", "frozen")
        return self.samples >= min_samples

    def to_json(self) -> FloorJson:
        out = FloorJson(
            samples=self.samples,
            source=self.source,
            kl=self.kl,
            kl_mean=self.kl_mean,
            noise_comparisons=self.noise_comparisons,
        )
        if self.floor_state is not None:
            out["floor_state"] = self.floor_state
        if self.gate_min_samples is not None:
            out["gate_min_samples"] = self.gate_min_samples
        return out


def floor_reading(state: Mapping[str, object]) -> FloorReading:
    """The ``all`` scope's floor from the gate's answer (missing fields read as none)."""
    floors = state.get("noise_floor")
    raw = floors.get(ALL_SCOPE) if isinstance(floors, dict) else None
    scope: Mapping[str, object] = raw if isinstance(raw, dict) else {}
    buckets = state.get("buckets")
    counted = sum(
        _count(b.get("noise_comparisons"))
        for b in (buckets.values() if isinstance(buckets, dict) else [])
        if isinstance(b, dict)
    )
    source = scope.get("source")
    floor_state = scope.get("state")
    return FloorReading(
        samples=_count(scope.get("samples")),
        source=source if isinstance(source, str) else None,
        kl=_figure(scope.get("kl")),
        kl_mean=_figure(scope.get("kl_mean")),
        noise_comparisons=counted,
        floor_state=floor_state if isinstance(floor_state, str) else None,
        gate_min_samples=_count(scope.get("min_samples")) if "min_samples" in scope else None,
    )


def wait_record(
    reading: FloorReading | None,
    min_samples: int,
    waited_s: float,
    read_at: float,
    message: str | None = None,
) -> NoiseWait:
    """What a wait for the noise floor found (``NOISE_WAIT_NAME`` in the run folder): the
    floor measured, or not with ``message`` saying why, and the last reading."""
    doc = NoiseWait(
        measured=message is None,
        min_samples=min_samples,
        waited_s=round(waited_s, 3),
        read_at=read_at,
    )
    if message is not None:
        doc["message"] = message
    if reading is not None:
        doc = {**doc, **reading.to_json()}
    return doc


def unmeasured_message(reading: FloorReading | None, min_samples: int, waited_s: float) -> str:
    """Why the floor is not measured after ``waited_s`` seconds, and what to do."""
    if reading is None:
        seen = "the gate could not be read"
    elif reading.floor_state == "too_few":
        seen = (
            f"the release test's '{ALL_SCOPE}' floor is still too_few: "
            f"{reading.samples} baseline-baseline comparisons of the "
            f"{reading.gate_min_samples} it needs to freeze one (the gate's "
            "--noise-min-samples)"
        )
    elif reading.samples >= min_samples and reading.source == ALL_SCOPE:
        seen = (
            f"the gate's floor is {reading.kl!r} over {reading.samples} baseline-baseline "
            "comparisons: bit-identical replicas (is the model servers' --batch-noise off? "
            f"An engine whose replicas are bit-identical by nature: {ZERO_FLOOR_ENV}=accept)"
        )
    else:
        seen = (
            f"the gate had {reading.samples} baseline-baseline comparisons in its "
            f"'{ALL_SCOPE}' noise floor (source {reading.source!r}), fewer than the "
            f"{min_samples} it needs (--noise-min-samples)"
        )
    return (
        f"no noise floor before the fault after waiting {waited_s:.1f} s: {seen}; a fault "
        "judged against a floor of 0 proves nothing, so this experiment cannot pass "
        "(give the load a longer warm-up (GAMEDAY_WARMUP_S, GAMEDAY_NOISE_WAIT_S) or send "
        "more baseline-baseline copies (the router's --shadow-noise-fraction))"
    )


def noise_wait_reasons(doc: Mapping[str, object] | None) -> list[str]:
    """Why the gate had no noise floor before the fault (empty: it had one, or the
    experiment did not wait for one). ``doc`` is ``NOISE_WAIT_NAME`` as the probe wrote it;
    one that cannot be read counts as unmeasured (fail-closed)."""
    if doc is None:
        return []
    if doc.get("measured") is True or doc.get("not_applicable"):
        return []  # (not applicable: a foreign gate has no noise floor the harness can read)
    message = doc.get("message")
    if isinstance(message, str) and message.strip():
        return [message]
    return [f"{NOISE_WAIT_NAME} does not say the noise floor was measured before the fault"]
