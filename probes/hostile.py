"""Chaos Toolkit activities for the hostile game day (``experiments/hostile/``): a flood of
hostile input pinned to the canary, pins sent after a trip, and the SLO probes that judge
them (each allows 0).

The work is in ``gameday.hostile`` and ``gameday.hostile_pins``; these are thin adapters.
"""

from __future__ import annotations

import time
from typing import TypeVar, cast

from gameday import hostile, stalled_readers
from gameday.evidence import checks
from gameday.evidence.slo import Slo
from gameday.hostile_pins import PinError, pins_after_trip
from gameday.run.collect import read_json
from probes._context import (
    Configuration,
    on_target,
    positive,
    reported,
    run_dir,
    stack_api,
    write_run_json,
)

__all__ = [
    "flood_pinned_canary",
    "hostile_input_not_5xx",
    "pin_canary_after_trip",
    "pins_reach_no_canary",
    "stall_readers",
    "stalled_streams_cut",
]

FLOOD_FILE = "hostile.json"
PINS_FILE = "pins_after_trip.json"
STALLED_FILE = "stalled_readers.json"


# The document an action of this module writes, read back by its SLO probe.
_Doc = TypeVar("_Doc")


def _read(configuration: Configuration | None, name: str, shape: type[_Doc]) -> _Doc | None:
    """The run folder's JSON file ``name``, which this module's action wrote as ``shape``
    (None: not written yet, or not a JSON object); read as it is, the probe judges it."""
    return cast("_Doc | None", read_json(run_dir(configuration) / name))


def flood_pinned_canary(
    duration_s: float = 10.0,
    rate_per_s: float = 20.0,
    max_requests: int = 2_000,
    configuration: Configuration | None = None,
) -> hostile.HostileFlood:
    """Flood the router with hostile client input pinned to the canary; returns the
    statuses per input (also in ``hostile.json``). Never raises for what came back: the
    SLO probe ``hostile_input_not_5xx`` judges it.

    It sends ``gameday.hostile.CATALOGUE`` to the router at a bounded rate::

        - type: action
          name: hostile-flood-pinned-to-the-canary
          provider: {type: python, module: probes.hostile, func: flood_pinned_canary,
                     arguments: {duration_s: 10, rate_per_s: 20}}
    """
    duration = positive("duration_s", duration_s, 600.0)
    rate = positive("rate_per_s", rate_per_s, 500.0)
    count = int(positive("max_requests", max_requests, 100_000))
    with on_target(configuration, "flooding the router with hostile input") as target:
        url = target.service_url("router")
    started = time.time()
    res = hostile.flood(url, duration_s=duration, rate_per_s=rate, max_requests=count)
    out: hostile.HostileFlood = {"started_at": started, "router": url, "pin": "canary",
                                 **res.to_json()}  # fmt: skip
    write_run_json(configuration, FLOOD_FILE, out)
    return out


def hostile_input_not_5xx(configuration: Configuration | None = None) -> Slo:
    """SLO: no hostile request got a 5xx or a broken connection (allowed 0)."""
    return checks.hostile_server_errors(_read(configuration, FLOOD_FILE, checks.FloodJson))


def pin_canary_after_trip(
    count: int = 20,
    configuration: Configuration | None = None,
) -> checks.PinsAfterTrip:
    """Send ``count`` well-formed requests pinned to the canary; record who answered.

    ``pins_after_trip.json`` holds what answered them, and the canary's own request count
    before and after (from its ``/metrics``).
    """
    n = int(positive("count", count, 1_000))
    with stack_api(configuration, "pinning requests to the canary") as api, reported(PinError):
        out = pins_after_trip(api, n)
    write_run_json(configuration, PINS_FILE, out)
    return out


def pins_reach_no_canary(configuration: Configuration | None = None) -> Slo:
    """SLO: after a trip, no pinned request reached the canary (allowed 0): none was
    answered by it (``x-served-by``) and its own request counter did not move."""
    return checks.pinned_requests_on_tripped_canary(
        _read(configuration, PINS_FILE, checks.PinsAfterTrip)
    )


def stall_readers(
    streams: int = 72,
    max_tokens: int = 4000,
    hold_s: float = 40.0,
    configuration: Configuration | None = None,
) -> stalled_readers.StalledReadersRun:
    """Open ``streams`` streaming completions to the router that are never read (small
    receive buffer, ``max_tokens`` each), hold them ``hold_s`` seconds, then
    record what each got and whether the stack cut it (``stalled_readers.json``). Never
    raises for what came back: ``stalled_streams_cut`` and the users' SLOs judge it::

        - type: action
          name: clients-that-never-read
          provider: {type: python, module: probes.hostile, func: stall_readers,
                     arguments: {streams: 72, max_tokens: 4000, hold_s: 40}}
    """
    n = int(positive("streams", streams, 1_000))
    tokens = int(positive("max_tokens", max_tokens, 100_000))
    hold = positive("hold_s", hold_s, 600.0)
    with on_target(configuration, "opening streams that are never read") as target:
        url = target.service_url("router")
    started = time.time()
    res = stalled_readers.stall(url, streams=n, max_tokens=tokens, hold_s=hold)
    out: stalled_readers.StalledReadersRun = {"started_at": started, **res.to_json()}
    write_run_json(configuration, STALLED_FILE, out)
    return out


def stalled_streams_cut(configuration: Configuration | None = None) -> Slo:
    """SLO: every admitted stream whose client never read was cut by the stack within the
    hold (allowed 0 left open)."""
    return stalled_readers.stalled_streams_cut(
        _read(configuration, STALLED_FILE, stalled_readers.StalledReadersJson)
    )
