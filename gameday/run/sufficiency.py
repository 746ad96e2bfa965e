"""Could the gate have seen? The evidence behind a verdict (issue #14, items 5 and 6).

A gate that saw too little proves nothing either way: such an experiment is
``inconclusive`` (``gameday run`` exits 3), never a pass. Two sources, both in the
experiment's folder: ``gate-evidence.json`` (``write_gate_evidence``) and ``load.json``
(``load_reasons``). This module reads and writes only the experiment's folder and the
gate's status page.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import requests

from gameday.api import ApiError, StackApi
from gameday.atomic import write_json
from gameday.faults import FaultLedger
from gameday.sessions import given_or_own
from gameday.targets import Target, TargetError

GATE_EVIDENCE_NAME = "gate-evidence.json"
GATE_START_NAME = "gate-evidence-start.json"  # the counters before chaos started
ENV_MIN_COMPARISONS = "GAMEDAY_MIN_COMPARISONS"
ENV_MIN_CANARY_OUTCOMES = "GAMEDAY_MIN_CANARY_OUTCOMES"
DEFAULT_MIN_COMPARISONS = 30
DEFAULT_MIN_CANARY_OUTCOMES = 10
MAX_THRESHOLD = 10**9
_BOUND = re.compile(r"^(\d+)(k?)$")


@dataclass(frozen=True)
class Thresholds:
    """The minimum evidence per experiment (with environment overrides, ``thresholds``).

    Defaults from what runs produce at 5 % canary on the 2-core dev machine: a shortened
    control (10 users, 9 s of method, tests/test_inconclusive_run.py) gave the gate 55
    baseline-canary comparisons (28 of them in ``2k-4k`` and ``4k+``) and 19 canary
    outcomes; the default control (16 users, 30 s) gives about five times that. The
    defaults sit well below both, so only a run that starved the gate is inconclusive:
    ``min_comparisons`` (``GAMEDAY_MIN_COMPARISONS``, 30) and ``min_canary_outcomes``
    (``GAMEDAY_MIN_CANARY_OUTCOMES``, 10).

    ``min_comparisons`` counts baseline-canary comparisons in the buckets that matter: for
    a faulty kernel the buckets holding prompts at or above its ``min_prompt_tokens``, else
    every bucket. ``min_canary_outcomes`` counts the canary's outcome records (traffic the
    router gave the canary; pinned requests are never gate evidence).
    """

    min_comparisons: int = DEFAULT_MIN_COMPARISONS
    min_canary_outcomes: int = DEFAULT_MIN_CANARY_OUTCOMES

    def to_json(self) -> dict[str, int]:
        return {
            "min_comparisons": self.min_comparisons,
            "min_canary_outcomes": self.min_canary_outcomes,
        }


def as_whole_number(value: Any) -> Any:
    """``value`` as an int when it spells one (" 20 ", 20.0), else as given (stripped), for
    the caller's own range check and message; a bool stays a bool."""
    if isinstance(value, str):
        value = value.strip()
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _threshold(name: str, value: Any, source: str) -> int:
    value = as_whole_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THRESHOLD:
        raise ValueError(
            f"{source}: {name} must be a whole number from 0 to {MAX_THRESHOLD}, got {value!r}"
        )
    return value


def thresholds(
    min_comparisons: Any = None,
    min_canary_outcomes: Any = None,
    environ: Mapping[str, str] = os.environ,
) -> Thresholds:
    """Arguments (the experiment's configuration) win; then the environment; then the
    defaults. ValueError naming the input when one is not a whole number in range."""
    out: dict[str, int] = {}
    for name, given, env, default in (
        ("min_comparisons", min_comparisons, ENV_MIN_COMPARISONS, DEFAULT_MIN_COMPARISONS),
        (
            "min_canary_outcomes",
            min_canary_outcomes,
            ENV_MIN_CANARY_OUTCOMES,
            DEFAULT_MIN_CANARY_OUTCOMES,
        ),
    ):
        if given is not None:
            out[name] = _threshold(name, given, "the experiment's argument")
        elif environ.get(env, "").strip():
            out[name] = _threshold(name, environ[env], f"${env}")
        else:
            out[name] = default
    return Thresholds(**out)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if math.isfinite(value) and value > 0 else 0


