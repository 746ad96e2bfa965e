"""Chaos Toolkit activities for the shared-dependency game days (issue #16): Redis
stalled, full or killed, and what users saw meanwhile.

The figures are ``gameday.evidence.redis_outage``'s; each SLO check writes the experiment's
summary, ``dependency.json`` (the report's section). Redis is harmed only through
``gameday.redis_faults``, inside the blast radius; ``clear_redis_faults`` undoes it all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict

import pandas as pd
from chaoslib.exceptions import ActivityFailed

from gameday import redis_faults as dep
from gameday import redis_watch as watching
from gameday.evidence import redis_outage as ev
from gameday.evidence.ledger import FaultEntry
from probes._context import (
    Configuration,
    append_run_json_lines,
    get_target,
    ledger,
    on_target,
    positive,
    write_run_json,
)
from probes._result import Slo, not_measured
from probes._run_records import load_state, read_records, run_json_lines

__all__ = [
    "clear_redis_faults",
    "dependency_errors_below",
    "exhaust_redis",
    "kill_redis",
    "no_request_past_deadline",
    "pause_redis",
    "recovered_within",
    "redis_is_clean",
    "services_stayed_healthy",
    "watch",
]

WATCH_NAME = "dependency_watch.jsonl"
SUMMARY_NAME = "dependency.json"
MAX_WATCH_S = 600.0


# What the actions below return to ``chaos run`` (the journal keeps it).
class RedisFault(TypedDict):
    """A ledger entry of a Redis pause or exhaustion."""

    component: str
    kind: str
    time: float
    ttl_s: float | None
    params: Mapping[str, object]
    fault_id: str | None


class RedisKilled(TypedDict):
    component: str
    killed_at: float
    detail: Mapping[str, object]


class RedisCleared(TypedDict):
    cleared: int
    faults: list[str | None]  # their fault ids


def _entry_json(e: FaultEntry) -> RedisFault:
    return RedisFault(component=e.component, kind=e.kind, time=e.time, ttl_s=e.ttl_s,
                      params=e.params, fault_id=e.fault_id)  # fmt: skip


# -- actions ------------------------------------------------------------------------------
def pause_redis(ms: float, configuration: Configuration | None = None) -> RedisFault:
    """Stall every Redis client for ``ms`` milliseconds (``CLIENT PAUSE ms ALL``).

    Redis ends the pause itself::

        method:
          - type: action
            name: stall-redis
            provider: {type: python, module: probes.dependency, func: pause_redis,
                       arguments: {ms: 4000}}
          - type: probe
            name: watch-the-services
            provider: {type: python, module: probes.dependency, func: watch,
                       arguments: {duration_s: 14}}
    """
    ms = positive("ms", ms, float(dep.MAX_PAUSE_MS))
    with on_target(configuration, f"pausing redis for {ms:g} ms") as target:
        return _entry_json(dep.pause(target, ms, ledger(configuration)))


def exhaust_redis(
    ttl_s: float,
    connections: int = 4,
    configuration: Configuration | None = None,
) -> RedisFault:
    """Fill Redis for ``ttl_s`` seconds: ``connections`` held, ``maxclients`` lowered to
    them, everyone else disconnected and refused.

    A holder child does it, with a deadline.
    """
    ttl_s = positive("ttl_s", ttl_s, dep.MAX_TTL_S)
    with on_target(configuration, "exhausting redis's connections") as target:
        return _entry_json(dep.exhaust(target, ttl_s, int(connections), ledger(configuration)))


def kill_redis(configuration: Configuration | None = None) -> RedisKilled:
    """SIGKILL the stack's redis-server (supervisord restarts it, empty)."""
    with on_target(configuration, "killing redis") as target:
        entry = dep.kill(target, ledger(configuration))
    return RedisKilled(component="redis", killed_at=entry.time, detail=entry.detail)


def clear_redis_faults(configuration: Configuration | None = None) -> RedisCleared:
    """End every Redis fault of this run (pause, holder) and restore ``maxclients``.
    Idempotent: safe as a rollback after any failure."""
    with on_target(configuration, "clearing redis faults") as target:
        cleared = dep.clear(target, ledger(configuration))
    return RedisCleared(cleared=len(cleared), faults=[c.fault_id for c in cleared])


