"""The router's aiohttp app and its lifecycle: what starts with the app and stops with it.

This module must never hold request logic: the request path lives in ``handler``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from canarystack.broker.client import BrokerClient
from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.auth import FileToken, set_credentials
from canarystack.common.faults import FaultRegistry
from canarystack.common.logs import get_logger
from canarystack.router.api_spec import install as install_api_spec
from canarystack.router.handler import handle_models, handle_proxy
from canarystack.router.samples import GatePusher, SampleQueue
from canarystack.router.settings import (
    DEFAULT_MAX_BODY_BYTES,
    FAULT_KINDS,
    PROXIED_PATHS,
    ROUTER_VERSION,
    UPSTREAM_CONNECT_TIMEOUT_S,
    UPSTREAM_READ_TIMEOUT_S,
    RouterSettings,
)
from canarystack.router.state import STATE, RouterState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "RouterSettings", "build_app"]

BROKER_TOKEN: web.AppKey[str | None] = web.AppKey("router_broker_token", str)
# The heartbeat credential's file, read again when it changes (a rotated Kubernetes token).
BROKER_TOKEN_FILE: web.AppKey[str | None] = web.AppKey("router_broker_token_file", str)
GATE_TOKEN: web.AppKey[str | None] = web.AppKey("router_gate_token", str)
UPSTREAM_SESSION: web.AppKey[aiohttp.ClientSession | None] = web.AppKey(
    "router_upstream_session", aiohttp.ClientSession
)
CONTROL_SESSION: web.AppKey[aiohttp.ClientSession | None] = web.AppKey(
    "router_control_session", aiohttp.ClientSession
)


def default_upstream_session() -> aiohttp.ClientSession:
    """The session to the model servers: unbounded pool, streamed bodies passed on as they
    are; a connect timeout, and a read timeout for a stream that went silent."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=UPSTREAM_CONNECT_TIMEOUT_S, sock_read=UPSTREAM_READ_TIMEOUT_S
        ),
    )


def default_control_session() -> aiohttp.ClientSession:
    """The session to the broker and the gate (a few connections; each call has its own
    timeout)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16))


def _start_pusher(app: web.Application, st: RouterState, control: aiohttp.ClientSession) -> None:
    settings = st.settings
    assert settings.gate_url is not None
    queue = SampleQueue(
        settings.sample_queue_size,
        on_drop=lambda kind: st.metrics.samples_dropped.labels(kind=kind).inc(),
    )
    st.queue = queue
    st.metrics.sample_queue_len.set_function(lambda: float(len(queue)))
    st.pusher = GatePusher(
        control,
        settings.gate_url,
        queue,
        router_id=settings.router_id,
        release=settings.release,
        admin_token=app[GATE_TOKEN],
        wrong_credential=lambda: st.comp.faults.get("wrong_gate_credential") is not None,
        on_push=lambda result: st.metrics.gate_pushes.labels(result=result).inc(),
        on_auth_error=lambda status: st.metrics.auth_errors.labels(
            peer="gate", status=str(status)
        ).inc(),
        on_drop=lambda kind: st.metrics.samples_dropped.labels(kind=kind).inc(),
        flush_interval_s=settings.gate_flush_s,
    )
    st.pusher.start()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    settings = st.settings
    given_upstream, given_control = app[UPSTREAM_SESSION], app[CONTROL_SESSION]
    st.session = given_upstream or default_upstream_session()
    st.control = given_control or default_control_session()
    if settings.broker_url:
        token_file = app.get(BROKER_TOKEN_FILE)
        st.config.broker = BrokerClient(
            st.control,
            settings.broker_url,
            FileToken("--broker-token-file", token_file) if token_file else app[BROKER_TOKEN],
            actor=settings.router_id,
            capability="heartbeat",
        )
    if settings.gate_url:
        _start_pusher(app, st, st.control)
    await st.config.start()
    yield
    if st.shadow is not None:
        await st.shadow.close()
    if st.pusher is not None:
        await st.pusher.stop()
    await st.config.stop()
    if given_upstream is None:
        await st.session.close()
    if given_control is None:
        await st.control.close()


def build_app(
    settings: RouterSettings,
    admin_token: str | None,
    max_fault_ttl_s: float = 600.0,
    *,
    broker_token: str | None = None,
    broker_token_file: str | None = None,
    gate_token: str | None = None,
    upstream: aiohttp.ClientSession | None = None,
    control: aiohttp.ClientSession | None = None,
) -> web.Application:
    """``admin_token``: the router's fault credential; ``broker_token``: its heartbeat
    credential; ``gate_token``: its samples credential. The last two fall back to
    ``admin_token`` (single-credential mode). ``upstream`` / ``control``: the caller's
    HTTP sessions (module docstring), made on start when not given.

    ``build_app`` wires the rooms together: settings (``settings``), metrics (``metrics``),
    long-lived state (``state``), the request path (``handler``: intake, forwarding, the
    shadow session, the outcome). The two HTTP client sessions are the caller's to give, as
    httpx's ``transport=``: ``upstream`` (model servers: no total timeout, streamed, never
    decompressed) and ``control`` (broker and gate). A session handed in is used and left
    open (the caller owns it); one not handed in is made on start and closed on stop
    (``default_upstream_session`` / ``default_control_session``).
    """
    log = get_logger("router")
    faults = FaultRegistry("router", FAULT_KINDS, max_ttl_s=max_fault_ttl_s, log=log)
    comp = Component(
        name="router",
        version=ROUTER_VERSION,
        admin_token=admin_token,
        faults=faults,
        log=log,
    )
    state = RouterState(settings, comp)
    comp.health_extra = state.health
    app = create_app(comp, client_max_size=settings.max_body_bytes)
    app[STATE] = state
    set_credentials(app, admin_token, {BROKER_TOKEN: broker_token, GATE_TOKEN: gate_token})
    app[BROKER_TOKEN_FILE] = broker_token_file
    app[UPSTREAM_SESSION] = upstream
    app[CONTROL_SESSION] = control
    for path in PROXIED_PATHS:
        app.router.add_post(path, handle_proxy)
    app.router.add_get("/v1/models", handle_models)
    install_api_spec(app)
    app.cleanup_ctx.append(_lifecycle)
    assert app[COMPONENT] is comp
    return app
