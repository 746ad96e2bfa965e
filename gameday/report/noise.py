"""The noise floor the gate measured in each experiment (issue #14, "Done when" item 1).

The figures are copied from the gate's own answer in ``gate-evidence.json``, never
recomputed, so the report shows exactly what the gate used. Must never show a floor it
does not have as a 0 (it says why), and never raise on what it finds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from canary_contract.json import record_json

NOISE_FILE = "gate-evidence.json"
ALL_SCOPE = "all"
NOT_MEASURED = "noise floor not measured"


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def _figure(value: object) -> float | None:
    """A finite number >= 0, else None (a bool, a string, NaN or a negative is no figure)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def show(value: float | int | None) -> str:
    """The gate's figure as the gate wrote it (no rounding of our own); None is '—'."""
    return "—" if value is None else str(value)


class ScopeNoiseJson(TypedDict):
    """One scope's floor in summary.json (``ScopeNoise``'s fields less ``problem``)."""

    scope: str
    noise_comparisons: int | None
    samples: int | None
    kl_mean: float | None
    kl_floor: float | None
    top1_floor: float | None
    source: str | None
    borrowed_from: str | None
    measured: bool
    text: str


class ExperimentNoiseJson(TypedDict):
    measured: bool
    reason: str | None
    text: str
    all: ScopeNoiseJson | None
    buckets: dict[str, ScopeNoiseJson]


class NoiseSectionJson(TypedDict):
    """summary.json's ``noise_floor``."""

    line: str
    measured: int
    experiments_count: int
    not_measured: list[str]
    experiments: dict[str, ExperimentNoiseJson]


@dataclass(frozen=True)
class ScopeNoise:
    """One scope's noise floor, as the gate reported it."""

    scope: str
    noise_comparisons: int | None  # the bucket's counter (``all``: the buckets' sum)
    samples: int | None  # baseline-baseline comparisons in the floor's window
    kl_mean: float | None  # their mean KL (nats)
    kl_floor: float | None  # what the drift test adds its tolerance to
    top1_floor: float | None
    source: str | None  # the scope whose floor is used ("none": no floor at all)
    borrowed_from: str | None
    problem: str = ""  # a field of the gate's answer that could not be read

    @property
    def measured(self) -> bool:
        """A floor of this scope's own, above 0."""
        return (
            not self.problem
            and bool(self.samples)
            and self.source == self.scope
            and self.kl_floor is not None
            and self.kl_floor > 0
        )

    def text(self) -> str:
        if self.problem:
            return f"{NOT_MEASURED} ({self.problem})"
        if not self.samples:
            if self.source in (None, "none", self.scope):
                return f"{NOT_MEASURED}: no baseline-baseline comparison"
            return f"{NOT_MEASURED} here: none of its own, uses {self.source}'s floor"
        if self.source == "none":
            return (
                f"{NOT_MEASURED}: {self.samples} baseline-baseline comparison(s), too few "
                "for a floor (the gate tests against none)"
            )
        if self.borrowed_from:
            seen = (
                f"mean KL {show(self.kl_mean)} over {self.samples}"
                if self.kl_mean
                else f"{self.samples} bit-identical comparison(s)"
            )
            used = f"floor {show(self.kl_floor)}" if self.kl_floor else f"floor: {NOT_MEASURED}"
            return f"{seen}, too few: uses {self.borrowed_from}'s {used}"
        if not self.measured:
            return (
                f"{NOT_MEASURED}: the floor is 0 over {self.samples} baseline-baseline "
                "comparisons (bit-identical replicas: is batch noise off?)"
            )
        return f"mean KL {show(self.kl_mean)} over {self.samples}, floor {show(self.kl_floor)}"

    def to_json(self) -> ScopeNoiseJson:
        # The problem is said in the text.
        return record_json(self, ScopeNoiseJson, text=self.text())


@dataclass(frozen=True)
class ExperimentNoise:
    """What the gate measured of the noise in one experiment.

    With batch noise on (every stack's model servers run with ``--batch-noise``), two
    healthy baseline replicas differ slightly, and the gate's drift test calibrates
    against that difference: per scope (a bucket, a tail, ``all``) the mean KL of the last
    baseline-baseline comparisons and the floor it tests against (mean + 2 SE), or another
    scope's floor when it has too few of its own; per bucket the gate also counts every
    baseline-baseline comparison it was sent.

    The floor is *measured* when the ``all`` scope (every bucket pooled, the floor a
    sparse bucket falls back to) has a floor of its own above 0. Anything else is said in
    ``reason``: no saved answer, a gate that could not be read, an answer without the
    noise floor, too few comparisons for a floor (the gate then tests against none), or a
    floor of exactly 0 (bit-identical replicas: batch noise off).
    """

    name: str
    reason: str  # why the floor is not measured (empty: it is)
    overall: ScopeNoise | None = None  # the ``all`` scope
    buckets: list[ScopeNoise] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return not self.reason

    def cell_text(self) -> str:
        """One line for the game day matrix's cell."""
        if not self.measured or self.overall is None:
            return NOT_MEASURED
        return f"noise KL {show(self.overall.kl_mean)} (n={self.overall.samples})"

    def text(self) -> str:
        if not self.measured or self.overall is None:
            return f"{NOT_MEASURED}: {self.reason}"
        o = self.overall
        return (
            f"noise floor {show(o.kl_floor)} (mean baseline-baseline KL {show(o.kl_mean)} "
            f"over {o.samples} comparisons)"
        )

    def to_json(self) -> ExperimentNoiseJson:
        return {
            "measured": self.measured,
            "reason": self.reason or None,
            "text": self.text(),
            "all": None if self.overall is None else self.overall.to_json(),
            "buckets": {b.scope: b.to_json() for b in self.buckets},
        }