def _counter(bucket: object, key: str) -> int:
    """A bucket's counter ``key`` (0 when the bucket is not a JSON object)."""
    return _count(bucket.get(key)) if isinstance(bucket, dict) else 0


def bucket_range(label: str) -> tuple[int, int | None] | None:
    """``"2k-4k"`` -> (2048, 4096), ``"4k+"`` -> (4096, None), ``"0-512"`` -> (0, 512)."""

    def bound(text: str) -> int | None:
        m = _BOUND.match(text.strip())
        if not m:
            return None
        return int(m.group(1)) * (1024 if m.group(2) else 1)

    if label.endswith("+"):
        lo = bound(label[:-1])
        return None if lo is None else (lo, None)
    parts = label.split("-")
    if len(parts) != 2:
        return None
    lo, hi = bound(parts[0]), bound(parts[1])
    return None if lo is None or hi is None else (lo, hi)


def buckets_at_or_above(labels: list[str], min_prompt_tokens: int) -> list[str]:
    """The buckets that hold prompts of at least ``min_prompt_tokens`` tokens (a label
    that cannot be read counts: fail-closed, it may hold such prompts)."""
    out = []
    for label in labels:
        r = bucket_range(label)
        if r is None or r[1] is None or r[1] > min_prompt_tokens:
            out.append(label)
    return out


class BucketCounts(TypedDict):
    """One bucket's counters in ``gate-evidence.json``."""

    comparisons: int
    noise_comparisons: int
    canary_outcomes: int
    baseline_outcomes: int


class GateSummary(TypedDict):
    """What ``gate-evidence.json`` keeps of the gate's status (its values as the gate
    gave them, the counters summed per bucket)."""

    state: object
    phase: object
    canary_version: object
    canary_weight: object
    resets: object
    buckets: dict[str, BucketCounts]
    comparisons: int
    canary_outcomes: int
    noise_floor: dict[str, object] | None  # the gate's noise floor per scope


class GateStamp(TypedDict, total=False):
    """What the written documents add to a read: when (``gate-evidence-start.json`` and
    ``gate-evidence.json``), and who read it against which thresholds (the latter)."""

    read_at: float
    source: str
    thresholds: dict[str, int]


class GateRead(GateSummary, GateStamp):
    ok: Literal[True]
    url: str


class GateUnread(GateStamp):
    ok: Literal[False]
    url: str
    error: str


def summarise_gate(state: Mapping[str, object]) -> GateSummary:
    """The counters of the gate's status that the evidence needs, per bucket."""
    buckets: dict[str, BucketCounts] = {}
    raw = state.get("buckets")
    for label, b in (raw if isinstance(raw, dict) else {}).items():
        b = b if isinstance(b, dict) else {}
        found = b.get("outcomes")
        outcomes: Mapping[str, object] = found if isinstance(found, dict) else {}
        buckets[str(label)] = {
            "comparisons": _count(b.get("comparisons")),
            "noise_comparisons": _count(b.get("noise_comparisons")),
            "canary_outcomes": _count(outcomes.get("canary")),
            "baseline_outcomes": _count(outcomes.get("baseline")),
        }
    noise_floor = state.get("noise_floor")
    return {
        "state": state.get("state"),
        "phase": state.get("phase"),
        "canary_version": state.get("canary_version"),
        "canary_weight": state.get("canary_weight"),
        "resets": state.get("resets"),
        "buckets": buckets,
        "comparisons": sum(b["comparisons"] for b in buckets.values()),
        "canary_outcomes": sum(b["canary_outcomes"] for b in buckets.values()),
        # The noise floor the gate measured per scope (the report shows it, #14).
        "noise_floor": noise_floor if isinstance(noise_floor, dict) else None,
    }


