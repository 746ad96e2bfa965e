"""The broker's aiohttp application keys, in a module of their own so that the HTTP layer
(``server``) and the OpenAPI description (``api_spec``) both import them without importing
each other."""

from __future__ import annotations

from aiohttp import web

from canarystack.broker.kube_identity import KubeRouterIdentity
from canarystack.broker.service import Broker

BROKER: web.AppKey[Broker] = web.AppKey("broker", Broker)
# Router identity by the Kubernetes API server (``--router-identity kubernetes``), if on.
KUBE_IDENTITY: web.AppKey[KubeRouterIdentity] = web.AppKey("kube_identity", KubeRouterIdentity)
# Events per page of history, at most (the HTTP layer's limit, which the spec publishes).
MAX_EVENTS_PER_PAGE = 10_000
