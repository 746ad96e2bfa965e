"""Chaos Toolkit probes that check SLOs over what the run recorded: users' requests
(the load records), the fault ledger and the broker's history.

Each returns the SLO result (``gameday.evidence.slo``) that the ``slo_met`` tolerance
judges; the measuring is ``gameday.evidence.checks``, the report's too. Before the method
a probe says ``not_measured``; once a fault was injected, missing records fail the check
(fail-closed). These probes only read.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from canary_contract.phases import is_canary_off
from gameday.api import ApiError, StackApi
from gameday.evidence import checks
from gameday.evidence.slo import Slo, failed_result, not_measured, result
from probes._context import Configuration, stack_api
from probes._run_records import (
    NOT_YET,
    before_anything,
    experiment_began,
    first_fault,
    records,
    reference,
)

__all__ = [
    "baseline_ttft_p99_below",
    "drifted_responses_at_most",
    "error_rate_below",
    "errors_only_in_flight_at_kill",
    "gate_sees_every_router",
    "no_canary_served_after",
    "no_trip",
    "rollback_complete_within",
    "slo_met",
    "trip_within",
    "weights_applied_within",
]


def slo_met(
    value: dict[str, object] | None = None,
    configuration: Configuration | None = None,
) -> bool:
    """Tolerance: the SLO result's ``ok`` is true (``value`` is what the probe gave
    ``chaos run``: anything but an SLO result with ``ok`` true fails).

    As a probe's tolerance::

        tolerance:
          type: probe
          name: slo-met
          provider: {type: python, module: probes.slo, func: slo_met, arguments: {}}
    """
    return bool(isinstance(value, dict) and value.get("ok") is True)


def baseline_ttft_p99_below(
    max_s: float,
    min_requests: int = 20,
    configuration: Configuration | None = None,
) -> Slo:
    """p99 time to first token of successful baseline-served requests is at most
    ``max_s`` (over at least ``min_requests`` requests)."""
    frame = records(configuration, "baseline_ttft_p99_s", float(max_s), "s")
    if not isinstance(frame, pd.DataFrame):
        return frame
    return checks.baseline_ttft_p99(frame, max_s, min_requests)


def error_rate_below(
    max_ratio: float,
    configuration: Configuration | None = None,
) -> Slo:
    """The share of failed requests (any variant) is at most ``max_ratio`` (0 means no
    failed request at all)."""
    frame = records(configuration, "error_rate", float(max_ratio), "ratio")
    return frame if not isinstance(frame, pd.DataFrame) else checks.error_rate(frame, max_ratio)


def no_canary_served_after(
    max_s: float,
    configuration: Configuration | None = None,
) -> Slo:
    """No canary-served request started later than ``max_s`` seconds after the
    reference fault (the rollback, as users feel it)."""
    check, allowed = "rollback_s", float(max_s)
    frame = records(configuration, check, allowed, "s")
    if not isinstance(frame, pd.DataFrame):
        return frame
    ref = reference(configuration)
    if ref is None:
        return failed_result(check, allowed, "s", "no fault in this run's ledger to measure from")
    return checks.canary_served_after(frame, ref.entry, max_s)


def drifted_responses_at_most(
    max_count: int,
    configuration: Configuration | None = None,
) -> Slo:
    """At most ``max_count`` canary-served requests were exposed to the faulty kernel:
    started after it was injected, with a prompt at or above its token threshold."""
    check, allowed = "drifted_responses", float(max_count)
    frame = records(configuration, check, allowed, "count")
    if not isinstance(frame, pd.DataFrame):
        return frame
    kernel = first_fault(configuration, "inject", "kernel")
    if kernel is None:
        why = "no kernel fault in this run's ledger: nothing to count"
        return failed_result(check, allowed, "count", why)
    return checks.drifted_responses(frame, kernel, max_count)


def errors_only_in_flight_at_kill(
    grace_s: float = 1.0,
    configuration: Configuration | None = None,
) -> Slo:
    """Every failed request was in flight when the pod was killed (started before the
    kill, or within ``grace_s`` after it on a stale connection, and not finished before
    it). Measured: the failed requests the kill does not explain; allowed: 0."""
    check = "errors_not_in_flight_at_kill"
    frame = records(configuration, check, 0.0, "count")
    if not isinstance(frame, pd.DataFrame):
        return frame
    kill = first_fault(configuration, "kill")
    if kill is None:
        return failed_result(check, 0.0, "count", "no pod kill in this run's ledger")
    return checks.errors_not_in_flight_at_kill(frame, kill, grace_s)


def _broker_milestone(configuration: Configuration | None, check: str, max_s: float) -> Slo:
    allowed = float(max_s)
    if before_anything(configuration):
        return not_measured(check, allowed, "s", NOT_YET)
    ref = reference(configuration)
    if ref is None:
        return failed_result(check, allowed, "s", "no fault in this run's ledger to measure from")
    try:
        with stack_api(configuration, "reading the broker's history") as api:
            events = api.events()
            routers = api.routers() if check == "weights_applied_s" else []
    except Exception as exc:  # the check fails; it never crashes
        return failed_result(check, allowed, "s", f"cannot read the broker's history: {exc}")
    return checks.broker_milestone(check, events, ref.entry, allowed, routers)


def trip_within(
    max_s: float,
    configuration: Configuration | None = None,
) -> Slo:
    """The gate tripped the release at most ``max_s`` seconds after the fault."""
    return _broker_milestone(configuration, "detection_s", max_s)


def weights_applied_within(
    max_s: float,
    configuration: Configuration | None = None,
) -> Slo:
    """Canary weight 0 was in force at every live router at most ``max_s`` seconds after
    the fault (``gameday.evidence.milestones.WeightsApplied`` says how that is read;
    ``detail.source`` says which time it was: ``canary_off_at`` | ``annotation_time``)."""
    return _broker_milestone(configuration, "weights_applied_s", max_s)


def rollback_complete_within(
    max_s: float,
    configuration: Configuration | None = None,
) -> Slo:
    """The release reached ``rolled_back`` at most ``max_s`` seconds after the fault."""
    return _broker_milestone(configuration, "rollback_complete_s", max_s)


def no_trip(
    configuration: Configuration | None = None,
) -> Slo:
    """The release was not tripped since this experiment began (its load started, or
    its first fault): measured is the number of trips, allowed 0."""
    since = experiment_began(configuration)
    try:
        with stack_api(configuration, "reading the broker's history") as api:
            if since is not None:
                return checks.trips_since(api.events(), since)
            # Nothing has happened in this experiment yet: only the release as it is now
            # counts (an earlier experiment's trips on a shared stack are history).
            phase = str(api.release().get("phase"))
    except Exception as exc:  # the check fails; it never crashes
        return failed_result("no_trip", 0.0, "count", f"cannot read the broker's history: {exc}")
    now = [{"change": {"phase": "tripped"}}] if is_canary_off(phase) else []
    return checks.trips_since(now, None)


def gate_sees_every_router(
    configuration: Configuration | None = None,
) -> Slo:
    """The gate can see: every live router's samples reach it, and the gate is not
    ``inconclusive`` (no canary sample for its no-data timeout). Measured is the number of
    routers (plus the gate itself, when inconclusive) that leave the gate blind; allowed 0.
    A blind gate never trips, so a run without this check could pass quietly."""
    try:
        with stack_api(configuration, "finding the routers and the gate") as api:
            if not api.gate().gate_api:
                return _foreign_gate_sees(api)
            health: dict[str, Mapping[str, object] | None] = {}
            routers = api.target.replicas("router")
            for router in routers:
                try:
                    health[router.name] = api.health(router.url)
                except ApiError:
                    health[router.name] = None
            try:
                gate_state = api.gate_state().get("state")
            except ApiError as exc:
                why = f"cannot read the gate's state at {exc.url}: {exc}"
                return failed_result("gate_blind", 0.0, "routers", why)
    except Exception as exc:  # the check fails; it never crashes
        why = f"cannot find the routers and the gate: {exc}"
        return failed_result("gate_blind", 0.0, "routers", why)
    return checks.gate_blind(health, gate_state, len(routers))


def _foreign_gate_sees(api: StackApi) -> Slo:
    """A foreign gate can see when its observer says so: its rules loaded and healthy, the
    stack's metrics scraped (``gameday.observers``). Measured: the problems found."""
    observer = api.gate()
    snap = observer.snapshot(api.session)
    if snap.sees:
        return result("gate_blind", 0.0, 0.0, "problems", True, observer=observer.name)
    why = "; ".join(snap.why) or "the observer could not tell"
    return failed_result("gate_blind", 0.0, "problems", f"the gate cannot see: {why}")
