"""Gate observers: what a release gate did, read from the parts of a stack that show it.

``gameday.observers.base`` holds the interface (``GateObserver.snapshot``), the
``ObservationLog`` and how snapshots become broker-shaped ``history``; the backends are
``gameday.observers.alert`` (a Prometheus alert and Envoy's weights) and
``gameday.observers.kubernetes`` (Argo Rollouts, Flagger, HTTPRoute/VirtualService
weights). ``observer_for`` builds the one a target file describes
(``gameday.observers.specs``).
"""

from __future__ import annotations

from pathlib import Path

from gameday.observers.alert import EnvoyAlertObserver
from gameday.observers.base import (
    SAMPLE_S,
    GateObserver,
    GateSnapshot,
    ObservationLog,
    history,
    release_now,
)
from gameday.observers.kubernetes import ArgoRolloutsObserver, FlaggerObserver, RouteObserver
from gameday.observers.specs import ObserverSpec

__all__ = [
    "SAMPLE_S",
    "EnvoyAlertObserver",
    "GateObserver",
    "GateSnapshot",
    "ObservationLog",
    "history",
    "observer_for",
    "release_now",
]


def observer_for(spec: ObserverSpec, observations: Path | None) -> GateObserver:
    """The observer a target file's ``observer:`` describes, keeping its snapshots in
    ``observations`` (None: in memory)."""
    log = ObservationLog(observations)
    if spec.kind == "envoy-prometheus-alert":
        return EnvoyAlertObserver(spec, log)
    cls = {
        "argo-rollouts": ArgoRolloutsObserver,
        "flagger": FlaggerObserver,
        "k8s-route": RouteObserver,
    }[spec.kind]
    return cls(spec, log)
