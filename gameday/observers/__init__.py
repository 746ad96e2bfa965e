"""Gate observers: what a release gate did, read from the parts of a stack that show it.

One small interface (``GateObserver.snapshot``) answers, at one moment: did the gate trip,
what canary weight is in force at every entry point, do pins still reach the canary, and
could the gate see. An ``ObservationLog`` keeps the snapshots of one experiment (a JSON-lines
file in its run folder), and ``history`` turns them into events shaped like canarystack's
broker history (``{"time", "actor", "change": {"phase": ...}}``), so every check, the
timeline and the report read a foreign gate exactly as they read ours:

- a trip is the first moment the gate's signal fired (a Prometheus alert's ``activeAt``,
  which Prometheus keeps, else the first snapshot that saw it), or the canary's weight
  reached 0 without one;
- weight 0 at every entry point is the first snapshot where every weighted route gives the
  canary 0 (a ``routers_applied`` annotation with ``canary_off_at``);
- the rollback is done when the weight is 0 after a trip (``rolled_back``).

A snapshot's times are as good as its polling: ``gameday run`` samples every
``SAMPLE_S`` for the whole experiment, and every probe that waits adds what it saw.

Backends: ``EnvoyAlertObserver`` (an alert in Prometheus is the trip; Envoy's weighted
clusters and the admin runtime that overrides them are the weights); on the Kubernetes API
(``gameday.observers.kubernetes``) an Argo Rollouts ``Rollout``, a Flagger ``Canary``, and
an ``HTTPRoute`` or Istio ``VirtualService``'s weights. canarystack's own gate is read from
its broker (``gameday.api.StackApi``).

This module only reads: it never changes a weight, an alert or a route.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from canary_contract.json import JsonObject

if TYPE_CHECKING:
    from gameday.targets.external import AlertObserverSpec, ObserverSpec

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

SAMPLE_S = 0.1
READ_TIMEOUT_S = 2.0


@dataclass
class GateSnapshot:
    """What the gate's parts showed at ``time``. ``None``: that part did not answer."""

    time: float
    tripped: bool | None
    tripped_since: float | None  # when the gate's signal started (the source's own record)
    canary_weight: float | None  # percent of unpinned traffic to the canary, worst entry point
    pins_to_canary: bool | None
    sees: bool | None
    why: list[str] = field(default_factory=list)  # what could not be read, or why blind
    signal: str = ""  # which alert (or signal) fired

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: JsonObject) -> GateSnapshot:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in names})


class GateObserver(ABC):
    """Reads a gate's state; ``name`` is what the events' ``actor`` says."""

    name: str
    log: ObservationLog

    @abstractmethod
    def read(self, session: requests.Session) -> GateSnapshot:
        """What the gate's parts show now (never raises for a part that does not answer:
        that part is None and ``why`` says so)."""

    def snapshot(self, session: requests.Session) -> GateSnapshot:
        """``read``, kept in the log."""
        snap = self.read(session)
        self.log.append(snap)
        return snap


class ObservationLog:
    """Snapshots of one experiment: a JSON-lines file when ``path`` is given (shared by
    ``gameday run``'s sampler and the probes of ``chaos run``), else in memory."""

    _lock = threading.Lock()

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: list[GateSnapshot] = []

    def append(self, snap: GateSnapshot) -> None:
        if self.path is None:
            self._memory.append(snap)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(snap.to_json(), sort_keys=True) + "\n")

    def snapshots(self) -> list[GateSnapshot]:
        if self.path is None:
            return list(self._memory)
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash: the others stand
            if isinstance(doc, dict):
                out.append(GateSnapshot.from_json(doc))
        return sorted(out, key=lambda s: s.time)


def _event(seq: int, t: float, actor: str, change: JsonObject, reason: str) -> JsonObject:
    return {"seq": seq, "time": t, "actor": actor, "change": change, "reason": reason}


