"""The version broker: the single source of truth for releases.

A release holds the stable and canary versions (with artifact digests), the canary's
traffic weight, the phase (``canarystack.broker.phases``), a revision that increments on
every change, trip evidence and an append-only event history. State lives in SQLite
(WAL) under ``--state-dir``; clients watch by long-poll. The API is fixed in
docs/ARCHITECTURE.md §2.

- ``canarystack.broker.server``  HTTP: aiohttp handlers (``build_app``), domain errors -> statuses
- ``canarystack.broker.schemas``  the request bodies (pydantic) and their limits
- ``canarystack.broker.service``  ``Broker``: in-memory releases, the database thread, watches
- ``canarystack.broker.store``   SQLite: transactions, compare-and-set, events
- ``canarystack.broker.changes``  a PATCH's plan under the phase rules, an event's diff
- ``canarystack.broker.errors``  the domain errors the store raises (``Missing``, ...)
- ``canarystack.broker.phases``  the phase transition table
- ``canarystack.broker.client``  ``BrokerClient``, the async client other components use
- ``canarystack.broker.digest``  ``manifest_digest``
- ``canarystack.broker.bootstrap``  ``ensure_release``: create a release once, over HTTP

Importing this package must stay cheap and side-effect free: it imports nothing heavy.
"""

from canarystack.broker.digest import manifest_digest

__all__ = ["manifest_digest"]
