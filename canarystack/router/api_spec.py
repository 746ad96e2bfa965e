"""The router's OpenAPI description (``GET /openapi.json``; docs/ARCHITECTURE.md §5).

The router proxies the model server's two generation operations, so it describes them
with ``canarystack.model.api_spec.describe_generation`` (the same pydantic request models),
plus the headers it reads itself: the pin (``x-canary-variant``) and the user key
(``x-user-id``). This module must never change how a request is handled.
"""

from __future__ import annotations

from aiohttp import web

from canarystack.common.apispec import STRING, ApiSpec, Param, error_response
from canarystack.common.openapi import add_describer
from canarystack.model.api_spec import describe_generation, describe_models


def describe(spec: ApiSpec, app: web.Application) -> None:
    from canarystack.router.routing import PIN_HEADER, USER_HEADER

    pin = Param(
        PIN_HEADER,
        "header",
        {"type": "string", "enum": ["baseline", "canary"]},
        "pin the variant (any other value is a 400); pinned traffic is never gate evidence",
    )
    user = Param(USER_HEADER, "header", STRING, "the user key of sticky canary routing")
    describe_generation(
        spec,
        max_model_len=None,
        extra_params=[pin, user],
        extra_responses={
            409: error_response("pinned to a canary whose effective weight is 0 (code canary_off)"),
        },
    )
    describe_models(spec)


def install(app: web.Application) -> None:
    """Describe the router's routes in its ``/openapi.json``."""
    add_describer(app, describe)
