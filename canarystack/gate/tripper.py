"""Writing a trip to the broker: ``phase=tripped`` with the evidence, by compare-and-set.

This module must never trip a release the broker does not show as progressing with the
canary version the evidence is about, and never write anything but the trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from canary_contract.broker import Release, TripRecord
from canary_contract.phases import Phase, is_canary_off
from canarystack.broker.client import (
    BrokerClient,
    BrokerNotFound,
    BrokerRequestError,
    BrokerUnavailable,
    IllegalTransition,
    RevisionConflict,
)
from canarystack.common.logs import JsonLogger, get_logger

BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
AUTH_MAX_BACKOFF_S = 2.0
AUTH_STATUSES = (401, 403)


@dataclass
class TripResult:
    written: bool
    release: Release | None
    reason: str
    attempts: int


def progressing_with(release: Release | None, canary_version: str | None) -> str | None:
    """None when the release may be tripped for ``canary_version``; else why not."""
    if release is None:
        return "release not found"
    if release.phase is not Phase.PROGRESSING:
        return f"release is {release.phase.value}, not progressing"
    if release.canary is None:
        return "release has no canary"
    canary = release.canary.version
    if canary != canary_version:
        return f"canary is now {canary}, the evidence is about {canary_version}"
    return None


def is_our_trip(release: Release | None, evidence: TripRecord) -> bool:
    """The release already carries this very evidence (an earlier attempt landed)."""
    if release is None or not is_canary_off(release.phase) or release.trip is None:
        return False
    trip = release.trip
    return bool(
        trip.tripped_at == evidence["tripped_at"]
        and trip.test.value == evidence["test"]
        and trip.bucket == evidence["bucket"]
    )


def trip_reason(evidence: TripRecord) -> str:
    """The broker event's reason for a trip: the gate-blind fail-safe says so first."""
    detail = evidence["detail"]
    if detail.get("reason") == "gate_blind":
        return str(detail.get("message"))
    return (
        f"gate: {evidence['test']} test tripped in bucket {evidence['bucket']} "
        f"(statistic {evidence['statistic']:g} >= {evidence['threshold']:g} "
        f"over {evidence['samples']} samples)"
    )


async def write_trip(
    client: BrokerClient,
    name: str,
    evidence: TripRecord,
    canary_version: str | None,
    known: Release | None,
    *,
    on_release: Callable[[Release], None] | None = None,
    on_auth: Callable[[BrokerRequestError | None], None] | None = None,
    log: JsonLogger | None = None,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> TripResult:
    """CAS ``phase=tripped`` + ``trip=evidence`` onto release ``name``.

    The write is retried until it lands or no longer makes sense:

    - ``RevisionConflict`` (someone else changed the release): read the release again; if
      it is still progressing with the same canary version, retry at once with the new
      revision;
    - ``IllegalTransition`` or a release that is no longer progressing, or whose canary
      changed: abandon (the routers already keep the canary off, or it is another canary);
    - ``BrokerUnavailable`` (down, slow, 5xx): back off (``BACKOFF_S`` doubling up to
      ``MAX_BACKOFF_S``) and retry, for as long as it takes;
    - 401/403 (the broker refuses the gate's credential): the decision stands and the
      evidence is fine, so never abandon: report it (``on_auth``, an error log line) and
      retry with backoff up to ``AUTH_MAX_BACKOFF_S``, until the credential works again;
    - any other refusal (4xx): abandon and log it; the evidence itself was rejected.

    ``on_auth(exc)`` is called on each 401/403 and ``on_auth(None)`` once a write lands."""
    log = log or get_logger("gate")
    release = known
    backoff = BACKOFF_S
    attempts = 0
    while True:
        if release is None:
            try:
                release = await client.get_release(name)
            except BrokerNotFound:
                return TripResult(False, None, "release not found", attempts)
            except BrokerUnavailable as exc:
                log.warning("trip_broker_unavailable", release=name, error=str(exc))
                backoff = await _back_off(sleep, backoff, MAX_BACKOFF_S)
                continue
            if on_release is not None:
                on_release(release)
        if is_our_trip(release, evidence):
            return TripResult(True, release, "written", attempts)
        why_not = progressing_with(release, canary_version)
        if why_not is not None:
            return TripResult(False, release, why_not, attempts)
        attempts += 1
        try:
            new = await client.patch_release(
                name,
                release.revision,
                phase="tripped",
                trip=evidence,
                reason=trip_reason(evidence),
            )
        except RevisionConflict as exc:
            log.info("trip_revision_conflict", release=name, current=exc.current_revision)
            release = None
            continue
        except IllegalTransition as exc:
            release = await _read_after_refusal(client, name, on_release)
            return TripResult(False, release, f"refused: {exc.message}", attempts)
        except BrokerUnavailable as exc:
            log.warning("trip_broker_unavailable", release=name, error=str(exc))
            backoff = await _back_off(sleep, backoff, MAX_BACKOFF_S)
            # The write may have landed before the connection broke: read before retrying.
            release = None
            continue
        except BrokerRequestError as exc:
            if exc.status not in AUTH_STATUSES:
                log.error("trip_refused", release=name, error=exc.message, status=exc.status)
                return TripResult(False, release, f"refused: {exc.message}", attempts)
            _report_unauthorized(log, name, exc, backoff, on_auth)
            backoff = await _back_off(sleep, backoff, AUTH_MAX_BACKOFF_S)
            release = None
            continue
        if on_auth is not None:
            on_auth(None)
        if on_release is not None:
            on_release(new)
        return TripResult(True, new, "written", attempts)


async def _back_off(sleep: Callable[[float], Any], backoff: float, cap: float) -> float:
    """Sleep ``backoff`` seconds; the next backoff: doubled, at most ``cap``."""
    await sleep(backoff)
    return min(cap, backoff * 2)


async def _read_after_refusal(
    client: BrokerClient, name: str, on_release: Callable[[Release], None] | None
) -> Release | None:
    """The release as it is after the broker refused the transition (None when it cannot
    be read), passed to ``on_release`` when read."""
    release = None
    try:
        release = await client.get_release(name)
    except (BrokerUnavailable, BrokerRequestError):
        pass
    if on_release is not None and release is not None:
        on_release(release)
    return release


def _report_unauthorized(
    log: JsonLogger,
    name: str,
    exc: BrokerRequestError,
    backoff: float,
    on_auth: Callable[[BrokerRequestError | None], None] | None,
) -> None:
    """The broker refuses the gate's credential (401/403): an error log line saying what
    to do and when the write is tried again, and ``on_auth(exc)``."""
    log.error(
        "trip_unauthorized",
        release=name,
        status=exc.status,
        error=exc.message,
        retry_in_s=backoff,
        hint="the broker refuses this gate's token: give the gate the broker's "
        "admin token (--admin-token-file); the trip is written once it works",
    )
    if on_auth is not None:
        on_auth(exc)