def history(snaps: list[GateSnapshot], actor: str) -> list[JsonObject]:
    """The snapshots as broker-shaped events, oldest first (module docstring)."""
    events: list[JsonObject] = []
    trip_t: float | None = None
    trip_signal = ""
    off_t: float | None = None
    for s in snaps:
        if s.tripped and trip_t is None:
            trip_t = min(s.time, s.tripped_since or s.time)
            trip_signal = s.signal
        if s.canary_weight == 0 and off_t is None:
            off_t = s.time
    if off_t is not None and (trip_t is None or off_t < trip_t):
        trip_t, trip_signal = off_t, trip_signal or "canary weight set to 0"
    if trip_t is not None:
        trip = {"test": trip_signal or "gate signal", "bucket": None, "samples": None}
        change = {"phase": {"old": "progressing", "new": "tripped"}, "trip": trip}
        events.append(_event(0, trip_t, actor, change, f"{trip_signal} fired"))
    if off_t is not None:
        routers: JsonObject = {"annotation": "routers_applied", "canary_off_at": off_t}
        events.append(_event(0, off_t, actor, {"weights": {"canary": 0}}, "canary weight 0"))
        events.append(_event(0, off_t, actor, routers, "every entry point gives the canary 0"))
        done = {"phase": {"old": "tripped", "new": "rolled_back"}}
        events.append(_event(0, off_t, actor, done, "canary weight 0 after the trip"))
    events.sort(key=lambda e: float(e["time"]))
    for i, e in enumerate(events, start=1):
        e["seq"] = i
    return events


def release_now(snaps: list[GateSnapshot], latest: GateSnapshot, release: str) -> JsonObject:
    """The release as the broker would show it: phase and weights, from the log."""
    events = history([*snaps, latest], "observer")
    phases = [e["change"]["phase"]["new"] for e in events if "phase" in e["change"]]
    phase = phases[-1] if phases else "progressing"
    weight = latest.canary_weight
    doc: JsonObject = {"name": release, "phase": phase, "revision": len(events)}
    if weight is not None:
        doc["weights"] = {"canary": weight, "stable": 100 - weight}
    doc["observed"] = latest.to_json()
    return doc


