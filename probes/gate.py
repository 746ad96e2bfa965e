"""Chaos Toolkit probes of the canary gate: did it trip, how long after the fault, and did
it have a noise floor before the fault.

They only read the broker and the gate (``wait_for_noise_floor`` also writes what it
found into the run folder).
"""

from __future__ import annotations

import time

from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from canary_contract.phases import is_canary_off
from gameday.api import ApiError, StackApi
from gameday.evidence.events import first_phase
from gameday.evidence.milestones import CLOCK_SLACK_S
from gameday.evidence.noise_floor import (
    DEFAULT_MIN_SAMPLES,
    NOISE_WAIT_NAME,
    ZERO_FLOOR_CHOICES,
    ZERO_FLOOR_ENV,
    FloorReading,
    NoiseWait,
    floor_reading,
    unmeasured_message,
    wait_record,
)
from gameday.evidence.trips import not_tripped_yet, seconds_to_trip, unexpected_trip, wrong_test
from gameday.run.sufficiency import as_whole_number
from probes._context import (
    MAX_WAIT_S,
    Configuration,
    deadline_after,
    positive,
    release_phase_now,
    stack_api,
    write_run_json,
)
from probes._run_records import experiment_began, reference

__all__ = [
    "gate_did_not_trip",
    "routers_fail_safe_without_gate",
    "wait_for_noise_floor",
    "wait_for_trip",
]

GATE_GONE_FILE = "routers_without_gate.json"


def gate_summary(api: StackApi) -> str:
    """One line on what the gate has seen (best effort, for failure messages); a foreign
    gate: what its observer sees."""
    return api.gate().summary(api.session)


def wait_for_trip(
    deadline_s: float = 30.0,
    poll_s: float = 0.1,
    test: str = "",
    configuration: Configuration | None = None,
) -> float:
    """Wait until the gate has tripped the release; returns the seconds from the
    reference fault to the trip. Raises after ``deadline_s`` seconds of waiting, and, with
    ``test`` (e.g. ``drift``: a bad build must be caught on its answers, not on latency
    by luck), when the trip event names another test or none.

    The seconds are from the experiment's reference fault (``gameday.evidence.faults``) to
    the broker event that set the phase to ``tripped``; it gives up at its deadline, because
    Chaos Toolkit does not time out Python activities::

        - type: probe
          name: gate-trips
          provider: {type: python, module: probes.gate, func: wait_for_trip,
                     arguments: {deadline_s: 20}}
    """
    deadline = deadline_after(deadline_s)
    fault = reference(configuration)
    if fault is None:
        raise ActivityFailed(
            "expected a fault in this run's ledger to time the trip from, found none: "
            "inject one (probes.faults) before waiting for the trip"
        )
    with stack_api(configuration, "waiting for the gate to trip") as api:
        while not is_canary_off(phase := release_phase_now(api)):
            if time.monotonic() >= deadline:
                release, now, gate = api.target.release, time.time(), gate_summary(api)
                raise ActivityFailed(not_tripped_yet(deadline_s, release, phase, fault, now, gate))
            time.sleep(max(0.02, float(poll_s)))
        trip = first_phase(api.events(), "tripped", since=fault.time - CLOCK_SLACK_S)
    took = seconds_to_trip(trip, fault.time, time.time())
    why = wrong_test(trip, test, took)
    if why:
        raise ActivityFailed(why)
    return took


def gate_did_not_trip(
    observe_s: float = 0.0,
    poll_s: float = 0.5,
    configuration: Configuration | None = None,
) -> bool:
    """True when the release stayed untripped for ``observe_s`` seconds (and no trip
    happened since the experiment's load started); raises at the first trip.

    The error names the gate's evidence for the trip.
    """
    end = deadline_after(observe_s)
    fault, since = reference(configuration), experiment_began(configuration)
    fault_time = None if fault is None else fault.time
    with stack_api(configuration, "watching the gate") as api:
        while True:
            phase = str(api.release().get("phase"))
            trip = first_phase(api.events(), "tripped", since=since)
            why = unexpected_trip(api.target.release, phase, trip, fault_time)
            if why:
                raise ActivityFailed(why)
            if time.monotonic() >= end:
                return True
            time.sleep(max(0.05, float(poll_s)))


def _min_samples(value: object) -> int:
    value = as_whole_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**6:
        raise ActivityFailed(
            "argument min_samples must be a whole number from 1 to 1000000 (the gate's "
            f"--noise-min-samples), got {value!r}"
        )
    return value


def _zero_floor(value: object) -> bool:
    if value not in ZERO_FLOOR_CHOICES:
        raise ActivityFailed(
            f"argument zero_floor must be one of {', '.join(ZERO_FLOOR_CHOICES)} "
            f"({ZERO_FLOOR_ENV}), got {value!r}: 'accept' only for an engine "
            'whose healthy replicas are bit-identical by nature (docs/engine.md, "vLLM")'
        )
    return value == "accept"


