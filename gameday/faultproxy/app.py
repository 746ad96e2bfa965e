"""The fault proxy's aiohttp application: ``create_app(upstream, token)``.

Routes the proxy owns (everything else goes to the upstream untouched, ``/health``,
``/metrics`` and ``/v1/models`` included):

- ``GET /admin/health`` -> ``{"status": "ok", "upstream": URL, "active_faults": N}``;
- ``GET /admin/metrics`` -> the proxy's own Prometheus metrics (``metrics``);
- ``GET|POST|DELETE /admin/faults``, ``DELETE /admin/faults/{id}`` (``registry``), behind
  ``Authorization: Bearer <token>``; bodies at most ``FAULT_BODY_LIMIT`` bytes, each key
  once.

This module must never answer an admin request with a 5xx for bad input, nor log a
request line per relayed request (there is no access log).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from canary_contract import strictjson
from gameday.faultproxy.errors import (
    BadRequest,
    PayloadTooLarge,
    Unauthorized,
    error_middleware,
    json_answer,
)
from gameday.faultproxy.logs import JsonLog
from gameday.faultproxy.metrics import ProxyMetrics
from gameday.faultproxy.registry import DEFAULT_MAX_FAULTS, DEFAULT_MAX_TTL_S, FaultRegistry
from gameday.faultproxy.relay import ProxyState, Relay

TOKEN_ENV = "GAMEDAY_FAULT_PROXY_TOKEN"
FAULT_BODY_LIMIT = 16 * 1024
# The largest request body relayed (a long prompt with its messages is well below this).
RELAY_BODY_LIMIT = 64 * 1024 * 1024
# How often expired faults are pruned (and their expiry logged) without a request.
SWEEP_INTERVAL_S = 0.5
CONNECT_TIMEOUT_S = 10.0

STATE = web.AppKey("fault_proxy_state", ProxyState)
TOKEN = web.AppKey("fault_proxy_token", str)


def _printable(text: str) -> bool:
    return all(" " <= ch <= "~" for ch in text)


def check_token(request: web.Request) -> None:
    """401 unless the request carries the proxy's token as ``Authorization: Bearer``."""
    headers = request.headers.getall("Authorization", [])
    if len(headers) > 1:
        raise Unauthorized(
            f"{len(headers)} Authorization headers sent: send exactly one, "
            "'Authorization: Bearer <token>'."
        )
    header = headers[0] if headers else ""
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if not _printable(header) or scheme.lower() != "bearer" or not given:
        raise Unauthorized(
            "Missing fault credential: send 'Authorization: Bearer <token>' with the token "
            f"the fault proxy was started with (--token-file, or {TOKEN_ENV})."
        )
    if not hmac.compare_digest(given.encode(), request.app[TOKEN].encode()):
        raise Unauthorized(
            "Wrong credential in the Authorization header: /admin/faults takes only the "
            f"token the fault proxy was started with (--token-file, or {TOKEN_ENV})."
        )


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise BadRequest(f"Fault body has the key {key!r} twice: send each field once.")
        seen[key] = value
    return seen


async def read_fault_body(request: web.Request) -> dict[str, Any]:
    """The body of ``POST /admin/faults`` as a JSON object, or 400/413 saying why not."""
    too_large = PayloadTooLarge(
        f"Fault body is too large: the limit is {FAULT_BODY_LIMIT} bytes; a fault is a "
        "handful of fields.",
        code="body_too_large",
    )
    if request.content_length is not None and request.content_length > FAULT_BODY_LIMIT:
        raise too_large
    raw = await request.content.read(FAULT_BODY_LIMIT + 1)
    if len(raw) > FAULT_BODY_LIMIT:
        raise too_large
    if not raw.strip():
        raise BadRequest(
            'Fault body is empty: send a JSON object like {"kind": ..., "ttl_s": ...}.'
        )
    try:
        data = strictjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"Fault body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest(
            f"Fault body must be a JSON object, got {type(data).__name__}: "
            'send {"kind": ..., "ttl_s": ..., ...params}.'
        )
    json.loads(raw, object_pairs_hook=_refuse_duplicates)
    return data


def _actor(request: web.Request) -> str:
    actor = request.headers.get("x-actor", "admin")
    return actor if _printable(actor) else "admin"


async def list_faults(request: web.Request) -> web.Response:
    check_token(request)
    return json_answer({"faults": request.app[STATE].registry.to_json()})


async def inject_fault(request: web.Request) -> web.Response:
    check_token(request)
    body = await read_fault_body(request)
    registry = request.app[STATE].registry
    fault, replaced = registry.inject(body, actor=_actor(request))
    answer = fault.to_json(time.monotonic())
    answer["replaced"] = [old.id for old in replaced]
    return json_answer(answer, status=201)


async def clear_fault(request: web.Request) -> web.Response:
    check_token(request)
    registry = request.app[STATE].registry
    fault = registry.clear(request.match_info["fault_id"], actor=_actor(request))
    return json_answer({"cleared": [fault.to_json(time.monotonic())]})


async def clear_all(request: web.Request) -> web.Response:
    check_token(request)
    now = time.monotonic()
    cleared = request.app[STATE].registry.clear_all(actor=_actor(request))
    return json_answer({"cleared": [f.to_json(now) for f in cleared]})


async def other_method(request: web.Request) -> web.Response:
    raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST", "DELETE"])


async def health(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return json_answer(
        {"status": "ok", "upstream": str(st.upstream), "active_faults": len(st.registry.active())}
    )


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    counts = dict.fromkeys(st.registry.kinds, 0)
    for fault in st.registry.active():
        counts[fault.kind] += 1
    for kind, n in counts.items():
        st.metrics.active_faults.labels(kind=kind).set(n)
    resp = web.Response(body=generate_latest(st.metrics.registry))
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def _session(app: web.Application) -> AsyncIterator[None]:
    """The one pooled upstream session, and the sweep that logs expiries on time."""
    st = app[STATE]
    st.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )

    async def sweep() -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            st.registry.active()  # prunes and logs expiry

    task = asyncio.create_task(sweep())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await st.session.close()


def create_app(
    upstream: str,
    token: str,
    *,
    max_faults: int = DEFAULT_MAX_FAULTS,
    max_ttl_s: float = DEFAULT_MAX_TTL_S,
    log: JsonLog | None = None,
    proxy_metrics: ProxyMetrics | None = None,
) -> web.Application:
    """The proxy in front of ``upstream`` (an http(s) base URL), its admin API behind
    ``token``."""
    log = log or JsonLog()
    state = ProxyState(
        upstream=URL(upstream.rstrip("/")),
        registry=FaultRegistry(max_faults=max_faults, max_ttl_s=max_ttl_s, log=log),
        metrics=proxy_metrics or ProxyMetrics(),
        log=log,
    )
    app = web.Application(middlewares=[error_middleware], client_max_size=RELAY_BODY_LIMIT)
    app[STATE] = state
    app[TOKEN] = token
    app.router.add_get("/admin/health", health)
    app.router.add_get("/admin/metrics", metrics)
    app.router.add_get("/admin/faults", list_faults)
    app.router.add_post("/admin/faults", inject_fault)
    app.router.add_delete("/admin/faults", clear_all)
    app.router.add_route("*", "/admin/faults", other_method)
    app.router.add_delete("/admin/faults/{fault_id}", clear_fault)
    app.router.add_route("*", "/admin/faults/{fault_id}", other_method)
    app.router.add_route("*", "/{tail:.*}", Relay(state))
    app.cleanup_ctx.append(_session)
    return app
