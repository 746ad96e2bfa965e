"""The rollback executor's aiohttp application keys, in a module of their own so that the HTTP layer
(``server``) and the OpenAPI description (``api_spec``) both import them without importing
each other."""

from __future__ import annotations

from aiohttp import web

from canarystack.rollback.service import RollbackService

SERVICE: web.AppKey[RollbackService] = web.AppKey("rollback_service", RollbackService)
BROKER_TOKEN: web.AppKey[str | None] = web.AppKey("broker_token", str)
OPERATOR_TOKEN: web.AppKey[str | None] = web.AppKey("operator_token", str)
