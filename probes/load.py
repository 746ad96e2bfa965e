"""A Chaos Toolkit control that runs the user load (Locust, through ``gameday.load``)
around the method: started before it, stopped after it.

A load that cannot start interrupts the experiment (its rollbacks run): it must never run
silently without users. Locust is stopped by its PID only. Nothing here imports Locust.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from chaoslib.exceptions import InterruptExecution

from gameday.load.runner import LoadConfig, LoadRunError, env_load_seed
from gameday.run import load_state
from gameday.targets import TargetError
from probes._context import (
    Configuration,
    Secrets,
    get_target,
    rewrite_journal_extensions,
    run_dir,
)

__all__ = [
    "after_experiment_control",
    "after_method_control",
    "before_method_control",
    "cleanup_control",
]

ENV_RUN_ID = "GAMEDAY_RUN_ID"
JOURNAL_EXTENSION = "gameday-load"
MAX_USERS = 1000


def _oracle_args(configuration: Configuration | None) -> list[str]:
    """Oracle pairs go straight to one model server of each variant on a local target,
    so the oracle does not depend on the router it judges."""
    target = get_target(configuration)
    if target.kind != "local":
        return []
    baseline, canary = target.replicas("model-baseline"), target.replicas("model-canary")
    if not baseline or not canary:
        return []
    return ["--oracle-baseline-host", baseline[0].url, "--oracle-canary-host", canary[0].url]


def _model_args(configuration: Configuration | None) -> list[str]:
    """The model name the target serves, when its file states one (a foreign engine
    refuses others: vLLM's --served-model-name), and how a foreign router says which
    variant served and takes a pin (``kind: external``: its ``variant`` and ``pin``)."""
    target = get_target(configuration)
    model = target.model_name
    load_args = getattr(target, "load_args", None)
    return [*(["--model", model] if model else []), *(load_args() if callable(load_args) else [])]


def _start_worker_pods(configuration: Configuration | None) -> tuple[int, int, str] | None:
    """Scale the target's Locust worker pods up (``load_workers`` of a Kubernetes target
    file) before their master starts: (how many, the master's port, where it binds), or
    None when the load runs here alone. They connect to the master once it listens."""
    target = get_target(configuration)
    scale = getattr(target, "scale_load_workers", None)
    spec = getattr(getattr(target, "spec", None), "load_workers", None)
    if not callable(scale) or spec is None:
        return None
    scale(spec.replicas)
    bind = spec.master.bind_host if spec.master is not None else "127.0.0.1"
    return int(spec.replicas), int(spec.master_port), bind


def _master_pod(configuration: Configuration | None, run_bound_s: float) -> Any:
    """The pod the master runs in (``load_workers.master``), or None: it runs here."""
    make = getattr(get_target(configuration), "load_master", None)
    return make(run_bound_s) if callable(make) else None


def _stop_worker_pods(configuration: Configuration | None) -> None:
    """Scale the worker pods back to 0 (idempotent; best effort: a failure is logged by
    the caller's journal, the pods hold no fault)."""
    try:
        target = get_target(configuration)
    except Exception:  # an activity that cannot even load its target has nothing to stop
        return
    scale = getattr(target, "scale_load_workers", None)
    if callable(scale):
        with contextlib.suppress(TargetError):
            scale(0)


def _seed(seed: Any) -> int | None:
    """The load's seed: the control's ``seed`` argument, else ``$GAMEDAY_LOAD_SEED`` (set by
    ``gameday run --repeat``), else None (the load's default, 0)."""
    if seed is None:
        return env_load_seed()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number, got {seed!r}")
    return seed


def before_method_control(
    context: Any,
    users: int = 12,
    spawn_rate: float = 12.0,
    max_tokens: int = 48,
    prompt_mix: str = "synthetic",
    stop_timeout_s: float = 10.0,
    oracle: bool = True,
    max_duration_s: float = 600.0,
    extra_args: list[str] | None = None,
    seed: int | None = None,
    configuration: Configuration | None = None,
    secrets: Secrets | None = None,
    **kwargs: Any,
) -> None:
    """Start Locust against the target's router; InterruptExecution if it cannot start.

    Locust targets the target's router and writes ``records.parquet`` (and, with ``oracle``,
    ``oracle.parquet`` from pinned baseline/canary pairs sent straight to one model server
    of each variant on a local target) into the run folder. ``load.json`` there says where
    the load stands (``running`` with Locust's PID, then ``stopped`` with the records' path
    and Locust's summary); the SLO probes and ``gameday run`` read it, and the journal gets
    it as an experiment extension named ``gameday-load``::

        controls:
          - name: load
            provider: {type: python, module: probes.load,
                       arguments: {users: 12, spawn_rate: 12, max_tokens: 48}}
    """
    folder = run_dir(configuration)
    try:
        workers = _start_worker_pods(configuration)
        n_users = int(users)
        if not 1 <= n_users <= MAX_USERS:
            raise ValueError(f"users must be from 1 to {MAX_USERS}, got {users!r}")
        config = LoadConfig(
            host=get_target(configuration).service_url("router"),
            output_dir=folder,
            users=n_users,
            spawn_rate=float(spawn_rate),
            prompt_mix=str(prompt_mix),
            duration_s=float(max_duration_s),  # a bound; stop() ends it after the method
            stop_timeout_s=float(stop_timeout_s),
            max_tokens=int(max_tokens),
            run_id=os.environ.get(ENV_RUN_ID) or folder.name,
            oracle=bool(oracle),
            extra_args=[
                *(_oracle_args(configuration) if oracle else []),
                *_model_args(configuration),
                *(extra_args or []),
            ],
            seed=_seed(seed),
            external_workers=workers[0] if workers else None,
            master_port=workers[1] if workers else None,
            master_bind_host=workers[2] if workers else "127.0.0.1",
        )
        remote = _master_pod(configuration, float(max_duration_s))
    except (ValueError, TypeError, TargetError) as exc:
        _stop_worker_pods(configuration)
        load_state.mark_failed(folder, str(exc))
        raise InterruptExecution(
            f"the user load could not start, so the experiment stops: {exc}"
        ) from None
    try:
        load_state.start(folder, config, remote)
    except (LoadRunError, TargetError, ValueError, TypeError, OSError) as exc:
        _stop_worker_pods(configuration)
        raise InterruptExecution(
            f"the user load could not start, so the experiment stops: {exc}"
        ) from None


def after_method_control(
    context: Any, configuration: Configuration | None = None, **kwargs: Any
) -> None:
    """Stop Locust (SIGTERM by PID; streams in flight get the stop timeout), then its
    worker pods, when the target runs the load from them."""
    load_state.stop(run_dir(configuration))
    _stop_worker_pods(configuration)


def after_experiment_control(
    context: Any, state: Any = None, configuration: Configuration | None = None, **kwargs: Any
) -> None:
    """Stop Locust if an interruption skipped the method's end, and put where the load
    stands (records path included) into the journal."""
    folder = run_dir(configuration)
    load_state.stop(folder)
    _stop_worker_pods(configuration)
    load = load_state.read_state(folder)
    if not load:
        return

    def with_load(extensions: list[Any]) -> list[Any]:
        kept = [
            e
            for e in extensions
            if not (isinstance(e, dict) and e.get("name") == JOURNAL_EXTENSION)
        ]
        return [*kept, {"name": JOURNAL_EXTENSION, **load}]

    rewrite_journal_extensions(state, with_load)


def cleanup_control(**kwargs: Any) -> None:
    """Last resort: no Locust outlives the experiment."""
    load_state.stop_all()
