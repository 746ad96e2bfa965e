"""What the services did while the shared dependency (Redis) was harmed (issue #16): each
router replica's and the broker's ``/health`` and whether Redis answers PING, tick by
tick; and the model servers' dependency results from their ``/metrics``.

It only reads: a service that does not answer is an unhealthy tick, never an error. The
figures over the ticks are ``gameday.evidence.redis_outage``'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import requests

from gameday import redis_faults as dep
from gameday.api import POLL_TIMEOUT_S
from gameday.evidence import redis_outage as ev
from gameday.evidence.ledger import FaultError
from gameday.sessions import given_or_own
from gameday.targets import Target, TargetError

__all__ = ["model_results", "watch"]

MODEL_ROLES = ("model-baseline", "model-canary")


def healthy(url: str, *, session: requests.Session | None = None) -> bool:
    """The service at ``url`` answers ``/health`` with HTTP 200."""
    try:
        with given_or_own(session) as http:
            return http.get(url + "/health", timeout=POLL_TIMEOUT_S).status_code == 200
    except requests.RequestException:
        return False


def redis_answers(ep: dep.Endpoint) -> bool:
    """Redis at ``ep`` answers PING."""
    try:
        with dep.Resp(ep.host, ep.port, timeout_s=POLL_TIMEOUT_S) as r:
            return bool(r.command("PING") == "PONG")
    except FaultError:
        return False


def watch(
    target: Target,
    duration_s: float,
    interval_s: float,
    on_tick: Callable[[ev.WatchTick], object],
    *,
    session: requests.Session | None = None,
) -> ev.WatchCounts:
    """For ``duration_s`` seconds, every ``interval_s``: one tick ``{"time", "health":
    {service: bool}, "redis": bool}`` given to ``on_tick`` as it is taken. Returns the
    counts of ticks and of unhealthy ticks per service. TargetError (FaultError) when the
    target has no Redis or no such services. Every tick over ``session`` when given, else
    over one session of its own for the whole watch."""
    ep = dep.endpoint(target)
    urls = {r.name: r.url for r in target.replicas("router")}
    urls["broker"] = target.service_url("broker")
    ticks: list[ev.WatchTick] = []
    end = time.monotonic() + duration_s
    with given_or_own(session) as http:
        while time.monotonic() < end:
            t = time.time()
            health = {name: healthy(url, session=http) for name, url in urls.items()}
            ticks.append({"time": t, "health": health, "redis": redis_answers(ep)})
            on_tick(ticks[-1])
            time.sleep(max(0.0, min(interval_s, end - time.monotonic())))
    bad = {name: 0 for name in urls} | ev.unhealthy_ticks(ticks)
    return {"ticks": len(ticks), "unhealthy_ticks": bad}


def model_results(
    target: Target, *, session: requests.Session | None = None
) -> dict[str, dict[str, float]]:
    """``canarystack_dependency_requests_total`` per model variant (``baseline``,
    ``canary``), from their ``/metrics``; what was read before a replica failed to answer
    (or answered a malformed line)."""
    out: dict[str, dict[str, float]] = {}
    with (
        contextlib.suppress(requests.RequestException, TargetError, IndexError, ValueError),
        given_or_own(session) as http,
    ):
        for role in MODEL_ROLES:
            counts: dict[str, float] = {}
            for rep in target.replicas(role):
                text = http.get(rep.url + "/metrics", timeout=POLL_TIMEOUT_S).text
                ev.add_dependency_results(text, counts)
            out[role.removeprefix("model-")] = counts
    return out
