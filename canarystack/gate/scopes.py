"""The gate's scopes (a bucket, or a tail pooling the buckets at or above an edge) and
what one ingestion or alarm carries between them and ``ReleaseGate``.

A ``DriftScope`` holds the drift detectors and the live noise floor of a bucket or tail;
a ``BucketScope`` the counters, reference windows, latency and error detectors of one
bucket, and the colours of its most recent coloured canary samples (bounded), the
examples a trip's evidence names.

This module must never do I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from canary_contract.json import record_json
from canarystack.gate.samples import Comparison, Outcome
from canarystack.gate.stats import ECusum, MeanWindow, TimeWindow

ALL_SCOPE = "all"
# Colours kept per bucket and kind of sample (the most recent ones); a trip's evidence
# carries at most the contract's MAX_TRIP_COLOURS of them.
COLOURS_PER_BUCKET = 16


def tail_label(bucket: str) -> str:
    """``"2k-4k"`` -> ``"2k+"`` (the tail that starts at this bucket)."""
    return bucket.split("-", 1)[0].rstrip("+") + "+"


def drift_scopes(labels: Sequence[str], pool_tails: bool) -> list[tuple[str, tuple[str, ...]]]:
    """(name, member buckets) of every drift scope, in order: each bucket, then (with
    ``pool_tails``) each tail that pools more than one bucket, then ``all``. ``all`` is
    always there (a sparse bucket's noise floor falls back to it) but its detectors run
    only when tails are pooled (``tested_scopes``)."""
    scopes: list[tuple[str, tuple[str, ...]]] = [(b, (b,)) for b in labels]
    if pool_tails:
        # Tails that pool more than one bucket (the last bucket's tail is itself).
        for i in range(1, len(labels) - 1):
            scopes.append((tail_label(labels[i]), tuple(labels[i:])))
    scopes.append((ALL_SCOPE, tuple(labels)))
    return scopes


def tested_scopes(labels: Sequence[str], pool_tails: bool) -> dict[str, tuple[str, ...]]:
    """The drift scopes whose detectors run (``all`` only when tails are pooled)."""
    return {
        name: members
        for name, members in drift_scopes(labels, pool_tails)
        if pool_tails or name != ALL_SCOPE
    }


@dataclass
class DriftScope:
    """Drift detectors and the live noise floor of one bucket or tail."""

    name: str
    members: tuple[str, ...]
    kl: ECusum
    top1: ECusum
    noise_kl: MeanWindow
    noise_top1: MeanWindow
    comparisons: int = 0
    fallbacks: int = 0  # comparisons tested against a borrowed floor (this canary)


@dataclass
class BucketScope:
    """Counters, reference windows and the latency and error detectors of one bucket."""

    name: str
    latency: ECusum
    errors: ECusum
    baseline_ttft: TimeWindow
    baseline_errors: TimeWindow
    comparisons: int = 0
    noise_comparisons: int = 0
    # Canary outcomes not tested for errors during a shared error surge (detect.error_surge).
    error_surge_skips: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"baseline": 0, "canary": 0})
    errors_seen: dict[str, int] = field(default_factory=lambda: {"baseline": 0, "canary": 0})
    # The colours of the most recent coloured canary samples, by kind ("comparison": a
    # baseline-canary comparison tested, "outcome": a canary outcome, "error": a canary
    # outcome with an error), as (sample time, colour record); bounded.
    colours: dict[str, deque[tuple[float, dict[str, str | None]]]] = field(
        default_factory=lambda: {
            kind: deque(maxlen=COLOURS_PER_BUCKET) for kind in ("comparison", "outcome", "error")
        }
    )

    def keep_colour(self, kind: str, sample: Comparison | Outcome) -> None:
        record = sample.colour_record()
        if record is not None:
            self.colours[kind].append((sample.time, record))


@dataclass
class Alarm:
    """A detector that reached its threshold, with what the evidence needs."""

    test: Literal["drift", "latency", "errors"]
    scope: str
    bucket: str
    detector: ECusum
    detail: dict[str, object]
    colours: list[dict[str, str | None]] = field(default_factory=list)


class IngestedJson(TypedDict):
    """A batch's (or the gate's total) counts as ``/v1/gate`` and ``/v1/samples`` show them."""

    comparisons: int
    noise_comparisons: int
    outcomes: int
    ignored: dict[str, int]
    duplicate: bool


@dataclass
class Ingested:
    comparisons: int = 0
    noise_comparisons: int = 0
    outcomes: int = 0
    ignored: dict[str, int] = field(default_factory=dict)
    duplicate: bool = False

    def ignore(self, reason: str, n: int = 1) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + n

    def to_json(self) -> IngestedJson:
        return record_json(self, IngestedJson, ignored=dict(self.ignored))
