"""Chaos Toolkit activities for the broker store-loss game day
(``experiments/broker/store-lost.yaml``): mark the broker, empty its store, and check that
the restarted broker knows what it lost.

The work is in ``gameday.broker_store``; these are thin adapters. A check raises
``ActivityFailed`` with expected and actual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import requests

from gameday import broker_store
from gameday.targets import Target
from probes._context import (
    Configuration,
    ledger,
    non_negative,
    on_target,
    reported,
    run_dir,
    write_run_json,
)

__all__ = [
    "accept_store_loss",
    "broker_reports_store_lost",
    "lose_broker_store",
    "mark_broker_before_loss",
    "quarantine_survives_store_loss",
    "restore_broker_store",
    "routers_canary_off",
]

RESULT_FILE = "store_lost_checks.json"


@contextmanager
def _checking(
    configuration: Configuration | None, what: str
) -> Iterator[tuple[Target, requests.Session]]:
    """The target and a session of this activity's own; a failed check is ActivityFailed."""
    with (
        on_target(configuration, what) as target,
        requests.Session() as http,
        reported(broker_store.StoreCheckFailed),
    ):
        yield target, http


def mark_broker_before_loss(configuration: Configuration | None = None) -> broker_store.Marked:
    """Record the broker's versions and release in the run folder, then register a marker
    version and quarantine it: the acknowledged write the loss must not undo."""
    with _checking(configuration, "marking the broker") as (target, http):
        return broker_store.mark_before_loss(target, run_dir(configuration), http)


def lose_broker_store(configuration: Configuration | None = None) -> broker_store.StoreLost:
    """Empty the broker's SQLite files and SIGKILL it (local target): it restarts on an
    empty store, as a volume that came back blank. Recorded in the fault ledger."""
    with on_target(configuration, "emptying the broker's store") as target:
        return broker_store.lose_store(target, ledger(configuration))


def broker_reports_store_lost(
    deadline_s: float = 30.0, configuration: Configuration | None = None
) -> broker_store.LossReported:
    """The restarted broker's /health is not ok and names what the store lost."""
    wait = non_negative("deadline_s", deadline_s)
    with _checking(configuration, "reading the broker's /health") as (target, http):
        found = broker_store.loss_reported(target, run_dir(configuration), http, wait)
    write_run_json(configuration, RESULT_FILE, {"loss_reported": found})
    return found


def routers_canary_off(
    deadline_s: float = 15.0, configuration: Configuration | None = None
) -> broker_store.RoutersOff:
    """Every router at 0 % canary within ``deadline_s`` (its fail-safe bound and slack)."""
    wait = non_negative("deadline_s", deadline_s)
    with _checking(configuration, "reading the routers") as (target, http):
        return broker_store.routers_canary_off(target, http, wait)


def accept_store_loss(configuration: Configuration | None = None) -> broker_store.LossAccepted:
    """The operator accepts the loss the broker reports (nothing when it reports none)."""
    with _checking(configuration, "accepting the store loss") as (target, http):
        return broker_store.accept_loss(target, http)


def quarantine_survives_store_loss(
    configuration: Configuration | None = None,
) -> broker_store.QuarantineHeld:
    """The marker version, registered again after the loss, is still quarantined and is
    refused as a canary."""
    with _checking(configuration, "checking the quarantine") as (target, http):
        return broker_store.quarantine_holds(target, run_dir(configuration), http)


def restore_broker_store(configuration: Configuration | None = None) -> broker_store.Restored:
    """Put the versions and the release back as they were before the loss (idempotent:
    the experiment's rollback)."""
    with _checking(configuration, "restoring the broker") as (target, http):
        return broker_store.restore(target, run_dir(configuration), http)
