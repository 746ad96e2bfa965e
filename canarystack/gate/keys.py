"""The gate's aiohttp application keys, in a module of their own so that the HTTP layer
(``server``) and the OpenAPI description (``api_spec``) both import them without importing
each other."""

from __future__ import annotations

from aiohttp import web

from canarystack.gate.service import GateService

SERVICE: web.AppKey[GateService] = web.AppKey("gate_service", GateService)
BROKER_TOKEN: web.AppKey[str | None] = web.AppKey("gate_broker_token", str)
SAMPLES_TOKEN: web.AppKey[str | None] = web.AppKey("gate_samples_token", str)
