"""Gate observers that read a release controller's objects on the Kubernetes API.

- ``ArgoRolloutsObserver``: an Argo Rollouts ``Rollout`` — a trip is an abort
  (``status.abort``, the ``RolloutAborted`` condition; its time ``status.abortedAt``); the
  canary weight is ``status.canary.weights.canary.weight`` (traffic routing reports it); the
  gate cannot see when the canary step's AnalysisRun is ``Error`` or ``Inconclusive``;
- ``FlaggerObserver``: a Flagger ``Canary`` — a trip is phase ``Failed`` (its time
  ``status.lastTransitionTime``); the weight is ``status.canaryWeight``;
- ``RouteObserver``: the route itself (Gateway API ``HTTPRoute`` or Istio
  ``VirtualService``) — the canary's share of the weighted backends; a trip is the moment
  that share reached 0 (whatever set it).

What a status means is ``gameday.evidence.controllers``'s (the harness's progressive
delivery probes read it the same way). ``get`` only: this module never changes anything in
the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import requests

from gameday.evidence import controllers as ctl
from gameday.observers.base import GateObserver, GateSnapshot, ObservationLog
from gameday.observers.specs import KubernetesObserverSpec

__all__ = ["ArgoRolloutsObserver", "FlaggerObserver", "RouteObserver", "route_share"]

CRDS = {
    "argo-rollouts": ("argoproj.io", "v1alpha1", "rollouts"),
    "flagger": ("flagger.app", "v1beta1", "canaries"),
    "HTTPRoute": ("gateway.networking.k8s.io", "v1beta1", "httproutes"),
    "VirtualService": ("networking.istio.io", "v1beta1", "virtualservices"),
}
BLIND_ANALYSIS = ("Error", "Inconclusive")


def _weight(ref: Mapping[str, object], default: float) -> float:
    """A backend's weight (``default`` when it gives none); ValueError when it is not a
    number (the snapshot says so)."""
    weight = ref.get("weight", default)
    if not isinstance(weight, int | float):
        raise ValueError(f"a route's weight is {weight!r}, not a number")
    return float(weight)


def route_share(obj: Mapping[str, object], kind: str, canary: str) -> float | None:
    """The canary backend's share (percent) of the worst weighted rule of a route; None
    when no rule names it. HTTPRoute: ``spec.rules[].backendRefs[]`` (``name``, ``weight``,
    default 1); VirtualService: ``spec.http[].route[]`` (``destination.host`` or
    ``.subset``, ``weight``, default 100 for a single destination)."""
    spec = ctl.as_object(obj.get("spec"))
    shares: list[float] = []
    if kind == "HTTPRoute":
        for rule in ctl.objects_of(spec.get("rules")):
            refs = ctl.objects_of(rule.get("backendRefs"))
            total = sum(_weight(r, 1) for r in refs)
            mine = sum(_weight(r, 1) for r in refs if r.get("name") == canary)
            if any(r.get("name") == canary for r in refs):
                shares.append(100.0 * mine / total if total > 0 else 0.0)
    else:
        for http in ctl.objects_of(spec.get("http")):
            routes = ctl.objects_of(http.get("route"))
            default = 100.0 if len(routes) == 1 else 0.0

            def names(r: Mapping[str, object]) -> tuple[object, object]:
                dest = ctl.as_object(r.get("destination"))
                return dest.get("subset"), dest.get("host")

            total = sum(_weight(r, default) for r in routes)
            hit = [r for r in routes if canary in names(r)]
            if hit:
                mine = sum(_weight(r, default) for r in hit)
                shares.append(100.0 * mine / total if total > 0 else 0.0)
    return max(shares) if shares else None


class _KubernetesObserver(GateObserver):
    kind = ""

    def __init__(self, spec: KubernetesObserverSpec, log: ObservationLog) -> None:
        self.spec = spec
        self.log = log
        self.name = f"observer:{spec.kind}"
        self._api: Any = None

    def _custom(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            api_client = config.new_client_from_config(
                config_file=self.spec.kubeconfig, context=self.spec.context
            )
            self._api = client.CustomObjectsApi(api_client)
        return self._api

    def _get(self, crd_key: str, name: str) -> Mapping[str, object]:
        group, version, plural = CRDS[crd_key]
        obj: Mapping[str, object] = self._custom().get_namespaced_custom_object(
            group, version, self.spec.namespace, plural, name
        )
        return obj

    def read(self, session: requests.Session) -> GateSnapshot:
        now = time.time()
        try:
            return self._read(now)
        except Exception as exc:  # the API's errors are many; the snapshot says which
            status = getattr(exc, "status", None)
            why = f"the Kubernetes API did not give {self.spec.name!r}: " + (
                f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
                if status
                else f"{exc.__class__.__name__}: {exc}"
            )
            return GateSnapshot(now, None, None, None, None, None, [why])

    def _read(self, now: float) -> GateSnapshot:
        raise NotImplementedError


class ArgoRolloutsObserver(_KubernetesObserver):
    def _read(self, now: float) -> GateSnapshot:
        obj = self._get("argo-rollouts", self.spec.name)
        view = ctl.argo_view(obj)
        weight = view["canary_weight"]
        tripped = bool(view["abort"])
        canary = ctl.as_object(ctl.as_object(obj.get("status")).get("canary"))
        why = []
        for key in ("currentStepAnalysisRunStatus", "currentBackgroundAnalysisRunStatus"):
            run = ctl.as_object(canary.get(key))
            if run.get("status") in BLIND_ANALYSIS:
                why.append(
                    f"AnalysisRun {run.get('name')!r} is {run.get('status')}: "
                    f"{run.get('message') or 'no message'}"
                )
        return GateSnapshot(
            now,
            tripped,
            view["aborted_at"] if tripped else None,
            float(weight) if isinstance(weight, int | float) else None,
            None,
            not why,
            why,
            "Rollout aborted" if tripped else "",
        )


class FlaggerObserver(_KubernetesObserver):
    def _read(self, now: float) -> GateSnapshot:
        view = ctl.flagger_view(self._get("flagger", self.spec.name))
        tripped = ctl.flagger_failed(view)
        weight = view["canary_weight"]
        return GateSnapshot(
            now,
            tripped,
            view["changed_at"] if tripped else None,
            float(weight) if isinstance(weight, int | float) else None,
            None,
            True,
            [],
            "Canary Failed" if tripped else "",
        )


class RouteObserver(_KubernetesObserver):
    def _read(self, now: float) -> GateSnapshot:
        kind = self.spec.route_kind
        share = route_share(self._get(kind, self.spec.name), kind, self.spec.canary_backend)
        why = [] if share is not None else [f"{kind} {self.spec.name!r} names no backend "
                                            f"{self.spec.canary_backend!r}"]  # fmt: skip
        return GateSnapshot(now, False, None, share, None, share is not None, why)