# -- probes -------------------------------------------------------------------------------
def redis_is_clean(configuration: Configuration | None = None) -> bool:
    """True when Redis is in the starting state (answers, ``maxclients`` as the stack set
    it, no holder connected); else raises naming what is off."""
    with on_target(configuration, "checking redis's starting state") as target:
        found = dep.problems(target)
    if found:
        raise ActivityFailed(
            "redis is not in the starting state: " + "; ".join(found) + ". Run the "
            "rollback (probes.dependency.clear_redis_faults) or start a fresh stack."
        )
    return True


def watch(
    duration_s: float,
    interval_s: float = 0.25,
    configuration: Configuration | None = None,
) -> ev.WatchCounts:
    """For ``duration_s`` seconds, every ``interval_s``: each router replica's and the
    broker's ``/health`` and whether Redis answers PING, one line each in
    ``dependency_watch.jsonl``. Returns the counts of unhealthy ticks."""
    duration_s = positive("duration_s", duration_s, MAX_WATCH_S)
    interval_s = positive("interval_s", interval_s, 10.0)
    with on_target(configuration, "watching the services") as target:
        return watching.watch(
            target,
            duration_s,
            interval_s,
            lambda tick: append_run_json_lines(configuration, WATCH_NAME, [tick]),
        )


# -- the summary --------------------------------------------------------------------------
def summarise(configuration: Configuration | None) -> ev.Summary:
    """The experiment's dependency summary (``gameday.evidence.redis_outage.summary``), also
    written to ``dependency.json``."""
    state = load_state(configuration) or {}
    frame: pd.DataFrame | None = None
    error = None
    if state.get("state") == "stopped":
        try:
            frame = read_records(str(state.get("records")))
        except Exception as exc:  # an unreadable file is a finding, not a crash
            error = str(exc)
    lines = run_json_lines(configuration, WATCH_NAME)
    models = watching.model_results(get_target(configuration))
    doc = ev.summary(ledger(configuration).entries(), lines, models, frame, error)
    write_run_json(configuration, SUMMARY_NAME, doc)
    return doc


def _judged(
    configuration: Configuration | None,
    name_unit: tuple[str, str],
    allowed: float,
    judge: Callable[[ev.Summary], Slo],
) -> Slo:
    """``judge`` over the experiment's dependency summary (``gameday.evidence.redis_outage.
    judged``); not measured before the method."""
    check, unit = name_unit
    if load_state(configuration) is None and not ledger(configuration).entries():
        return not_measured(check, allowed, unit, "before the method: nothing to measure yet")
    return ev.judged(summarise(configuration), name_unit, allowed, judge)


def dependency_errors_below(max_ratio: float, configuration: Configuration | None = None) -> Slo:
    """Failed requests among those that started during the fault or after it: at most
    ``max_ratio`` (the dependency degrades answers; it must not fail them)."""
    allowed = float(max_ratio)
    return _judged(configuration, ev.ERROR_RATE, allowed, lambda d: ev.errors_below(d, allowed))


def no_request_past_deadline(max_s: float, configuration: Configuration | None = None) -> Slo:
    """No request took longer than ``max_s`` end to end, and none timed out."""
    allowed = float(max_s)
    return _judged(configuration, ev.MAX_E2E, allowed, lambda d: ev.within_deadline(d, allowed))


def recovered_within(max_s: float, configuration: Configuration | None = None) -> Slo:
    """Users are served as before the fault (error rate and TTFT) within ``max_s``
    seconds of its end (``gameday.evidence.redis_outage.recovery_s`` says how)."""
    allowed = float(max_s)
    return _judged(configuration, ev.RECOVERY, allowed, lambda d: ev.recovered(d, allowed))


def services_stayed_healthy(configuration: Configuration | None = None) -> Slo:
    """Every watch tick found every router replica and the broker healthy: nothing
    cascaded from the dependency into them."""
    return _judged(configuration, ev.UNHEALTHY, 0.0, ev.stayed_healthy)
