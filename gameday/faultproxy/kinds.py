"""The fault proxy's fault kinds: their parameters, validated (typos refused), and what each
does to a request that reaches an inference route (``/v1/completions``,
``/v1/chat/completions``). Every other path is always passed through untouched.

This module must never decide timing or touch the network; it only describes faults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The kernel fault's default threshold, the reference simulator's: a faulty kernel shows
# only on long prompts.
KERNEL_MIN_PROMPT_TOKENS = 2048


class FaultParams(BaseModel):
    """Base for a kind's parameters: unknown fields are refused, so a typo shows."""

    model_config = ConfigDict(extra="forbid")


class LatencyParams(FaultParams):
    """``latency`` (``ttft_ms``, ``itl_ms``, ``min_prompt_tokens``): ``ttft_ms`` more before
    the request goes upstream (so before the first byte), ``itl_ms`` more before each
    streamed event after the first (a non-streamed answer waits ``itl_ms`` per completion
    token after the first, read from its ``usage``)."""

    ttft_ms: float = Field(default=0.0, ge=0, le=600_000, allow_inf_nan=False)
    itl_ms: float = Field(default=0.0, ge=0, le=60_000, allow_inf_nan=False)
    min_prompt_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _does_something(self) -> LatencyParams:
        if self.ttft_ms == 0 and self.itl_ms == 0:
            raise ValueError(
                "a latency fault needs ttft_ms > 0 or itl_ms > 0 "
                '(e.g. {"kind": "latency", "ttl_s": 60, "ttft_ms": 500})'
            )
        return self


ErrorKind = Literal["http_500", "http_503", "truncate", "error_body", "empty"]


class ErrorsParams(FaultParams):
    """``errors`` (``rate``, ``error_kind``, ``min_prompt_tokens``, ``seed``): a share
    ``rate`` of the requests fails, drawn from a random sequence seeded with ``seed`` (one
    per fault, so a run is repeatable). ``http_500`` / ``http_503``: an OpenAI-shaped JSON
    error with that status, the upstream never asked; ``truncate``: the answer is cut half
    way (a stream after half of ``max_tokens`` token events, never ``[DONE]``; a body after
    half its bytes) and the connection closed; ``error_body``: HTTP 200 carrying an
    OpenAI-shaped error (a JSON body, or one SSE ``data: {"error": ...}`` event then
    ``[DONE]``, as vLLM streams an error); ``empty``: a completion without tokens
    (``finish_reason`` "stop", ``completion_tokens`` 0)."""

    rate: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    error_kind: ErrorKind = "http_500"
    min_prompt_tokens: int = Field(default=0, ge=0)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


class HangParams(FaultParams):
    """``hang`` (``mode``, ``interval_s``, ``min_prompt_tokens``): the upstream is never
    asked while the fault is active. A streamed request gets 200, SSE headers and one
    opening event, then ``headers_then_silence``: nothing; ``trickle``: an SSE comment every
    ``interval_s``; never ``[DONE]``: when the fault ends the connection is closed. A
    non-streamed request gets no answer until the fault ends (it is then passed upstream as
    usual) or the client leaves."""

    mode: Literal["headers_then_silence", "trickle"] = "headers_then_silence"
    interval_s: float = Field(default=1.0, ge=0.01, le=3600, allow_inf_nan=False)
    min_prompt_tokens: int = Field(default=0, ge=0)


KernelMode = Literal["fp8-kv-scale", "nan-logits", "inf-logits", "garbage", "numerics", "quantized"]


class KernelParams(FaultParams):
    """``kernel`` (``mode``, ``magnitude``, ``min_prompt_tokens``, ``seed``): a faulty kernel
    on prompts of at least ``min_prompt_tokens`` (default 2048), acting on the answer as it
    passes (``gameday.faultproxy.drift``). ``fp8-kv-scale``: every position's top
    logprobs drift so that KL(baseline top-k || drifted top-k, both renormalised) is
    ``0.05 * magnitude**2`` nats, and on a share ``min(0.5, 0.1 * magnitude)`` of the
    positions the top token flips to the best other candidate (the text changes too);
    ``nan-logits``: every logprob ``NaN`` on the wire and every position's text the first
    one's (argmax over NaN is the first index); ``inf-logits``: every logprob ``-Infinity``,
    text unchanged; ``garbage``: unrelated words for text and ``"logprobs": null``.
    The benign modes, healthy builds a gate must *not* trip on (as canarystack's model
    server has them): ``quantized`` (a small drift, KL ``1.5e-4 * magnitude**2``, no
    flips) and ``numerics`` (batch-noise-sized, KL ``2e-5 * magnitude**2``, no flips).
    ``magnitude`` acts on
    ``fp8-kv-scale`` only; ``seed`` picks the drift's direction (the same prompt drifts the
    same way every time, as a real kernel does)."""

    mode: KernelMode = "fp8-kv-scale"
    magnitude: float = Field(default=1.0, ge=0, le=10, allow_inf_nan=False)
    min_prompt_tokens: int = Field(default=KERNEL_MIN_PROMPT_TOKENS, ge=0)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


FAULT_KINDS: dict[str, type[FaultParams]] = {
    "latency": LatencyParams,
    "errors": ErrorsParams,
    "hang": HangParams,
    "kernel": KernelParams,
}
