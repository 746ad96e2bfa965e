"""One ``llama_cpp.server`` child process: its command line, start, readiness, stop.

This module must never kill anything but the PID it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NotRequired, TypedDict

import aiohttp

from canarystack.engine import vllm
from canarystack.engine.faults import GGML_TYPE_ID, HEALTHY_CACHE

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0
READY_POLL_S = 0.1
# Shares no prefix (beyond BOS) with the load generator's pseudo-word prompts: llama.cpp
# reuses a matching prompt prefix, which would make the next request's TTFT look low.
WARMUP_PROMPT = "0 1 2 3 4 5 6 7 8 9"
WARMUP_TIMEOUT_S = 120.0  # a fresh vLLM on a busy 2-core machine: its first request ~20 s


class WarmUpBody(TypedDict):
    """A warm-up request's own fields (the model and temperature 0 are added to each)."""

    max_tokens: int
    prompt: NotRequired[str]
    logprobs: NotRequired[int]
    messages: NotRequired[list[dict[str, str]]]


@dataclass(frozen=True)
class EngineSettings:
    model_path: Path
    served_model_name: str
    n_ctx: int = 8192
    n_threads: int = 1
    # Logical and physical batch size of prompt processing (llama.cpp's n_batch = n_ubatch).
    # A different value changes the matmul shapes and so the float rounding: a real source
    # of benign nondeterminism (full-vocabulary KL ~1e-5 for 8 against 512 on this model),
    # where a different thread count is bit-identical on CPU (measured, docs/engine.md).
    n_batch: int = 512
    python: str = sys.executable
    log_path: Path | None = None  # child stdout/stderr (None: discarded)
    # Which engine the children are: llama.cpp (llama_cpp.server, in this Python), or
    # vLLM (its OpenAI server, in ``python`` = the vLLM environment's; canarystack.engine.vllm).
    kind: str = "llamacpp"
    omp_bind: str | None = None  # vLLM: the cores its OpenMP threads use (e.g. "0" or "1")
    # The pod's own build (``--kernel-fault``: a known-bad build rolled out as a new pod):
    # the variant it serves for its life when no fault asks for another. None: healthy.
    build: str | None = None

    @property
    def own_build(self) -> str:
        """The variant the pod serves with no injected fault: its ``build``, else the
        healthy one, f16 cache (llama.cpp) or fp32 (vLLM)."""
        if self.build is not None:
            return self.build
        return vllm.HEALTHY_VARIANT if self.kind == "vllm" else HEALTHY_CACHE

    @property
    def engine_name(self) -> str:
        return "vLLM" if self.kind == "vllm" else "llama_cpp.server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(settings: EngineSettings, cache_type: str, port: int) -> list[str]:
    """The child's command line for ``cache_type`` (a vLLM child: ``vllm.command``, for
    its variant).

    Settings that matter (../shared/MEASURED.md):

    - ``--n_ctx`` explicitly (the server's default is 2048);
    - ``--flash_attn true`` on every variant: a quantized V cache needs flash attention, so
      the healthy f16 baseline uses it too and the fault changes only the cache type;
    - ``--interrupt_requests false``: by default a new request *interrupts* the one being
      generated; the engine must queue them instead (it generates one request at a time);
    - ``--chat_format llama-2``: what the server falls back to for a GGUF without a chat
      template, named so the pod counts chat prompt tokens with the same template.
    """
    if settings.kind == "vllm":
        return vllm.command(settings, cache_type, port)
    type_id = str(GGML_TYPE_ID[cache_type])
    return [
        settings.python, "-m", "llama_cpp.server",
        "--model", str(settings.model_path),
        "--model_alias", settings.served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(settings.n_ctx),
        "--n_threads", str(settings.n_threads),
        "--n_threads_batch", str(settings.n_threads),
        "--n_batch", str(settings.n_batch), "--n_ubatch", str(settings.n_batch),
        "--flash_attn", "true",
        "--type_k", type_id, "--type_v", type_id,
        "--interrupt_requests", "false",
        "--chat_format", "llama-2",
        "--verbose", "false",
    ]  # fmt: skip


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class EngineChild:
    """A started (or starting) engine server (llama.cpp for one KV-cache type, or vLLM
    for one build variant).

    The child listens on a private loopback port that only its pod talks to. It is started
    with ``PR_SET_PDEATHSIG`` (Linux), so a pod that is SIGKILLed — a pod kill in a game day —
    takes its engine with it instead of leaving an orphan holding memory and a port. It is
    stopped by its PID: SIGTERM, then SIGKILL after a grace period.
    """

    def __init__(self, settings: EngineSettings, cache_type: str) -> None:
        self.settings = settings
        self.cache_type = cache_type
        self.port = free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_mono: float | None = None
        self.ready_mono: float | None = None
        self.inflight = 0
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def start(self) -> None:
        """Fork the server (from the event-loop thread: PDEATHSIG follows the forking
        thread, so a worker thread's exit would kill the child)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.settings.log_path is not None:
            self.settings.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.settings.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        self.started_mono = time.monotonic()
        self.popen = subprocess.Popen(
            command(self.settings, self.cache_type, self.port),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # only a prctl() call runs between fork and exec
            preexec_fn=_die_with_parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self._env()},
        )

    def _env(self) -> dict[str, str]:
        if self.settings.kind != "vllm":
            return {}
        return vllm.child_env(self.settings, self.cache_type)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Until ``/v1/models`` answers 200; raises RuntimeError if the child exits or
        the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.exit_code()
            if code is not None:
                raise RuntimeError(
                    f"{self.settings.engine_name} exited with code {code} while starting"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(
                    self.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    if resp.status == 200:
                        await resp.read()
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.settings.engine_name} did not answer within {timeout_s:g}s"
                )
            await asyncio.sleep(READY_POLL_S)
        self.ready_mono = time.monotonic()

    async def warm_up(self, session: aiohttp.ClientSession) -> None:
        """Short requests, so the first real one does not pay first-use costs (a fresh
        vLLM's first chat request took ~16 s here: its chat path is warmed too)."""
        model = self.settings.served_model_name
        warm: list[tuple[str, WarmUpBody]] = [
            ("/v1/completions", {"prompt": WARMUP_PROMPT, "max_tokens": 2, "logprobs": 5}),
        ]
        if self.settings.kind == "vllm":
            messages = [{"role": "user", "content": WARMUP_PROMPT}]
            warm.append(("/v1/chat/completions", {"messages": messages, "max_tokens": 2}))
        for path, body in warm:
            async with session.post(
                self.url + path,
                json={"model": model, "temperature": 0, **body},
                timeout=aiohttp.ClientTimeout(total=WARMUP_TIMEOUT_S),
            ) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"warm-up request to {path} answered {resp.status}")

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM by PID, then SIGKILL after ``grace_s``; waits for the exit."""
        popen = self.popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGKILL)
                while popen.poll() is None:
                    await asyncio.sleep(0.02)
        if self._log is not None:
            self._log.close()
            self._log = None


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return "(child output discarded; start the pod with --engine-log to keep it)"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no child log)"
