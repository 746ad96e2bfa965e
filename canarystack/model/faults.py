"""The model server's fault kinds: their parameters (validated, typos refused) and what
each does to a request (on each ``*Params`` class).

The TTL, listing and logging come from ``canarystack.common.faults``. This module must
never decide timing or touch the network; it only describes faults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from canarystack.common.faults import FaultParams
from canarystack.model.engine import KernelFault

CRASH_EXIT_CODE = 137


class KernelParams(FaultParams):
    """``kernel``  (``mode``, ``min_prompt_tokens``, ``magnitude``): the faulty kernel, acting
    only on prompts at or above the threshold. ``fp8-kv-scale`` (the default): the
    next-token distributions drift, growing with length and ``magnitude``
    (``canarystack.model.engine``). The broken modes (``magnitude`` is ignored):
    ``nan-logits`` (every logprob ``NaN`` on the wire, token id 0 at every position),
    ``inf-logits`` (every logprob ``-Infinity``, text unchanged) and ``garbage`` (unrelated
    tokens, ``"logprobs": null`` even when asked for); ``canarystack.model.render`` shows
    the exact shapes. The benign modes, healthy builds a gate must *not* trip on
    (``min_prompt_tokens: 0`` makes them act on every prompt): ``numerics`` (another
    batch-noise profile, as a tensor-parallel or batch-size change gives: a fixed
    perturbation of ``magnitude**2`` times the process's ``--batch-noise`` on top of its
    own batch noise) and ``quantized`` (a small drift independent of the prompt length,
    q8_0-like: mean KL ``1.5e-4 * magnitude**2``).
    """

    mode: Literal[
        "fp8-kv-scale", "nan-logits", "inf-logits", "garbage", "numerics", "quantized"
    ] = "fp8-kv-scale"
    min_prompt_tokens: int = Field(default=2048, ge=0)
    magnitude: float = Field(default=1.0, ge=0, le=10, allow_inf_nan=False)

    def engine_fault(self) -> KernelFault:
        return KernelFault(
            mode=self.mode, min_prompt_tokens=self.min_prompt_tokens, magnitude=self.magnitude
        )


class LatencyParams(FaultParams):
    """``latency`` (``ttft_ms``, ``itl_multiplier``, ``min_prompt_tokens``): extra time to
    first token and slower decoding.
    """

    ttft_ms: float = Field(default=0.0, ge=0, le=600_000, allow_inf_nan=False)
    itl_multiplier: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False)
    min_prompt_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _does_something(self) -> LatencyParams:
        if self.ttft_ms == 0 and self.itl_multiplier == 1.0:
            raise ValueError(
                "a latency fault needs ttft_ms > 0 or itl_multiplier != 1 "
                '(e.g. {"kind": "latency", "ttl_s": 60, "ttft_ms": 500})'
            )
        return self


ErrorKind = Literal["http_500", "http_503", "truncate", "empty"]


class ErrorsParams(FaultParams):
    """``errors``  (``rate``, ``error_kind``, ``min_prompt_tokens``): a share of requests
    fails as http_500, http_503, truncate (the stream is cut mid-way) or empty (a
    completion without tokens).
    """

    rate: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    error_kind: ErrorKind = "http_500"
    min_prompt_tokens: int = Field(default=0, ge=0)


class CrashParams(FaultParams):
    """``crash``   (``min_prompt_tokens``): the process exits with code 137 (like a CUDA OOM)
    when a prompt at or above the threshold arrives.
    """

    min_prompt_tokens: int = Field(default=0, ge=0)


class HangParams(FaultParams):
    """``hang``    (``after_events``, ``interval_s``, ``min_prompt_tokens``): the engine hangs
    (#27 finding 2). A stream sends its headers and ``after_events`` token events, then
    nothing (``interval_s`` 0) or one more token event every ``interval_s`` seconds, never
    ``[DONE]``; a non-streamed request never answers. A hung request resumes when the fault
    ends (its TTL, or a clear), and ends when its client leaves or its deadline passes.
    """

    after_events: int = Field(default=1, ge=0, le=10_000)
    interval_s: float = Field(default=0.0, ge=0, le=3600, allow_inf_nan=False)
    min_prompt_tokens: int = Field(default=0, ge=0)


FAULT_KINDS: dict[str, type[FaultParams]] = {
    "kernel": KernelParams,
    "latency": LatencyParams,
    "errors": ErrorsParams,
    "crash": CrashParams,
    "hang": HangParams,
}
