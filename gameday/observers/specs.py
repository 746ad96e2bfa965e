"""What a target file's ``observer:`` says (``gameday.targets.external``): the gate
observer of an alert-driven gate, or one read from the Kubernetes API. Plain pydantic
models, below both the observers that read them and the target file that holds them.

This module must never import an observer or a target.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class AlertObserverSpec(BaseModel):
    """The gate observer (``gameday.observers``) of an alert-driven gate: the trip is a
    Prometheus alert (``prometheus_url``, ``alerts``), the weights are Envoy's
    (``envoy_admin_url``: the weighted clusters of its routes and the runtime that
    overrides them)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["envoy-prometheus-alert"] = "envoy-prometheus-alert"
    prometheus_url: str
    alerts: list[str] = Field(min_length=1)
    alert_labels: dict[str, str] = Field(default_factory=dict)
    envoy_admin_url: str
    canary_cluster: str = "canary"
    pin_runtime_key: str | None = None  # a route's runtime_fraction key for canary pins
    scrape_job: str | None = None  # Prometheus job whose targets must be up for the gate to see


class KubernetesObserverSpec(BaseModel):
    """A gate read from the Kubernetes API (``gameday.observers.kubernetes``): an Argo
    Rollouts ``Rollout`` (``kind: argo-rollouts``), a Flagger ``Canary`` (``flagger``), or
    the route's own weights (``k8s-route``: ``route_kind`` HTTPRoute or VirtualService,
    ``canary_backend`` the canary's backend name, host or subset), by ``namespace`` and
    ``name``, with ``kubeconfig``/``context`` (default: the current ones)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["argo-rollouts", "flagger", "k8s-route"]
    namespace: str
    name: str
    kubeconfig: str | None = None
    context: str | None = None
    route_kind: Literal["HTTPRoute", "VirtualService"] = "HTTPRoute"
    canary_backend: str = "canary"


ObserverSpec = Annotated[AlertObserverSpec | KubernetesObserverSpec, Field(discriminator="kind")]
