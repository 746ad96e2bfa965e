"""``python -m canarystack.model``: run one simulated model-server process.

Options beyond the shared ones (``canarystack.common.cli``): the version and served model
name, the model family and drift, the batch noise (``--batch-noise``, ``--noise-seed``),
and every capacity-model parameter. This module must
never do work at import time; everything happens in ``main()``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
from collections.abc import Sequence
from typing import get_args

from canarystack.common.auth import describe_admin_flag
from canarystack.common.cli import base_parser, entry, parse
from canarystack.common.deadlines import REQUEST_DEADLINE_S, WRITE_TIMEOUT_S
from canarystack.dependency.cli import add_dependency_options, dependency_from_args
from canarystack.model.body import ADMIN_BODY_BYTES, BYTES_PER_TOKEN, ENVELOPE_BYTES
from canarystack.model.capacity import CapacityModel
from canarystack.model.contract import (
    COMPONENT,
    add_default_max_tokens_option,
    add_identity_options,
    check_shared_options,
    run_model_server,
)
from canarystack.model.engine import BATCH_NOISE_KL, MAX_BATCH_NOISE, KernelFault, NextTokenModel
from canarystack.model.faults import FAULT_KINDS, KernelParams
from canarystack.model.server import ModelHealth, ModelServer, ServerConfig

MIN_BODY_BYTES = 4096
# The modes of the injectable ``kernel`` fault, which --kernel-fault builds in.
KERNEL_MODES: tuple[str, ...] = get_args(KernelParams.model_fields["mode"].annotation)


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(
        COMPONENT,
        "A simulated LLM engine behind an OpenAI-compatible API (completions and chat, "
        "streaming, logprobs), with a capacity model and injectable faults.",
    )
    g = p.add_argument_group("model")
    add_identity_options(g)
    g.add_argument(
        "--family-seed",
        type=int,
        default=0,
        help="seed of the model family every version shares (default %(default)s)",
    )
    g.add_argument(
        "--drift",
        type=float,
        default=0.01,
        help="mean KL (nats) of this version's next-token distributions against another "
        "version with the same drift; 0 = the family's base model (default %(default)s)",
    )
    n = p.add_argument_group(
        "batch noise (non-batch-invariant numerics)",
        "Real GPU engines are not batch-invariant: the same prompt gets slightly different "
        "logits in batches of different sizes (reduction order in matmul, attention and "
        "norm kernels; He et al., 'Defeating Nondeterminism in LLM Inference', Thinking "
        "Machines 2025: 80 distinct greedy completions of one prompt in 1000 runs of "
        "Qwen3-235B under varying load; vLLM's VLLM_BATCH_INVARIANT=1 removes it). Each "
        "response here carries a logit perturbation keyed by this process's --noise-seed "
        "and the running-request count at its admission, so two healthy replicas differ "
        "slightly and the gate's noise floor is > 0. The default size is a chosen order "
        "of magnitude (neither source states a KL): the router's top-5 KL between two "
        "replicas reads ~0.9e-3 and ~2% of top-1 tokens flip. Off unless asked for.",
    )
    n.add_argument(
        "--batch-noise",
        type=float,
        default=0.0,
        help="mean KL (nats, whole vocabulary) between the same prompt's next-token "
        f"distributions in two different batches, at most {MAX_BATCH_NOISE:g}; "
        f"{BATCH_NOISE_KL:g} is the calibrated size every stack runs with "
        "(canarystack.cluster.spec); 0 = batch-invariant, bit-identical replicas and the "
        "engine's pure reference (default %(default)g)",
    )
    n.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        help="this process's batch-noise seed (default: from the host name and --port, and "
        "the PID when --port is 0, so replicas differ)",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=16384,
        help="context window in tokens (default %(default)s)",
    )
    add_default_max_tokens_option(g)
    g.add_argument(
        "--kernel-fault",
        metavar="MODE[:MIN_PROMPT_TOKENS]",
        default=None,
        help="start as a known-bad BUILD: this kernel fault is on for the life of the "
        "process, on every prompt of at least MIN_PROMPT_TOKENS tokens (default 2048). "
        "It is a property of the build (what a bad rollout ships), not an injected "
        "fault: it has no TTL, DELETE /admin/faults does not clear it, only a process "
        "started without the flag (a rollback to the previous build) is healthy again. "
        f"MODE is one of the 'kernel' fault's: {', '.join(KERNEL_MODES)}. /health "
        "shows it as build_kernel_fault; the responses do not (a broken kernel does "
        "not know it is broken). Default: none, a healthy build",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted (bytes; 413 above it); default: "
        f"--max-model-len x {BYTES_PER_TOKEN} + {ENVELOPE_BYTES} (the JSON envelope)",
    )
    c = p.add_argument_group("capacity model")
    c.add_argument("--slots", type=int, default=32, help="sequence slots (default %(default)s)")
    c.add_argument(
        "--ttft-base-ms",
        type=float,
        default=20.0,
        help="TTFT floor after admission (ms, default %(default)s)",
    )
    c.add_argument(
        "--prefill-ms-per-1k",
        type=float,
        default=50.0,
        help="prefill time per 1,000 prompt tokens (ms, default %(default)s)",
    )
    c.add_argument(
        "--itl-ms",
        type=float,
        default=5.0,
        help="decode time per token, idle (ms, default %(default)s)",
    )
    c.add_argument(
        "--itl-batch-k",
        type=float,
        default=1.0,
        help="inter-token latency = itl x (1 + k x running/slots) (default %(default)s)",
    )
    c.add_argument(
        "--itl-jitter",
        type=float,
        default=0.05,
        help="relative jitter of each inter-token gap, in [0, 1) (default %(default)s)",
    )
    d = p.add_argument_group("deadlines (#27; docs/stack.md says why each default)")
    d.add_argument(
        "--write-timeout-s",
        type=float,
        default=WRITE_TIMEOUT_S,
        help="one write to a client blocked this long: it stopped reading, its stream is cut "
        "and its slot freed (default %(default)s)",
    )
    d.add_argument(
        "--request-deadline-s",
        type=float,
        default=REQUEST_DEADLINE_S,
        help="a request past this many seconds is cut (streamed) or answered 504 (not "
        "streamed) (default %(default)s)",
    )
    add_dependency_options(p)
    describe_admin_flag(p)  # a model pod holds only its own faults-model-<variant>
    return p


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerConfig:
    if args.slots < 1:
        parser.error(f"--slots {args.slots}: give at least 1 sequence slot")
    for option, value in (
        ("--ttft-base-ms", args.ttft_base_ms),
        ("--prefill-ms-per-1k", args.prefill_ms_per_1k),
        ("--itl-ms", args.itl_ms),
        ("--itl-batch-k", args.itl_batch_k),
    ):
        if not value >= 0:  # also refuses nan
            parser.error(f"{option} {value}: give a number >= 0")
    if not 0 <= args.itl_jitter < 1:
        parser.error(f"--itl-jitter {args.itl_jitter}: give a fraction in [0, 1), e.g. 0.05")
    try:
        capacity = CapacityModel(
            slots=args.slots,
            ttft_base_s=args.ttft_base_ms / 1000.0,
            prefill_s_per_1k=args.prefill_ms_per_1k / 1000.0,
            itl_base_s=args.itl_ms / 1000.0,
            itl_batch_k=args.itl_batch_k,
            itl_jitter=args.itl_jitter,
        )
    except ValueError as exc:
        parser.error(f"capacity model: {exc}")
    if not args.drift >= 0:
        parser.error(f"--drift {args.drift}: give a mean KL >= 0 (e.g. 0.01)")
    if not 0 <= args.batch_noise <= MAX_BATCH_NOISE:  # also refuses nan
        parser.error(
            f"--batch-noise {args.batch_noise}: give a mean KL in [0, {MAX_BATCH_NOISE:g}] "
            f"(e.g. {BATCH_NOISE_KL:g}; 0 turns the batch noise off)"
        )
    for option, value in (
        ("--write-timeout-s", args.write_timeout_s),
        ("--request-deadline-s", args.request_deadline_s),
    ):
        if not 0 < value < float("inf"):
            parser.error(f"{option} {value}: give a finite number of seconds > 0, e.g. 10")
    if args.max_model_len < 2:
        parser.error(f"--max-model-len {args.max_model_len}: give at least 2 tokens")
    if args.max_body_bytes is not None and args.max_body_bytes < MIN_BODY_BYTES:
        parser.error(
            f"--max-body-bytes {args.max_body_bytes}: give at least {MIN_BODY_BYTES} "
            "(or leave it out to size it from --max-model-len)"
        )
    check_shared_options(args, parser)
    kernel_fault = (
        parse_kernel_fault(args.kernel_fault, parser) if args.kernel_fault is not None else None
    )
    return ServerConfig(
        version=args.version,
        served_model_name=args.served_model_name,
        family_seed=args.family_seed,
        drift=args.drift,
        capacity=capacity,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        max_body_bytes=args.max_body_bytes,
        build_kernel_fault=kernel_fault,
        dependency=dependency_from_args(args, parser),
        write_timeout_s=args.write_timeout_s,
        request_deadline_s=args.request_deadline_s,
    )


def parse_kernel_fault(value: str, parser: argparse.ArgumentParser) -> KernelFault:
    """``MODE[:MIN_PROMPT_TOKENS]`` of --kernel-fault, or a usage error naming it."""
    mode, sep, tokens = value.partition(":")
    if mode not in KERNEL_MODES:
        parser.error(
            f"--kernel-fault {value!r}: unknown mode {mode!r}; give one of "
            f"{', '.join(KERNEL_MODES)}, optionally with :MIN_PROMPT_TOKENS "
            "(e.g. --kernel-fault fp8-kv-scale:2048)"
        )
    min_prompt_tokens = 2048
    if sep:
        if not (tokens.isascii() and tokens.isdigit()) or len(tokens) > 9:
            parser.error(
                f"--kernel-fault {value!r}: MIN_PROMPT_TOKENS {tokens!r} is not a whole "
                "number of tokens >= 0 (e.g. --kernel-fault nan-logits:1024)"
            )
        min_prompt_tokens = int(tokens)
    return KernelFault(mode=mode, min_prompt_tokens=min_prompt_tokens, magnitude=1.0)


def default_noise_seed(port: int) -> int:
    """A seed that differs between replicas: host name and port (a pod's host name is its
    own), and the PID when the port is picked by the system."""
    where = f"{socket.gethostname()}:{port}:{os.getpid() if port == 0 else ''}"
    return int.from_bytes(hashlib.blake2b(where.encode(), digest_size=8).digest(), "little")


class SimulatorHealth(ModelHealth):
    """``/health``'s fields of ``canarystack.model``: the server's, and its batch noise."""

    batch_noise: float
    noise_seed: int


def with_batch_noise(server: ModelServer, batch_noise: float, noise_seed: int) -> ModelServer:
    """Give ``server`` an engine with batch noise keyed by its own running count at
    admission, and show the noise in ``/health``. (``ServerConfig`` has no noise fields:
    the engine is swapped here, before the server answers anything.)"""
    config = server.config
    server.model = NextTokenModel(
        config.version,
        family_seed=config.family_seed,
        drift=config.drift,
        batch_noise=batch_noise,
        noise_seed=noise_seed,
        running=lambda: server.scheduler.running,
    )
    health = server.health_extra

    def health_extra() -> SimulatorHealth:
        return {**health(), "batch_noise": batch_noise, "noise_seed": noise_seed}

    server.health_extra = health_extra  # type: ignore[method-assign]
    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parse(parser, argv)
    config = config_from_args(args, parser)
    seed = args.noise_seed if args.noise_seed is not None else default_noise_seed(args.port)
    run_model_server(
        args,
        config.version,
        FAULT_KINDS,
        lambda component: with_batch_noise(ModelServer(config, component), args.batch_noise, seed),
        client_max_size=ADMIN_BODY_BYTES,  # the model routes read with model.body
    )


if __name__ == "__main__":
    entry(main)