def read_gate(target: Target, session: requests.Session | None = None) -> GateRead | GateUnread:
    """The gate's counters now: ``{"ok": True, ...summarise_gate}`` or ``{"ok": False,
    "error": why}`` (never raises). Over ``session`` when given, else one of its own."""
    url = "?"
    try:
        with given_or_own(session) as http:
            api = StackApi(http, target)
            url = api.gate().where()
            state = api.gate_state()
    except ApiError as exc:
        error = str(exc) if exc.status else f"cannot read the gate at {url}: {exc}"
        return {"ok": False, "url": url, "error": error}
    except TargetError as exc:
        return {"ok": False, "url": url, "error": f"cannot read the gate at {url}: {exc}"}
    return {"ok": True, "url": url, **summarise_gate(state)}


def since_start(
    end: Mapping[str, object], start: Mapping[str, object] | None
) -> Mapping[str, object]:
    """The counters this experiment added: ``end`` minus ``start`` per bucket, when both
    were read and the gate did not reset in between; else ``end`` as it is.

    The gate's counters run since its canary version was set, so on a stack that outlives
    one experiment (a target the run did not start) they hold earlier experiments' samples
    too: ``gameday run`` reads them before ``chaos run`` starts
    (``gate-evidence-start.json``) and the evidence is the difference, unless the gate
    reset in between (a new canary version), when the end's counters are all this
    experiment's.
    """
    if not (end.get("ok") is True and start and start.get("ok") is True):
        return end
    same = all(start.get(k) == end.get(k) for k in ("canary_version", "resets"))
    if not same:
        return {**end, "counted_from": "the gate reset during the experiment: its counters are all"}
    buckets: dict[str, dict[str, int]] = {}
    before = start.get("buckets")
    before = before if isinstance(before, dict) else {}
    raw = end.get("buckets")
    for label, b in (raw if isinstance(raw, dict) else {}).items():
        b0 = (before or {}).get(label)
        b0 = b0 if isinstance(b0, dict) else {}
        b = b if isinstance(b, dict) else {}
        buckets[label] = {k: max(0, _count(v) - _count(b0.get(k))) for k, v in b.items()}
    return {
        **end,
        "buckets": buckets,
        "comparisons": sum(b.get("comparisons", 0) for b in buckets.values()),
        "canary_outcomes": sum(b.get("canary_outcomes", 0) for b in buckets.values()),
        "counted_from": "counters read before chaos started were subtracted",
        "at_start": {k: start.get(k) for k in ("comparisons", "canary_outcomes")},
    }


def write_gate_start(
    target: Target, folder: Path, session: requests.Session | None = None
) -> GateRead | GateUnread:
    """Before chaos starts: the gate's counters now, into ``gate-evidence-start.json``."""
    doc = read_gate(target, session)
    doc["read_at"] = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / GATE_START_NAME).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def write_gate_evidence(
    target: Target,
    folder: Path,
    limits: Thresholds,
    source: str,
    session: requests.Session | None = None,
) -> GateRead | GateUnread:
    """Read the gate and write ``gate-evidence.json`` into ``folder``; returns the document.

    The gate's own counters (``GET /v1/gate/<release>``, over HTTP only, as against any
    deployment), read at the end of the method by the probe
    ``probes.evidence.gate_evidence``, or by ``gameday run`` right after ``chaos run`` when
    the experiment has no such probe (the counters live until a new canary version).
    """
    doc = read_gate(target, session)
    doc["read_at"] = time.time()
    doc["source"] = source
    doc["thresholds"] = limits.to_json()
    write_json(folder / GATE_EVIDENCE_NAME, doc)
    return doc


def kernel_min_prompt_tokens(folder: Path) -> int | None:
    """The faulty kernel's threshold from the run's ledger (None: no kernel fault)."""
    try:
        entries = FaultLedger(folder / "faults.jsonl").entries()
    except (OSError, ValueError):
        return None
    for e in entries:
        if e.action == "inject" and e.kind == "kernel":
            value = (e.params or {}).get("min_prompt_tokens")
            return _count(value) if isinstance(value, int | float) else 0
    return None


