"""The rollback executor's HTTP API: manual rollbacks, status, faults (the loops and the
runners are ``canarystack.rollback.service``).

This module must never keep rollback progress only in memory: the broker's history is
the record, and a restart reads it back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from canarystack.broker.client import BrokerClient, BrokerNotFound, BrokerUnavailable
from canarystack.broker.wire import (
    ROLLBACK_MAX_BODY_BYTES,
    json_response,
    read_optional_object,
)
from canarystack.common.app import Component, create_app
from canarystack.common.auth import check_token, set_credentials
from canarystack.common.errors import ApiError, NotFound, parse_model
from canarystack.common.faults import FaultRegistry
from canarystack.common.logs import get_logger
from canarystack.rollback.api_spec import install as install_api_spec
from canarystack.rollback.executor import ExecutorConfig, RollbackRunner
from canarystack.rollback.keys import BROKER_TOKEN, OPERATOR_TOKEN, SERVICE
from canarystack.rollback.service import FAULT_KINDS, ManualRollback, RollbackService

# Names other modules read here (the service lives in ``service``).
__all__ = ["FAULT_KINDS", "SERVICE", "ManualRollback", "RollbackService", "build_app"]

_log = get_logger("rollback")


async def _post_rollback(request: web.Request) -> web.Response:
    """``POST /v1/rollbacks/{release}`` (``{"reason"}``): a manual rollback. Answers 202
    once step 1 is in the broker (so a crash after the answer still resumes), 200 when the
    release is already rolled back, 409 when there is nothing to roll back, or (code
    ``step_refused``) when the broker refused step 1; that refusal also makes ``/health``
    degraded (``refused_step: ...``) until the release changes or a new request comes."""
    service = request.app[SERVICE]
    # Who may ask for a manual rollback: the operator credential (--operator-token-file).
    check_token(
        request, request.app[OPERATOR_TOKEN], "operator credential", "--operator-token-file"
    )
    name = request.match_info["release"]
    service.runner(name)  # 404 before reading the body
    data = await read_optional_object(request, ROLLBACK_MAX_BODY_BYTES)
    body = None if data is None else parse_model(ManualRollback, data)
    status, result = await service.manual(name, body.reason if body else "")
    return json_response(result, status=status)


async def _get_rollback(request: web.Request) -> web.Response:
    """The steps done, with times, read from the broker's history (so they survive a
    restart of this process)."""
    service = request.app[SERVICE]
    name = request.match_info["release"]
    runner = service.runner(name)
    try:
        sit = await runner.situation()
    except BrokerNotFound:
        raise NotFound(f"The broker has no release {name!r}.", param="release") from None
    except BrokerUnavailable:
        body = runner.status()
        body["broker"] = "unavailable"
        return json_response(body)
    except ApiError:
        raise
    return json_response(runner.status(sit))


async def _background(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = BrokerClient(
            session,
            service.broker_url,
            app[BROKER_TOKEN],
            actor="rollback",
            capability="rollback",
        )
        for name in service.releases:
            service.runners[name] = RollbackRunner(
                client, name, service.config, hooks=service.hooks(name), log=_log
            )
            service._kicks[name] = asyncio.Event()
        tasks = [service.supervise("credential", service.check_credential(client))]
        for name in service.releases:
            tasks.append(service.supervise(f"drive:{name}", service.drive(name)))
            tasks.append(service.supervise(f"watch:{name}", service.watch(name, client)))
        yield
        service.stopping = True
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def build_app(
    broker_url: str,
    releases: Sequence[str],
    config: ExecutorConfig,
    *,
    admin_token: str | None,
    max_fault_ttl_s: float,
    broker_token: str | None = None,
    operator_token: str | None = None,
) -> web.Application:
    """``admin_token``: this executor's fault credential; ``broker_token``: its rollback
    credential at the broker; ``operator_token``: who may POST a manual rollback. The
    last two fall back to ``admin_token`` (single-credential mode)."""
    faults = FaultRegistry("rollback", FAULT_KINDS, max_ttl_s=max_fault_ttl_s)
    comp = Component(name="rollback", version="0.1.0", admin_token=admin_token, faults=faults)
    service = RollbackService(comp, broker_url, releases, config)
    comp.health_extra = service.health
    app = create_app(comp, client_max_size=ROLLBACK_MAX_BODY_BYTES)
    app[SERVICE] = service
    set_credentials(app, admin_token, {BROKER_TOKEN: broker_token, OPERATOR_TOKEN: operator_token})
    app.router.add_post("/v1/rollbacks/{release}", _post_rollback)
    app.router.add_get("/v1/rollbacks/{release}", _get_rollback)
    install_api_spec(app)
    app.cleanup_ctx.append(_background)
    return app
