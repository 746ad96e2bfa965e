"""Chaos Toolkit actions that harm the target: latency, a faulty canary, pod kills, clearing.

Every fault has a TTL the component itself enforces, goes to every replica of the
component, and is written to the run's fault ledger and the release's history. These
actions never kill by name and never act outside the target's blast radius.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from chaoslib.exceptions import ActivityFailed

from gameday import faults as gd_faults
from gameday.run.collect import read_json
from probes._context import (
    Configuration,
    InjectedFault,
    inject_fault,
    ledger,
    on_target,
    positive,
    run_dir,
    write_run_json,
)

__all__ = [
    "break_gate_credential",
    "clear_faults",
    "hang_canary",
    "inject_errors",
    "inject_latency",
    "kill_pod",
    "make_canary_faulty",
    "pause_pod",
    "record_external_fault",
    "resume_paused_pods",
]

# What ``pause_pod`` stopped (and whether it resumed it), in the run folder.
PAUSED_FILE = "paused_pods.json"

MAX_TTL_S = 600.0
MAX_LATENCY_MS = 60_000.0
# fp8-kv-scale: drift; nan-logits / inf-logits / garbage: a broken kernel; numerics /
# quantized: benign builds the gate must not trip on (canarystack.model.faults).
# A real engine's builds (canarystack.engine): kv-quant (llama.cpp), fp8-kv and bf16 (vLLM),
# and vLLM's benign one, threads (two OpenMP threads).
KERNEL_MODES = (
    *("fp8-kv-scale", "nan-logits", "inf-logits", "garbage", "numerics", "quantized"),
    *("kv-quant", "fp8-kv", "bf16", "threads"),
)
MODEL_ROLES = ("model", "model-baseline", "model-canary")


# What the actions below return to ``chaos run`` (the journal keeps it).
class Resumed(TypedDict):
    resumed: list[str]  # the pods' names


class KilledPod(TypedDict):
    component: str
    replica: str
    killed_at: float
    detail: Mapping[str, object]


class ClearedFault(TypedDict):
    component: str
    replica: str
    kind: str
    fault_id: str | None
    already_gone: bool  # the component had dropped it already (expired, or restarted)


class ClearedFaults(TypedDict):
    cleared: int
    faults: list[ClearedFault]


class RecordedFault(TypedDict):
    component: str
    kind: str
    recorded_at: float
    fault_id: str | None


def inject_latency(
    component: str,
    ms: float,
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Slow every replica of ``component`` by ``ms`` milliseconds for ``ttl_s`` seconds.

    Router, broker, gate: ``ms`` before each request is handled; rollback executor:
    ``ms`` before each rollback step; model servers: ``ms`` more time to first token.
    Returns the replicas, fault ids and the injection time.

    Components: ``router``, ``broker``, ``gate``, ``rollback``, ``model-baseline``,
    ``model-canary``, or ``model`` for both model roles::

        - type: action
          name: slow-the-router
          provider:
            type: python
            module: probes.faults
            func: inject_latency
            arguments: {component: router, ms: 200, ttl_s: 90}
    """
    ms = positive("ms", ms, MAX_LATENCY_MS)
    ttl_s = positive("ttl_s", ttl_s, MAX_TTL_S)
    params = {"ttft_ms": ms} if component in MODEL_ROLES else {"ms": ms}
    what = f"injecting {ms:g} ms of latency into {component}"
    return inject_fault(configuration, what, component, "latency", ttl_s, params)


ERROR_KINDS = ("http_500", "http_503", "truncate", "empty", "error_body")


