"""The model server's HTTP side: OpenAI/vLLM-compatible completions and chat completions
(streaming and not), ``/v1/models``, and the per-request bookkeeping (faults, capacity,
metrics, one ``request_done`` log line).

This module must never let a client's input reach a 500, and never block the event
loop for more than a few hundred tokens' worth of work.
"""

# Over 400 lines because it is one idea, the path of one simulated request (faults,
# queue, timed tokens, the answer); the body, capacity and rendering live elsewhere.

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, TypeVar

from aiohttp import web

from canarystack.common.app import Component
from canarystack.common.deadlines import REQUEST_DEADLINE_S, WRITE_TIMEOUT_S
from canarystack.common.error_fields import CanaryStackError
from canarystack.common.errors import ApiError, BadRequest, Unavailable
from canarystack.common.faults import FaultParams
from canarystack.common.logs import get_logger
from canarystack.common.write_progress import WriteProgress
from canarystack.dependency.client import DependencyClient, DependencyConfig, DependencyHealth
from canarystack.model.api_spec import install as install_api_spec
from canarystack.model.body import Limits, read_request
from canarystack.model.capacity import CapacityModel, SlotScheduler, sleep_until
from canarystack.model.contract import (
    RequestRecord,
    check_model_name,
    lookup_context,
    models_response,
    observe_token,
    resolve_max_tokens,
    response_headers,
    serve_logged,
)
from canarystack.model.engine import KernelFault, NextTokenModel
from canarystack.model.faults import (
    CRASH_EXIT_CODE,
    CrashParams,
    ErrorsParams,
    HangParams,
    KernelParams,
    LatencyParams,
)
from canarystack.model.generation import Generation, Output, echo_positions
from canarystack.model.metrics import ModelMetrics
from canarystack.model.render import DONE, Renderer
from canarystack.model.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
)

# Non-streaming answers make their tokens in batches of this size, yielding in between.
GENERATE_BATCH = 64
# How often a request hung by a ``hang`` fault checks whether the fault ended, its client
# left or its deadline passed.
HANG_POLL_S = 0.25

P = TypeVar("P", bound=FaultParams)


class DependencyField(TypedDict, total=False):
    """``dependency``, only when the server has one."""

    dependency: DependencyHealth


class ModelHealth(TypedDict):
    """The simulator's fields of ``/health`` (``dependency`` only with ``--redis-url``)."""

    dependency: NotRequired[DependencyHealth]
    model: str
    running: int
    waiting: int
    slots: int
    max_body_bytes: int
    build_kernel_fault: str | None


@dataclass(frozen=True)
class ServerConfig:
    version: str
    served_model_name: str = "default"
    family_seed: int = 0
    drift: float = 0.01
    capacity: CapacityModel = field(default_factory=CapacityModel)
    max_model_len: int = 16384
    default_max_tokens: int = 16
    max_body_bytes: int | None = None  # None: sized from max_model_len (model.body)
    # --kernel-fault: a known-bad build, this kernel fault on for the process's life (no
    # TTL; an injected kernel fault, while active, takes its place).
    build_kernel_fault: KernelFault | None = None
    # --redis-url and its options: the shared dependency (canarystack.dependency); None
    # serves without one (no x-dependency header).
    dependency: DependencyConfig | None = None
    # #27 finding 1: a write blocked this long means the client stopped reading (its stream
    # is cut and its slot freed); a request past this deadline is cut (common.deadlines).
    write_timeout_s: float = WRITE_TIMEOUT_S
    request_deadline_s: float = REQUEST_DEADLINE_S

    @property
    def limits(self) -> Limits:
        return Limits.for_model_len(self.max_model_len, self.max_body_bytes)


class SimulatedServerError(ApiError):
    status = 500
    type = "server_error"


@dataclass(frozen=True)
class _Plan:
    """How one request is generated and answered, once its faults are known."""

    gen: Generation
    renderer: Renderer
    extra_ttft_s: float  # a latency fault's extra time to first token
    itl_mult: float  # a latency fault's inter-token multiplier
    truncate: bool  # an errors fault cuts the answer half way
    max_tokens: int


class _Disconnected(CanaryStackError):
    """The client went away (or stopped reading, or the request's deadline passed): the
    answer ends here; the message is the request's logged error."""


