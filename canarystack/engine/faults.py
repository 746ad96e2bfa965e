"""The engine pod's fault kinds: ``kernel`` only — a quantized KV cache.

This module only describes faults; it never starts or stops anything.
"""

from __future__ import annotations

from typing import Literal

from canarystack.common.faults import FaultParams
from canarystack.engine.build_fault import RealBuildParams
from canarystack.engine.vllm import VllmKernelParams, fp8_kv_supported

CacheType = Literal["f16", "q8_0", "q4_0"]
# ggml_type ids that llama_cpp.server's --type_k/--type_v take (ggml.h).
GGML_TYPE_ID: dict[str, int] = {"f16": 1, "q4_0": 2, "q8_0": 8}
HEALTHY_CACHE: CacheType = "f16"
ENGINE_MODES = ("kv-quant", "fp8-kv-scale")
# The simulator's kernel modes (canarystack.model.faults) this pod cannot produce.
SIMULATOR_ONLY_MODES = ("nan-logits", "inf-logits", "garbage", "numerics", "quantized")


class EngineKernelParams(RealBuildParams):
    """The ``kernel`` fault of the engine pod: a quantized KV cache.

    ``{"kind": "kernel", "ttl_s": 60, "mode": "kv-quant", "cache_type": "q4_0"}`` rolls the
    pod's llama.cpp engine over to a K and V cache of ``cache_type`` (``q8_0`` or ``q4_0``);
    when the fault is cleared or its TTL ends, the pod rolls back to ``f16``. The fault acts
    on every prompt: a restarted engine cannot quantize some sequences and not others.

    For the harness's existing experiments the simulator's spelling is accepted too: ``mode:
    fp8-kv-scale`` (a KV-cache precision fault) maps to the same quantized cache, with
    ``min_prompt_tokens`` only 0 and ``magnitude`` only 1 — other values are refused, with a
    message saying why, rather than silently ignored.

    The simulator's other kernel modes are simulator-only: the broken-kernel modes
    ``nan-logits``, ``inf-logits`` and ``garbage`` (an engine whose numbers or text are
    broken) and the benign ``numerics`` and ``quantized``. A real llama.cpp engine cannot be
    made to produce them on request, so the engine pod refuses them with a 400 that names
    the modes it has (``kv-quant``, ``fp8-kv-scale``) and says to run the broken-kernel
    experiments against the simulator (``canarystack.model``).
    """

    ENGINE = "llama.cpp"
    MODES = ENGINE_MODES
    WHAT = "a quantized KV cache"
    REFUSED = SIMULATOR_ONLY_MODES
    SIZE = "its cache_type: q8_0 small, q4_0 large"

    mode: Literal["kv-quant", "fp8-kv-scale"] = "kv-quant"
    cache_type: Literal["q8_0", "q4_0"] = "q4_0"


FAULT_KINDS: dict[str, type[FaultParams]] = {"kernel": EngineKernelParams}
# The kernel fault of each engine kind (``--engine-kind``): a quantized KV cache for
# llama.cpp, a bad build (FP8 KV cache, bfloat16) for vLLM.
FAULT_KINDS_BY_ENGINE: dict[str, dict[str, type[FaultParams]]] = {
    "llamacpp": FAULT_KINDS,
    "vllm": {"kernel": VllmKernelParams},
}


def kernel_modes(engine_kind: str) -> list[str]:
    """The ``kernel`` fault's modes a pod of ``engine_kind`` can build on this machine (its
    ``/health`` ``kernel_modes``): the harness says *not applicable* to an experiment that
    needs another, before any fault (a simulator pod has every mode and says nothing)."""
    if engine_kind == "vllm":
        return [m for m in VllmKernelParams.MODES if "fp8" not in m or fp8_kv_supported()]
    return list(EngineKernelParams.MODES)