def _scope(
    label: str, floor: object, bucket: Mapping[str, object] | None, *, is_bucket: bool
) -> ScopeNoise:
    problems = []
    raw: Mapping[str, object] = floor if isinstance(floor, dict) else {}
    if not isinstance(floor, dict):
        problems.append(f"noise_floor.{label} is missing")
    counter = None
    if is_bucket:
        counter = _count((bucket or {}).get("noise_comparisons"))
        if counter is None:
            problems.append(f"buckets.{label}.noise_comparisons is not a whole number >= 0")
    samples = _count(raw.get("samples"))
    kl_mean, kl_floor, top1 = (_figure(raw.get(k)) for k in ("kl_mean", "kl", "top1_disagreement"))
    if raw:
        for key, value in (("samples", samples), ("kl_mean", kl_mean), ("kl", kl_floor)):
            if value is None:
                problems.append(f"noise_floor.{label}.{key} is not a number >= 0")
    source = raw.get("source")
    borrowed = raw.get("borrowed_from")
    return ScopeNoise(
        scope=label,
        noise_comparisons=counter,
        samples=samples,
        kl_mean=kl_mean,
        kl_floor=kl_floor,
        top1_floor=top1,
        source=source if isinstance(source, str) else None,
        borrowed_from=borrowed if isinstance(borrowed, str) else None,
        problem="; ".join(problems),
    )


def experiment_noise(name: str, folder: Path) -> ExperimentNoise:
    """The noise floor from ``folder/gate-evidence.json`` (or why there is none): the
    gate's answer (``GET /v1/gate/<release>``) saved at the end of the experiment by
    ``gameday.run.sufficiency``, read at ``buckets.<b>.noise_comparisons`` and
    ``noise_floor.<scope>``."""
    path = folder / NOISE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except FileNotFoundError:
        return ExperimentNoise(name, f"no {NOISE_FILE}: the gate's answer was not saved")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return ExperimentNoise(name, f"{NOISE_FILE} could not be read ({exc})")
    if not isinstance(doc, dict):
        return ExperimentNoise(name, f"{NOISE_FILE} is not a JSON object")
    if doc.get("ok") is False:
        return ExperimentNoise(name, f"the gate could not be read ({doc.get('error') or '?'})")
    floors = doc.get("noise_floor")
    if not isinstance(floors, dict):
        return ExperimentNoise(
            name,
            f"{NOISE_FILE} holds no noise_floor (the gate's answer was saved without it)",
        )
    raw_buckets = doc.get("buckets")
    buckets: Mapping[str, object] = raw_buckets if isinstance(raw_buckets, dict) else {}
    per_bucket = [
        _scope(str(label), floors.get(label), b if isinstance(b, dict) else None, is_bucket=True)
        for label, b in buckets.items()
    ]
    if ALL_SCOPE not in floors:
        return ExperimentNoise(
            name, f"the gate's noise_floor has no '{ALL_SCOPE}' scope", None, per_bucket
        )
    overall = _scope(ALL_SCOPE, floors[ALL_SCOPE], None, is_bucket=False)
    counters = [b.noise_comparisons for b in per_bucket]
    if counters and all(c is not None for c in counters):  # every bucket's, pooled
        overall = replace(overall, noise_comparisons=sum(c for c in counters if c is not None))
    if overall.measured:
        reason = ""
    elif overall.problem:
        reason = f"the gate's answer cannot be read: {overall.problem}"
    else:
        reason = overall.text().removeprefix(f"{NOT_MEASURED}: ")
    return ExperimentNoise(name, reason, overall, per_bucket)


def noise_section(noise: list[ExperimentNoise]) -> NoiseSectionJson:
    """summary.json's ``noise_floor``: the game day's line and each experiment's floor."""
    measured = [n for n in noise if n.measured]
    return {
        "line": f"noise floor > 0 in {len(measured)}/{len(noise)} experiments",
        "measured": len(measured),
        "experiments_count": len(noise),
        "not_measured": [n.name for n in noise if not n.measured],
        "experiments": {n.name: n.to_json() for n in noise},
    }