def gate_reasons(
    doc: Mapping[str, object] | None,
    expect: object,  # the gameday extension's, as the journal has it
    tripped: bool,
    min_prompt_tokens: int | None,
) -> list[str]:
    """Why the gate could not have seen (empty: it could). ``doc`` is gate-evidence.json.

    A "no trip" with three shadow comparisons is no proof that the canary is healthy, and a
    missed trip with no comparison in the buckets the fault touches is no proof that the
    gate is broken. An experiment that expects a trip and got one needs no minimum (the
    gate saw); one that expects a trip and got none is inconclusive, not failed, when the
    fault's buckets had fewer comparisons than the minimum.
    """
    if expect not in ("trip", "no_trip") or (expect == "trip" and tripped):
        return []  # a blind-gate experiment judges blindness; a trip shows the gate saw
    if doc is None:
        return [
            f"no {GATE_EVIDENCE_NAME}: what the gate saw is unknown, so its "
            + ("missed trip" if expect == "trip" else "'no trip'")
            + " proves nothing"
        ]
    if doc.get("ok") is not True:
        return [
            f"the gate's counters could not be read ({doc.get('error')}): what it saw is unknown"
        ]
    found = doc.get("thresholds")
    given: Mapping[str, object] = found if isinstance(found, dict) else {}
    try:
        limits = thresholds(
            given.get("min_comparisons"), given.get("min_canary_outcomes"), environ={}
        )
    except ValueError as exc:
        return [f"{GATE_EVIDENCE_NAME} holds a bad threshold ({exc}): the evidence is unjudged"]
    raw = doc.get("buckets")
    buckets: dict[str, object] = raw if isinstance(raw, dict) else {}
    if min_prompt_tokens is not None:
        where = buckets_at_or_above(list(buckets), min_prompt_tokens)
        scope = (
            f"the buckets the faulty kernel touches (prompts >= {min_prompt_tokens} tokens: "
            f"{', '.join(where) or 'none'})"
        )
    else:
        where = list(buckets)
        scope = "all buckets"
    comparisons = sum(_counter(buckets.get(b), "comparisons") for b in where)
    canary = sum(_counter(b, "canary_outcomes") for b in buckets.values())
    reasons = []
    verb = "missed trip" if expect == "trip" else "'no trip'"
    if comparisons < limits.min_comparisons:
        reasons.append(
            f"the gate saw {comparisons} baseline-canary comparisons in {scope}, fewer than "
            f"the {limits.min_comparisons} needed ({ENV_MIN_COMPARISONS}): its {verb} "
            "proves nothing (more load, a higher canary weight or a longer run)"
        )
    if canary < limits.min_canary_outcomes:
        reasons.append(
            f"the gate saw {canary} canary outcomes, fewer than the "
            f"{limits.min_canary_outcomes} needed ({ENV_MIN_CANARY_OUTCOMES}): the canary "
            f"got too little traffic for its {verb} to mean anything"
        )
    return reasons


def load_reasons(load: Mapping[str, object] | None) -> list[str]:
    """Why the load generator's run says nothing about the gate (empty: it was valid).

    ``load.json`` holds Locust's summary with ``generator`` (``gameday.load.generator``): a
    generator short of CPU, late or below its target rate makes the run say nothing about
    the gate.
    """
    if not load or load.get("state") != "stopped":
        return []  # no load, or one that did not stop cleanly: the verdict fails on that
    summary = load.get("summary")
    gen = summary.get("generator") if isinstance(summary, dict) else None
    if not isinstance(gen, dict):
        return [
            "the load has no generator check (load.json summary.generator): whether Locust "
            "kept up is unknown"
        ]
    problems = gen.get("problems")
    if gen.get("valid") is True and not problems:
        return []
    listed = [str(p) for p in problems] if isinstance(problems, list) and problems else []
    return [f"the load generator is not valid: {p}" for p in listed] or [
        "the load generator is not valid (no reason recorded)"
    ]
