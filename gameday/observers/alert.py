"""The alert-driven gate most teams have, observed: a Prometheus alert is the trip,
Envoy's weighted clusters (overridden by its admin runtime) are the canary's weight
(``gameday.observers`` says how snapshots become history). It only reads."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import requests

from gameday.observers.base import READ_TIMEOUT_S, GateObserver, GateSnapshot, ObservationLog
from gameday.observers.specs import AlertObserverSpec

__all__ = ["EnvoyAlertObserver"]


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

    def _labels_match(self, labels: Mapping[str, object]) -> bool:
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