# ------------------------------------------------------------------- Envoy + an alert
def _find(doc: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in ``doc`` (Envoy's config dump nests deeply)."""
    found: list[Any] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == key:
                    found.append(v)
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class EnvoyAlertObserver(GateObserver):
    """The alert-driven gate most teams have: a Prometheus alert is the trip, Envoy's
    weighted clusters (their configured weights, overridden by the admin runtime under
    their ``runtime_key_prefix``) are the canary's weight, and a pin route's
    ``runtime_fraction`` key says whether pins still reach the canary."""

    def __init__(self, spec: AlertObserverSpec, log: ObservationLog) -> None:
        self.spec = spec
        self.log = log
        self.name = f"observer:{spec.kind}"
        self._routes: list[Any] | None = None  # the config dump's weighted clusters
        self._pin_default: float | None = None

    def _get(self, session: requests.Session, url: str) -> Any:
        resp = session.get(url, timeout=READ_TIMEOUT_S)
        resp.raise_for_status()
        return resp.json()

    def _static(self, session: requests.Session) -> list[Any]:
        if self._routes is None:
            dump = self._get(session, f"{self.spec.envoy_admin_url}/config_dump")
            self._routes = _find(dump, "weighted_clusters")
            key = self.spec.pin_runtime_key
            for frac in _find(dump, "runtime_fraction"):
                if isinstance(frac, dict) and frac.get("runtime_key") == key:
                    default = frac.get("default_value") or {}
                    self._pin_default = _number(default.get("numerator")) or 0.0
        return self._routes

    def weights(self, session: requests.Session) -> tuple[float | None, bool | None]:
        """The canary's share (percent) at the worst weighted route, and whether canary
        pins still route to it."""
        routes = self._static(session)
        runtime = self._get(session, f"{self.spec.envoy_admin_url}/runtime")
        entries = runtime.get("entries") or {}

        def value(key: str, default: float | None) -> float | None:
            entry = entries.get(key)
            got = _number(entry.get("final_value")) if isinstance(entry, dict) else None
            return default if got is None else got

        shares: list[float] = []
        for wc in routes:
            if not isinstance(wc, dict):
                continue
            prefix = wc.get("runtime_key_prefix")
            total, canary = 0.0, 0.0
            for cluster in wc.get("clusters") or []:
                weight = _number(cluster.get("weight"))
                if prefix:
                    weight = value(f"{prefix}.{cluster.get('name')}", weight)
                total += weight or 0.0
                if cluster.get("name") == self.spec.canary_cluster:
                    canary += weight or 0.0
            shares.append(100.0 * canary / total if total > 0 else 0.0)
        pins: bool | None = None
        if self.spec.pin_runtime_key:
            pins = (value(self.spec.pin_runtime_key, self._pin_default) or 0.0) > 0
        return (max(shares) if shares else None), pins

    def _labels_match(self, labels: JsonObject) -> bool:
        return all(labels.get(k) == v for k, v in self.spec.alert_labels.items())

    def alert(self, session: requests.Session) -> tuple[bool, float | None, str]:
        body = self._get(session, f"{self.spec.prometheus_url}/api/v1/alerts")
        firing = []
        for a in (body.get("data") or {}).get("alerts") or []:
            labels = a.get("labels") or {}
            if (
                labels.get("alertname") in self.spec.alerts
                and a.get("state") == "firing"
                and self._labels_match(labels)
            ):
                firing.append((_parse_time(a.get("activeAt")), str(labels["alertname"])))
        if not firing:
            return False, None, ""
        times = [t for t, _ in firing if t is not None]
        return True, (min(times) if times else None), ", ".join(sorted({n for _, n in firing}))

    def sees(self, session: requests.Session) -> list[str]:
        """Why the gate cannot see (empty: it can): its rules not loaded or failing, the
        stack's metrics not scraped."""
        why: list[str] = []
        rules = self._get(session, f"{self.spec.prometheus_url}/api/v1/rules")
        loaded = {}
        for group in (rules.get("data") or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                loaded[rule.get("name")] = rule
        for name in self.spec.alerts:
            rule = loaded.get(name)
            if rule is None:
                why.append(f"alert rule {name!r} is not loaded in Prometheus")
            elif rule.get("health") not in ("ok", "unknown"):
                why.append(f"alert rule {name!r} fails: {rule.get('lastError')}")
        if self.spec.scrape_job:
            targets = self._get(session, f"{self.spec.prometheus_url}/api/v1/targets")
            active = [
                t
                for t in (targets.get("data") or {}).get("activeTargets") or []
                if (t.get("labels") or {}).get("job") == self.spec.scrape_job
            ]
            if not active:
                why.append(f"Prometheus scrapes no target of job {self.spec.scrape_job!r}")
            for t in active:
                if t.get("health") != "up":
                    why.append(
                        f"Prometheus cannot scrape {t.get('scrapeUrl')}: {t.get('lastError')}"
                    )
        return why

    def read(self, session: requests.Session) -> GateSnapshot:
        now = time.time()
        problems: list[str] = []
        weight = pins = None
        tripped: bool | None = None
        since: float | None = None
        signal = ""
        sees: bool | None = None
        try:
            weight, pins = self.weights(session)
        except (requests.RequestException, ValueError) as exc:
            problems.append(f"Envoy's admin did not answer: {exc.__class__.__name__}: {exc}")
        try:
            tripped, since, signal = self.alert(session)
        except (requests.RequestException, ValueError) as exc:
            problems.append(f"Prometheus's alerts did not answer: {exc.__class__.__name__}")
        try:
            blind = self.sees(session)
            sees = not blind
            problems.extend(blind)
        except (requests.RequestException, ValueError) as exc:
            problems.append(f"Prometheus's rules did not answer: {exc.__class__.__name__}")
        return GateSnapshot(now, tripped, since, weight, pins, sees, problems, signal)


def _parse_time(text: Any) -> float | None:
    """Prometheus's RFC 3339 ``activeAt`` (nanoseconds allowed) as epoch seconds."""
    if not isinstance(text, str) or not text:
        return None
    from datetime import datetime

    head, _, rest = text.partition(".")
    frac = "".join(ch for ch in rest if ch.isdigit())
    zone = rest[len(frac) :] if rest else text[len(head) :]
    try:
        base = datetime.fromisoformat(head + (zone.replace("Z", "+00:00") or "+00:00"))
    except ValueError:
        return None
    return base.timestamp() + (float(f"0.{frac}") if frac else 0.0)


def observer_for(spec: ObserverSpec, observations: Path | None) -> GateObserver:
    """The observer a target file's ``observer:`` describes, keeping its snapshots in
    ``observations`` (None: in memory)."""
    log = ObservationLog(observations)
    if spec.kind == "envoy-prometheus-alert":
        return EnvoyAlertObserver(spec, log)
    from gameday.observers import kubernetes as k8s

    cls = {
        "argo-rollouts": k8s.ArgoRolloutsObserver,
        "flagger": k8s.FlaggerObserver,
        "k8s-route": k8s.RouteObserver,
    }[spec.kind]
    return cls(spec, log)