class DeadlinePassed(ApiError):
    """A non-streamed request ran past the server's request deadline."""

    status = 504


class ModelServer:
    """The simulator's model server.

    A request goes: read the body within its limit and parse it strictly (``model.body``:
    413/400 naming the input; a body above ``OFF_LOOP_BYTES`` (64 KiB) is parsed in a worker
    thread) and validate (4xx naming the field) -> faults that act before the
    engine (crash, http errors) -> FIFO queue for a sequence slot -> first token at
    admission + prefill -> further tokens at absolute deadlines -> release the slot.

    Headers on every answer: ``x-model-version`` and ``x-request-id`` (the client's, or made
    here). The logged ``ttft_s`` is measured from the moment the handler starts to the moment
    the first content chunk has been handed to the transport (for a non-streaming answer,
    the simulated first-token time).
    """

    def __init__(self, config: ServerConfig, component: Component) -> None:
        self.config = config
        self.component = component
        self.log = component.log or get_logger(component.name)
        self.model = NextTokenModel(
            config.version, family_seed=config.family_seed, drift=config.drift
        )
        self.capacity = config.capacity
        self.scheduler = SlotScheduler(config.capacity.slots)
        self.metrics = ModelMetrics(
            component.registry,
            config.served_model_name,
            running=lambda: float(self.scheduler.running),
            waiting=lambda: float(self.scheduler.waiting),
        )
        self._rng = random.Random()
        self.created = int(time.time())
        self.limits = config.limits
        self.dependency = (
            DependencyClient(config.dependency, component.registry)
            if config.dependency is not None
            else None
        )

    # -- wiring ---------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        install_api_spec(app, max_model_len=self.config.max_model_len)
        if self.dependency is not None:
            app.on_cleanup.append(self._close_dependency)

    async def _close_dependency(self, app: web.Application) -> None:
        if self.dependency is not None:
            await self.dependency.close()

    def health_extra(self) -> ModelHealth:
        # The model serves without its dependency: /health stays "ok" and says how the
        # dependency is (a degraded dependency is shared, not this server's failure).
        extra: DependencyField = (
            {} if self.dependency is None else {"dependency": self.dependency.health()}
        )
        return {
            **extra,
            "model": self.config.served_model_name,
            "running": self.scheduler.running,
            "waiting": self.scheduler.waiting,
            "slots": self.capacity.slots,
            "max_body_bytes": self.limits.body_bytes,
            "build_kernel_fault": _describe_build_fault(self.config.build_kernel_fault),
        }

    async def models(self, request: web.Request) -> web.Response:
        return models_response(
            self.config.served_model_name,
            created=self.created,
            max_model_len=self.config.max_model_len,
            version=self.config.version,
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    # -- one request ------------------------------------------------------------------
    async def _handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        rec = RequestRecord.start(request)
        headers = response_headers(self.config.version, rec)
        return await serve_logged(
            rec,
            headers,
            self._serve(request, kind, rec, headers),
            log=self.log,
            version=self.config.version,
            model=self.config.served_model_name,
        )

    def _build_kernel_fault(self, prompt_tokens: int) -> KernelFault | None:
        """The build's own kernel fault (--kernel-fault) when it acts on this prompt."""
        built = self.config.build_kernel_fault
        if built is None or prompt_tokens < built.min_prompt_tokens:
            return None
        return built

    def _fault(self, kind: str, cls: type[P], prompt_tokens: int) -> P | None:
        params = self.component.faults.get(kind)
        if not isinstance(params, cls):
            return None
        threshold = getattr(params, "min_prompt_tokens", 0)
        return params if prompt_tokens >= threshold else None

    async def _serve(
        self, request: web.Request, kind: str, rec: RequestRecord, headers: dict[str, str]
    ) -> web.StreamResponse:
        parsed = await read_request(request, kind, self.limits)
        req, words, top_n = parsed.req, parsed.words, parsed.top_n
        prompt_field, max_tokens = parsed.prompt_field, parsed.max_tokens
        rec.stream = req.stream
        served = self.config.served_model_name
        check_model_name(req.model, served)
        n_prompt = len(words)
        rec.prompt_tokens = n_prompt
        if n_prompt == 0:
            raise BadRequest(
                f"'{prompt_field}' is empty: send at least one token of text.",
                param=prompt_field,
            )
        max_tokens = resolve_max_tokens(
            max_tokens,
            n_prompt,
            max_len=self.config.max_model_len,
            default_max_tokens=self.config.default_max_tokens,
            prompt_field=prompt_field,
        )
        if self.dependency is not None:
            words = await self._with_context(request, req, words, max_tokens, rec, headers)
            n_prompt = len(words)
            rec.prompt_tokens = n_prompt

        # Faults that act before the engine.
        crash = self._fault("crash", CrashParams, n_prompt)
        if crash is not None:
            self._crash(rec, crash)
        error_kind: str | None = None
        errors = self._fault("errors", ErrorsParams, n_prompt)
        if errors is not None and self._rng.random() < errors.rate:
            error_kind = errors.error_kind
            rec.error = f"fault_{error_kind}"
        if error_kind == "http_500":
            raise SimulatedServerError(
                "Simulated engine failure (an 'errors' fault with error_kind http_500 is "
                "active on this model server).",
                code="simulated_fault",
            )
        if error_kind == "http_503":
            raise Unavailable(
                "Simulated overload (an 'errors' fault with error_kind http_503 is active on "
                "this model server); retry later.",
                code="simulated_fault",
            )
        latency = self._fault("latency", LatencyParams, n_prompt)
        extra_ttft_s = latency.ttft_ms / 1000.0 if latency else 0.0
        itl_mult = latency.itl_multiplier if latency else 1.0
        kernel = self._fault("kernel", KernelParams, n_prompt)
        kernel_fault = kernel.engine_fault() if kernel else self._build_kernel_fault(n_prompt)
        kernel_scale = self.model.kernel_scale(n_prompt, kernel_fault)
        # A broken kernel does not know it is broken: nothing in the record says so.
        broken = self.model.broken_mode(n_prompt, kernel_fault)

        rng = random.Random(req.seed if req.seed is not None else self._rng.getrandbits(64))
        echo = None
        batch = None
        if isinstance(req, CompletionRequest) and req.echo:
            # The prompt scored as the engine reads it (a retrieved context first), in the
            # batch the answer runs in.
            batch = self.model.batch_key()
            prompt = req.prompt_text()
            context = words[: len(words) - len(prompt.split())]
            echo = (
                prompt,
                echo_positions(self.model, prompt, context, kernel_scale=kernel_scale, batch=batch),
            )
        gen = Generation(
            self.model,
            words,
            0 if error_kind == "empty" else max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            rng=rng,
            kernel_scale=kernel_scale,
            broken=broken,
            stop=req.stop_sequences,
            batch=batch,
        )
        if error_kind == "empty":
            gen.finish_reason = "stop"
        prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
        renderer = Renderer(
            kind,
            prefix + rec.request_id,
            int(time.time()),
            served,
            logprobs=top_n,
            include_usage=req.include_usage,
            broken=broken,
            echo=echo,
        )
        plan = _Plan(gen, renderer, extra_ttft_s, itl_mult, error_kind == "truncate", max_tokens)
        if req.stream:
            return await self._stream(request, rec, headers, plan)
        return await self._complete(request, rec, headers, plan)

    async def _with_context(
        self,
        request: web.Request,
        req: CompletionRequest | ChatCompletionRequest,
        words: list[str],
        max_tokens: int,
        rec: RequestRecord,
        headers: dict[str, str],
    ) -> list[str]:
        """The prompt's words with the retrieved context (when Redis has one and it fits
        the context window) in front, as a system context; ``x-dependency`` says whether
        the dependency answered (``ok``) or the answer goes without it (``degraded``)."""
        assert self.dependency is not None
        retrieved = await lookup_context(self.dependency, request, req, rec, headers)
        if retrieved is None:
            return words
        context = retrieved.split()
        if len(context) + len(words) + max_tokens > self.config.max_model_len:
            return words
        return [*context, *words]

    async def _admit(self, rec: RequestRecord) -> float:
        await self.scheduler.acquire()
        t_admit = time.monotonic()
        rec.queue_s = t_admit - rec.t_recv
        self.metrics.prompt_tokens.inc(rec.prompt_tokens)
        return t_admit

    async def _stream(
        self, request: web.Request, rec: RequestRecord, headers: dict[str, str], plan: _Plan
    ) -> web.StreamResponse:
        gen, renderer, itl_mult, truncate = plan.gen, plan.renderer, plan.itl_mult, plan.truncate
        resp = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)  # headers go out now, as vLLM's StreamingResponse does
        progress = WriteProgress(request.transport, self.config.write_timeout_s)
        t_admit = await self._admit(rec)
        cap = self.capacity
        sent = 0
        cut_after = max(1, plan.max_tokens // 2)
        try:
            if request.transport is None or request.transport.is_closing():
                raise _Disconnected("client_disconnected")
            piece = gen.next_piece()
            deadline = t_admit + cap.prefill_s(rec.prompt_tokens) + plan.extra_ttft_s
            await sleep_until(deadline)
            data = renderer.first_chunk()
            last_write = 0.0
            while True:
                nxt = gen.next_piece() if piece is not None else None
                if truncate and (sent >= cut_after or nxt is None):
                    self._cut(request)
                    rec.finish_reason = "abort"
                    return resp
                if nxt is None:
                    data += renderer.token_chunk(piece, gen.finish_reason, gen.stop_reason)
                    if renderer.include_usage:
                        data += renderer.usage_chunk(rec.prompt_tokens, gen.completion_tokens)
                    data += DONE
                else:
                    data += renderer.token_chunk(piece)
                await self._write(request, resp, data, progress)
                now = time.monotonic()
                if piece is not None:
                    sent += 1
                    observe_token(rec, self.metrics, now, last_write)
                last_write = now
                if nxt is None:
                    rec.finish_reason = gen.finish_reason
                    break
                piece = nxt
                data = b""
                hang = self._hang(rec, sent)
                if hang is not None and hang.interval_s > 0:
                    deadline = max(deadline, now) + hang.interval_s  # one event per interval_s
                elif hang is not None:
                    await self._while_hung(request, rec)
                    deadline = time.monotonic()
                else:
                    deadline += cap.itl_s(self.scheduler.running, self._rng) * itl_mult
                await sleep_until(deadline)
                self._check_deadline(request, rec)
        except _Disconnected as gone:
            rec.error = str(gone) or "client_disconnected"
            rec.finish_reason = "abort"
        finally:
            rec.completion_tokens = sent
            self._finish(rec)
        return resp

    async def _complete(
        self, request: web.Request, rec: RequestRecord, headers: dict[str, str], plan: _Plan
    ) -> web.StreamResponse:
        gen, renderer, itl_mult = plan.gen, plan.renderer, plan.itl_mult
        t_admit = await self._admit(rec)
        cap = self.capacity
        try:
            if self._fault("hang", HangParams, rec.prompt_tokens) is not None:
                try:
                    await self._while_hung(request, rec)
                except _Disconnected as gone:
                    rec.error, rec.finish_reason = str(gone), "abort"
                    return web.Response(status=499, headers=headers)
                t_admit = time.monotonic()
            t_first = t_admit + cap.prefill_s(rec.prompt_tokens) + plan.extra_ttft_s
            pieces = []
            while not gen.finished:
                for _ in range(GENERATE_BATCH):
                    piece = gen.next_piece()
                    if piece is None:
                        break
                    pieces.append(piece)
                else:
                    await asyncio.sleep(0)  # let streams write between batches
            out = Output(pieces, gen.finish_reason, gen.stop_reason, gen.completion_tokens)
            t_last = t_first
            for i in range(max(0, len(pieces) - 1)):
                gap = cap.itl_s(self.scheduler.running, self._rng) * itl_mult
                self.metrics.itl_s.observe(gap)
                t_last += gap
                if i % GENERATE_BATCH == GENERATE_BATCH - 1:
                    await asyncio.sleep(0)
            end = rec.t_recv + self.config.request_deadline_s
            await sleep_until(min(t_last, end))
            if t_last > end:
                raise DeadlinePassed(
                    f"The answer would take {t_last - rec.t_recv:.0f} s, past this server's "
                    f"request deadline ({self.config.request_deadline_s:g} s, "
                    "--request-deadline-s); ask for fewer max_tokens or stream the answer.",
                    code="request_deadline",
                )
            if pieces:
                rec.ttft_s = t_first - rec.t_recv
                self.metrics.ttft_s.observe(rec.ttft_s)
            # Built in steps (a few dozen positions each), yielding in between: 20
            # alternatives over thousands of tokens would otherwise hold the loop.
            steps = renderer.full_response_steps(out, rec.prompt_tokens)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    body = bytes(done.value)
                    break
                await asyncio.sleep(0)
            rec.completion_tokens = out.completion_tokens
            if plan.truncate:
                resp = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
                resp.content_length = len(body)
                await resp.prepare(request)
                try:
                    await self._write(request, resp, body[: len(body) // 2])
                except _Disconnected:
                    pass
                self._cut(request)
                rec.finish_reason = "abort"
                return resp
            rec.finish_reason = out.finish_reason
            return web.Response(body=body, content_type="application/json", headers=headers)
        finally:
            self._finish(rec)

    async def _write(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        data: bytes,
        progress: WriteProgress | None = None,
    ) -> None:
        """One write; a client that takes nothing for ``write_timeout_s`` (a blocked write,
        or ``progress`` seeing its bytes wait untaken) stopped reading: its connection is
        cut, so its slot is freed now, not when the generation ends."""
        timer = asyncio.timeout(self.config.write_timeout_s)
        try:
            async with timer:
                await resp.write(data)
        except TimeoutError:
            if not timer.expired():
                raise
            self._cut(request)
            raise _Disconnected("client_stalled") from None
        except (ConnectionError, RuntimeError):
            # aiohttp raises ClientConnectionResetError (a ConnectionError) or, on a
            # closing transport, RuntimeError: the client is gone either way.
            raise _Disconnected("client_disconnected") from None
        if progress is not None and progress.wrote(len(data)):
            self._cut(request)
            raise _Disconnected("client_stalled")

    def _hang(self, rec: RequestRecord, sent: int) -> HangParams | None:
        """The active ``hang`` fault, once this request sent its ``after_events``."""
        hang = self._fault("hang", HangParams, rec.prompt_tokens)
        return hang if hang is not None and sent >= hang.after_events else None

    async def _while_hung(self, request: web.Request, rec: RequestRecord) -> None:
        """Send nothing while a ``hang`` fault lasts (its TTL bounds it); ``_Disconnected``
        when the client leaves or the request's deadline passes meanwhile."""
        rec.error = "hung"
        while self._fault("hang", HangParams, rec.prompt_tokens) is not None:
            if request.transport is None or request.transport.is_closing():
                raise _Disconnected("client_disconnected")
            self._check_deadline(request, rec)
            await asyncio.sleep(HANG_POLL_S)
        rec.error = None

    def _check_deadline(self, request: web.Request, rec: RequestRecord) -> None:
        """Past the request deadline: the stream is cut (no ``[DONE]``)."""
        if time.monotonic() - rec.t_recv > self.config.request_deadline_s:
            self._cut(request)
            raise _Disconnected("request_deadline")

    @staticmethod
    def _cut(request: web.Request) -> None:
        """Drop the connection mid-response: no terminating chunk, no [DONE]."""
        transport = request.transport
        if transport is not None:
            transport.abort()

    def _finish(self, rec: RequestRecord) -> None:
        self.scheduler.release()
        e2e_s = time.monotonic() - rec.t_recv
        self.metrics.e2e_s.observe(e2e_s)
        self.metrics.generation_tokens.inc(rec.completion_tokens)
        self.metrics.success[rec.finish_reason or "abort"].inc()

    def _crash(self, rec: RequestRecord, crash: CrashParams) -> None:
        self.log.error(
            "crash_fault",
            request_id=rec.request_id,
            prompt_tokens=rec.prompt_tokens,
            min_prompt_tokens=crash.min_prompt_tokens,
            exit_code=CRASH_EXIT_CODE,
        )
        # Like a CUDA OOM killing the engine: no cleanup, no answers to anyone in flight.
        os._exit(CRASH_EXIT_CODE)


def _describe_build_fault(fault: KernelFault | None) -> str | None:
    """``MODE:MIN_PROMPT_TOKENS`` of a --kernel-fault build, None for a healthy one."""
    return None if fault is None else f"{fault.mode}:{fault.min_prompt_tokens}"
