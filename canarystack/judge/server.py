"""The judge's HTTP service (docs/drift-judge.md):

- ``POST /v1/completions``, ``POST /v1/chat/completions``: a mirrored request (Envoy
  ``request_mirror_policies`` and friends). Answered at once, ``202 {"release",
  "result"}``: whether it was queued, or why not; the mirror throws the answer away.
  ``x-judge-release: NAME`` picks the release (default: the first ``--release``).
- ``GET /v1/analysis/{release}``: the verdict (``verdict.verdict_json``), what an Argo
  Rollouts ``web`` metric reads; ``GET /v1/analysis``: every release's.
- ``POST /v1/flagger``: a Flagger webhook (``rollout``, ``confirm-promotion``,
  ``pre-rollout``): 200 advances the canary, 412 halts it, with the verdict as the body.
- ``POST /v1/analysis/{release}/reset``: an operator's fresh start (admin token).
- ``GET /health``, ``GET /metrics`` (``canarystack.judge.metrics``), ``/admin/faults``.

This module must never make a mirrored request wait on an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypedDict

import aiohttp
from aiohttp import web

from canarystack.common.app import COMPONENT, Component, create_app
from canarystack.common.errors import (
    ApiError,
    BadRequest,
    json_response,
    parse_model,
    read_body,
    read_json_object,
)
from canarystack.common.faults import FaultRegistry
from canarystack.gate.state import GateConfig
from canarystack.judge.answers import FlaggerPayload, FlaggerVerdict, flagger_status
from canarystack.judge.api_spec import install as install_api_spec
from canarystack.judge.metrics import JudgeCollector
from canarystack.judge.service import Judge
from canarystack.judge.settings import JudgeSettings
from canarystack.model.body import json_object
from canarystack.router.routing import prompt_tokens_of

RELEASE_HEADER = "x-judge-release"
# Bodies above this are parsed off the event loop (a long prompt is ~100 KB).
OFF_LOOP_BYTES = 256 * 1024
FLAGGER_BODY_LIMIT = 64 * 1024

JUDGE: web.AppKey[Judge] = web.AppKey("judge", Judge)


class JudgeHealth(TypedDict):
    """The judge's fields of ``/health``: each release's verdict, the queue, in flight."""

    releases: dict[str, str]
    queue_depth: int
    inflight: int


def _parse(raw: bytes) -> tuple[dict[str, object], int]:
    body = json_object(raw)
    return body, prompt_tokens_of(body)


async def _mirrored(request: web.Request, chat: bool) -> web.Response:
    judge = request.app[JUDGE]
    target = judge.target(request.headers.get(RELEASE_HEADER))
    try:
        raw = await read_body(request, max_bytes=judge.settings.max_body_bytes)
        if len(raw) > OFF_LOOP_BYTES:
            body, tokens = await asyncio.get_running_loop().run_in_executor(None, _parse, raw)
        else:
            body, tokens = _parse(raw)
    except ApiError:
        judge.mirrored_total.labels(release=target.name, result="bad_request").inc()
        raise
    result = judge.offer(
        target,
        body,
        chat=chat,
        prompt_tokens=tokens,
        request_id=request.headers.get("x-request-id"),
    )
    return json_response({"release": target.name, "result": result}, status=202)


async def _completions(request: web.Request) -> web.Response:
    return await _mirrored(request, chat=False)


async def _chat(request: web.Request) -> web.Response:
    return await _mirrored(request, chat=True)


async def _analysis(request: web.Request) -> web.Response:
    return json_response(request.app[JUDGE].verdict(request.match_info["release"]))


async def _all(request: web.Request) -> web.Response:
    judge = request.app[JUDGE]
    return json_response({"releases": [judge.verdict(name) for name in judge.gates]})


async def _flagger(request: web.Request) -> web.Response:
    body = await read_json_object(request, max_bytes=FLAGGER_BODY_LIMIT, what="Flagger payload")
    payload = parse_model(FlaggerPayload, body, "Flagger payload")
    choice = (payload.metadata or {}).get("inconclusive", "fail")
    if choice not in ("fail", "pass"):
        raise BadRequest(
            f"Flagger payload: metadata.inconclusive is {choice!r}; give 'fail' (halt the "
            "canary while the judge cannot vouch for it, the default) or 'pass'.",
            param="metadata.inconclusive",
        )
    answer: FlaggerVerdict = {
        **request.app[JUDGE].verdict(payload.release),
        "flagger": {"name": payload.name, "namespace": payload.namespace, "phase": payload.phase},
    }
    status = flagger_status(answer, choice == "pass")
    if status != 200:
        # The error shape every 4xx has, the verdict beside it (Flagger logs the body).
        raise ApiError(
            f"The drift judge does not pass the canary of release {payload.release!r}: "
            f"{answer['verdict']}: {answer['reason']}",
            status=status,
            code=f"canary_{answer['verdict']}",
            extra=dict(answer),
        )
    return json_response(answer)


async def _reset(request: web.Request) -> web.Response:
    request.app[COMPONENT].require_admin(request)
    judge = request.app[JUDGE]
    name = request.match_info["release"]
    judge.verdict(name)  # 404 for a release not judged here
    return json_response(judge.reset(name))


async def _background(app: web.Application) -> AsyncIterator[None]:
    judge = app[JUDGE]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        task = asyncio.create_task(judge.run(session))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def build_app(
    config: GateConfig,
    settings: JudgeSettings,
    *,
    admin_token: str | None,
    max_fault_ttl_s: float,
) -> web.Application:
    comp = Component(
        name="judge",
        version="0.1.0",
        admin_token=admin_token,
        faults=FaultRegistry("judge", {}, max_ttl_s=max_fault_ttl_s),
    )
    judge = Judge(config, settings, comp.registry)
    comp.registry.register(JudgeCollector(judge))

    def health() -> JudgeHealth:
        return {
            "releases": {name: judge.verdict(name)["verdict"] for name in judge.gates},
            "queue_depth": judge.queue.qsize(),
            "inflight": judge.inflight,
        }

    comp.health_extra = health
    app = create_app(comp, client_max_size=settings.max_body_bytes)
    app[JUDGE] = judge
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/analysis", _all)
    app.router.add_get("/v1/analysis/{release}", _analysis)
    app.router.add_post("/v1/analysis/{release}/reset", _reset)
    app.router.add_post("/v1/flagger", _flagger)
    install_api_spec(app, judge)
    app.cleanup_ctx.append(_background)
    return app