def inject_errors(
    component: str = "model-canary",
    rate: float = 1.0,
    error_kind: str = "http_500",
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Make a share ``rate`` of the requests of a model role fail as ``error_kind``
    (``http_500``, ``http_503``, ``truncate``, ``empty``; ``error_body``: a 200 whose body
    is an error, fault proxy only) for ``ttl_s`` seconds: the bad canary every gate, even
    an alert on errors, must catch::

        - type: action
          name: canary-fails
          provider: {type: python, module: probes.faults, func: inject_errors,
                     arguments: {component: model-canary, rate: 1.0, ttl_s: 90}}
    """
    if component not in MODEL_ROLES:
        raise ActivityFailed(
            f"argument component is {component!r}: use one of {', '.join(MODEL_ROLES)}"
        )
    if error_kind not in ERROR_KINDS:
        raise ActivityFailed(
            f"argument error_kind is {error_kind!r}: use one of {', '.join(ERROR_KINDS)}"
        )
    rate = positive("rate", rate, 1.0)
    ttl_s = positive("ttl_s", ttl_s, MAX_TTL_S)
    params = {"rate": rate, "error_kind": error_kind}
    what = f"making {component} fail ({error_kind}, rate {rate:g})"
    return inject_fault(configuration, what, component, "errors", ttl_s, params)


def hang_canary(
    after_events: int = 1,
    interval_s: float = 0.0,
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Hang the canary's engine (the model server's ``hang`` fault): a stream sends its
    headers and ``after_events`` events, then nothing (``interval_s`` 0) or one event every
    ``interval_s`` seconds, never ``[DONE]``; a non-streamed request never answers. The
    silence the router's deadlines must cut and the gate must see::

        - type: action
          name: canary-hangs
          provider: {type: python, module: probes.faults, func: hang_canary,
                     arguments: {after_events: 1, interval_s: 15, ttl_s: 120}}
    """
    try:
        events = int(after_events)
    except (TypeError, ValueError):
        raise ActivityFailed(
            f"argument after_events must be an integer, got {after_events!r}"
        ) from None
    if not 0 <= events <= 10_000:
        raise ActivityFailed(f"argument after_events must be from 0 to 10000, got {events}")
    interval = float(interval_s)
    if not 0 <= interval <= 3600:
        raise ActivityFailed(f"argument interval_s must be from 0 to 3600 s, got {interval_s!r}")
    ttl_s = positive("ttl_s", ttl_s, MAX_TTL_S)
    params = {"after_events": events, "interval_s": interval}
    return inject_fault(configuration, "hanging the canary", "model-canary", "hang", ttl_s, params)


def pause_pod(
    component: str,
    seconds: float = 30.0,
    replica: str | None = None,
    configuration: Configuration | None = None,
) -> gd_faults.PausedPod:
    """SIGSTOP one pod of ``component`` (by PID) for ``seconds``, then SIGCONT it: a hung
    process (its port accepts, nothing answers). Blocks for ``seconds``: run it with
    ``background: true`` to act meanwhile; ``resume_paused_pods`` as a rollback resumes it
    if the run is interrupted::

        - type: action
          name: gate-hangs
          background: true
          provider: {type: python, module: probes.faults, func: pause_pod,
                     arguments: {component: gate, seconds: 30}}
    """
    seconds = positive("seconds", seconds, MAX_TTL_S)

    def record(stopped: gd_faults.PausedPod) -> None:
        write_run_json(configuration, PAUSED_FILE, {"pods": [stopped]})

    with on_target(configuration, f"pausing a pod of {component}") as target:
        out = gd_faults.pause_pod(target, component, seconds, replica, on_stopped=record)
    record(out)
    return out


def resume_paused_pods(configuration: Configuration | None = None) -> Resumed:
    """SIGCONT every pod ``pause_pod`` stopped and did not resume (by PID, when it still
    runs the same command). Idempotent: safe as a rollback after any failure."""
    data = read_json(run_dir(configuration) / PAUSED_FILE) or {}
    resumed = []
    with on_target(configuration, "resuming paused pods") as target:
        resume = getattr(target, "resume_pod", None)
        for pod in data.get("pods") or []:
            if pod.get("resumed_at") is None and callable(resume) and resume(pod):
                resumed.append(pod["name"])
    return Resumed(resumed=resumed)


def break_gate_credential(
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Make every router push its samples to the gate with a wrong credential for
    ``ttl_s`` seconds (the router's ``wrong_gate_credential`` fault): what a botched
    secret rotation does. The gate then sees nothing from them; the harness must say so
    (``probes.slo.gate_sees_every_router``), never pass quietly."""
    ttl_s = positive("ttl_s", ttl_s, MAX_TTL_S)
    what = "breaking the routers' gate credential"
    return inject_fault(configuration, what, "router", "wrong_gate_credential", ttl_s, {})


def make_canary_faulty(
    mode: str = "fp8-kv-scale",
    min_prompt_tokens: int = 2048,
    magnitude: float = 1.0,
    ttl_s: float = 60.0,
    configuration: Configuration | None = None,
) -> InjectedFault:
    """Give the canary a faulty kernel: its next-token distributions drift (and top tokens
    can flip) for prompts of at least ``min_prompt_tokens`` tokens, growing with
    ``magnitude`` and with the prompt's length. This is what the gate must catch."""
    if mode not in KERNEL_MODES:
        raise ActivityFailed(f"argument mode is {mode!r}: use one of {', '.join(KERNEL_MODES)}")
    try:
        min_tokens = int(min_prompt_tokens)
    except (TypeError, ValueError):
        raise ActivityFailed(
            f"argument min_prompt_tokens must be an integer, got {min_prompt_tokens!r}"
        ) from None
    if min_tokens < 0:
        raise ActivityFailed(f"argument min_prompt_tokens must be >= 0, got {min_tokens}")
    magnitude = positive("magnitude", magnitude, 10.0)
    ttl_s = positive("ttl_s", ttl_s, MAX_TTL_S)
    params = {"mode": mode, "min_prompt_tokens": min_tokens, "magnitude": magnitude}
    return inject_fault(
        configuration, "making the canary faulty", "model-canary", "kernel", ttl_s, params
    )


def kill_pod(
    component: str,
    replica: str | None = None,
    configuration: Configuration | None = None,
) -> KilledPod:
    """Kill one pod of ``component`` (``replica`` names it; default: the first).

    Local target: SIGKILL to the process supervisord runs (by PID; supervisord restarts
    it, like a ReplicaSet). Kubernetes: chaostoolkit-kubernetes ``terminate_pods`` with
    grace period 0 on the role's label selector.
    """
    with on_target(configuration, f"killing a pod of {component}") as target:
        entry = gd_faults.kill_pod(target, component, replica, ledger(configuration))
    return KilledPod(
        component=entry.component,
        replica=entry.replica,
        killed_at=entry.time,
        detail=entry.detail,
    )


def clear_faults(
    component: str | None = None,
    configuration: Configuration | None = None,
) -> ClearedFaults:
    """Clear every fault of this run's ledger that is still outstanding (of ``component``
    only, when given). A fault the component already dropped (expired, or a restarted
    pod) counts as cleared. Idempotent: safe as a rollback after any failure."""
    with on_target(configuration, "clearing faults") as target:
        cleared = gd_faults.clear_injected(target, ledger(configuration), component)
    return ClearedFaults(
        cleared=len(cleared),
        faults=[
            ClearedFault(
                component=e.component,
                replica=e.replica,
                kind=e.kind,
                fault_id=e.fault_id,
                already_gone=bool(e.detail.get("already_gone")),
            )
            for e in cleared
        ],
    )


def record_external_fault(
    component: str,
    kind: str,
    source: str = "external",
    at: float | None = None,
    params: dict[str, object] | None = None,
    configuration: Configuration | None = None,
) -> RecordedFault:
    """Record a fault that another Chaos Toolkit extension made (chaostoolkit-kubernetes'
    ``terminate_pods``, chaostoolkit-istio's fault injection, a plain ``http`` action) in
    this run's fault ledger, so the trip, rollback and drift checks measure from it. Put
    it right after that action (``at``: when it happened, default now)::

        - type: action
          name: canary-rollout-of-a-bad-build
          provider: {type: python, module: chaosk8s.deployment.actions, func: ...}
        - type: action
          name: record-the-bad-build
          provider:
            type: python
            module: probes.faults
            func: record_external_fault
            arguments: {component: model-canary, kind: kernel, source: chaosk8s,
                        params: {min_prompt_tokens: 0}}
    """
    with on_target(configuration, f"recording an external {kind} fault") as target:
        entry = gd_faults.record_external(
            target, component, kind, ledger(configuration), source, at, params
        )
    return RecordedFault(
        component=entry.component,
        kind=entry.kind,
        recorded_at=entry.time,
        fault_id=entry.fault_id,
    )
