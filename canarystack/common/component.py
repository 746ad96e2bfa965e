"""``Component``: what every component's app holds (name, version, admin token, faults,
metrics registry, hop log), stored at ``app[COMPONENT]``.

This module must never serve anything: ``canarystack.common.app`` builds the app.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from canarystack.common.auth import check_admin
from canarystack.common.colour import HopLog
from canarystack.common.faults import FaultRegistry, NoParams
from canarystack.common.logs import JsonLogger, get_logger
from canarystack.common.metrics import Metrics

# The fault every component has: incoming requests are treated as untagged while it lasts.
DROP_COLOUR = "drop_colour"


@dataclass
class Component:
    """A component's shared state. ``health_extra`` adds fields to ``/health`` or reports
    "degraded"; one that raises or returns what JSON cannot carry (``NaN``) makes the
    answer 503 "degraded": the component cannot tell it is well, so it does not say so."""

    name: str
    version: str
    admin_token: str | None
    faults: FaultRegistry
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    log: JsonLogger | None = None
    # Any JSON object with its keys (a TypedDict): ``/health`` copies its fields in.
    health_extra: Callable[[], Mapping[str, object]] | None = None
    started_mono: float = field(default_factory=time.monotonic)
    # The coloured requests this component saw (canarystack.common.colour; the probe reads it).
    hops: HopLog = field(default_factory=HopLog)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = get_logger(self.name)
        # Every component can lose the tag on purpose (the colour-dropped game day).
        self.faults.kinds.setdefault(DROP_COLOUR, NoParams)
        gauge = Metrics(self.registry).gauge(
            "canarystack_active_faults", "Faults active in this process, by kind", "kind"
        )
        for kind in self.faults.kinds:
            gauge.labels(kind=kind).set_function(self._fault_counter(kind))

    def _fault_counter(self, kind: str) -> Callable[[], float]:
        return lambda: float(self.faults.count(kind))

    def require_admin(self, request: web.Request) -> None:
        check_admin(request, self.admin_token)


COMPONENT: web.AppKey[Component] = web.AppKey("component", Component)