def wait_for_noise_floor(
    deadline_s: float = 30.0,
    poll_s: float = 0.5,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    zero_floor: str = "refuse",
    configuration: Configuration | None = None,
) -> NoiseWait:
    """Wait until the gate's ``all`` noise floor is its own (``min_samples``
    baseline-baseline comparisons, the gate's ``--noise-min-samples``) and above 0;
    returns ``{"measured": True, "samples", "kl", "kl_mean", "waited_s", ...}``.
    ``zero_floor: accept`` (``GAMEDAY_ZERO_FLOOR=accept``) takes a floor of exactly 0 as
    measured, for an engine whose healthy replicas are bit-identical by nature (vLLM on a
    CPU); the record then says ``zero_floor: accepted``.

    Put it just before the fault, after the load's warm-up: a faulty kernel judged against
    a floor of 0 tests nothing, and a control's "no trip" must come with a gate that had
    calibrated. What it found goes to ``noise-floor-wait.json`` in the run folder (the
    verdict's evidence, ``gameday.evidence.noise_floor``). At the deadline it raises
    ``ActivityFailed`` naming the count, the minimum and what to do; it never passes
    quietly::

        - type: probe
          name: gate-has-a-noise-floor
          provider: {type: python, module: probes.gate, func: wait_for_noise_floor,
                     arguments: {deadline_s: "${noise_wait_s}"}}
    """
    wait_s = positive("deadline_s", deadline_s, MAX_WAIT_S)
    every_s = positive("poll_s", poll_s, 60.0)
    need = _min_samples(min_samples)
    zero_ok = _zero_floor(zero_floor)
    start = time.monotonic()
    reading: FloorReading | None = None
    error = ""
    with stack_api(configuration, "waiting for the gate's noise floor") as api:
        if not api.gate().gate_api:
            why = (
                f"not applicable: target {api.target.name!r} has a foreign gate, whose noise "
                "floor (if it has one) the harness cannot read"
            )
            foreign = NoiseWait(measured=False, not_applicable=why, waited_s=0.0)
            write_run_json(configuration, NOISE_WAIT_NAME, foreign)
            return foreign
        while True:
            try:
                reading = floor_reading(api.gate_state())
                error = ""
            except ApiError as exc:  # a gate being restarted: keep waiting
                error = str(exc)
            waited = time.monotonic() - start
            if reading is not None and reading.measured(need, zero_ok=zero_ok):
                doc = wait_record(reading, need, waited, time.time())
                if reading.kl == 0:
                    doc["zero_floor"] = "accepted"
                write_run_json(configuration, NOISE_WAIT_NAME, doc)
                return doc
            if waited >= wait_s:
                break
            time.sleep(min(every_s, max(0.0, wait_s - waited)))
    message = unmeasured_message(reading, need, waited)
    if error:
        message += f" (the last read failed: {error})"
    doc = wait_record(reading, need, waited, time.time(), message)
    write_run_json(configuration, NOISE_WAIT_NAME, doc)
    raise ActivityFailed(message)


def _router_health(api: StackApi) -> dict[str, JsonObject]:
    """Each router replica's /health body (or what went wrong reading it)."""
    out: dict[str, JsonObject] = {}
    for rep in api.target.replicas("router"):
        try:
            resp = api.session.get(rep.url + "/health", timeout=5)
            body = resp.json()
            out[rep.name] = body if isinstance(body, dict) else {"error": "not an object"}
        except (OSError, ValueError) as exc:
            out[rep.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def routers_fail_safe_without_gate(
    deadline_s: float = 20.0,
    configuration: Configuration | None = None,
) -> float:
    """While the gate is gone (stopped, unreachable, refusing samples): wait until every
    router reports its gate dead-man switch on (``/health`` status ``degraded`` with
    ``gate_failsafe``: canary at 0 %); returns the seconds it took from this probe's
    start. Raises after ``deadline_s`` naming what each router said (a router that stays
    ``ok`` while its samples pile up leaves a broken canary unguarded)::

        - type: probe
          name: routers-fail-safe
          provider: {type: python, module: probes.gate, func: routers_fail_safe_without_gate,
                     arguments: {deadline_s: 20}}
    """
    began = time.monotonic()
    deadline = deadline_after(deadline_s)
    with stack_api(configuration, "reading the routers' health") as api:
        while True:
            health = _router_health(api)
            off = {n: h.get("gate_failsafe") for n, h in health.items() if h.get("gate_failsafe")}
            if health and len(off) == len(health):
                took = time.monotonic() - began
                write_run_json(configuration, GATE_GONE_FILE, {"took_s": took, "routers": off})
                return round(took, 3)
            if time.monotonic() >= deadline:
                said = "; ".join(
                    f"{n}: status {h.get('status')!r}, sample queue "
                    f"{(h.get('sample_queue') or {}).get('length')}"
                    for n, h in health.items()
                    if n not in off
                )
                raise ActivityFailed(
                    f"expected every router to put the canary at 0 % and say degraded within "
                    f"{float(deadline_s):g} s of the gate going away (its dead-man switch), "
                    f"but {len(health) - len(off)} of {len(health)} did not: {said}"
                )
            time.sleep(0.25)
