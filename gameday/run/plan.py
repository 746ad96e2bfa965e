"""What a run will do, decided before anything starts: experiments, target, stack.

This module starts nothing.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NotRequired, TypedDict

import yaml

from gameday.errors import GamedayError
from gameday.load.generator import LoadTolerances
from gameday.report.campaign import run_folder_name, runs_needed
from gameday.run.sufficiency import thresholds
from gameday.stack import StackCommandError, stack_status
from gameday.targets import Target, TargetError, load_target
from gameday.targets.base import DEFAULT_TARGET_ENV, TargetDescription
from gameday.targets.local import LocalTarget

DEFAULT_TARGET_FILE = Path("targets/local.yaml")
CERTIFY_RUNS = runs_needed()  # 59: p95 <= SLO at 95 % confidence, no exceedance


class PlanError(GamedayError, ValueError):
    """A wrong input; the message names it and says what to do."""


MAX_REPEAT = 1000


class StackJson(TypedDict):
    owned: bool
    fresh_per_experiment: bool
    config: str | None
    base_port: int | None


class CampaignPlanJson(TypedDict):
    """run.json's ``campaign`` (the report reads its seeds and order)."""

    repeat: int
    certify: bool
    first_load_seed: int | None
    load_seeds: dict[str, int | None]
    order: str


class PlanJson(TypedDict):
    """What run.json says of the plan: the target, the stack, the campaign (if any)."""

    target: TargetDescription  # Target.describe(): its kind's own keys
    target_file: str | None
    stack: StackJson
    campaign: NotRequired[CampaignPlanJson]


class PlannedJson(TypedDict):
    name: str
    file: str


class RunOutcomeJson(TypedDict):
    experiment: str
    verdict: str
    reasons: list[str]


class RunJson(PlanJson):
    """run.json: the run's id and times, its experiments, the plan, how it was started;
    once it has ended, its verdict and each experiment's (the report reads it)."""

    run_id: str
    started_at: float
    ended_at: float | None
    experiments: list[PlannedJson]
    argv: list[str]
    versions: dict[str, str]
    notes: list[str]
    verdict: NotRequired[str]
    interrupted: NotRequired[str | None]
    not_run: NotRequired[list[str]]
    results: NotRequired[list[RunOutcomeJson]]


@dataclass(frozen=True)
class PlannedExperiment:
    name: str  # folder name in the run, e.g. router/latency (router/latency@r03 in a campaign)
    path: Path  # absolute
    base: str | None = None  # the experiment's own name, in a campaign
    run_index: int | None = None  # 1-based run of this experiment, in a campaign
    load_seed: int | None = None  # the load's seed (None: the load's own default, 0)


@dataclass
class RunPlan:
    run_id: str
    run_dir: Path
    out_dir: Path
    experiments: list[PlannedExperiment]
    target: Target
    target_file: Path | None
    target_data: Mapping[str, object]  # the target file as read (its kind's own keys)
    owns_stack: bool
    stack_config: Path | None
    base_port: int | None
    experiment_timeout_s: float
    notes: list[str] = field(default_factory=list)
    repeat: int = 1
    certify: bool = False
    load_seed: int | None = None
    prometheus_url: str | None = None  # the report adds its series (gameday run --prometheus)

    @property
    def is_campaign(self) -> bool:
        return self.repeat > 1 or self.certify

    def describe(self) -> PlanJson:
        doc = self._describe()
        if self.is_campaign:  # (a plain run's run.json stays as it was)
            doc["campaign"] = {
                "repeat": self.repeat,
                "certify": self.certify,
                "first_load_seed": self.load_seed,
                "load_seeds": {e.name: e.load_seed for e in self.experiments},
                "order": "round-robin: round k runs every experiment once, with seed "
                "first_load_seed + k - 1",
            }
        return doc

    def _describe(self) -> PlanJson:
        return {
            "target": self.target.describe(),
            "target_file": str(self.target_file) if self.target_file else None,
            "stack": {
                "owned": self.owns_stack,
                "fresh_per_experiment": self.owns_stack,
                "config": str(self.stack_config) if self.stack_config else None,
                "base_port": self.base_port,
            },
        }


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


def experiment_name(path: Path) -> str:
    """``experiments/router/latency.yaml`` -> ``router/latency``; else the file's stem."""
    parts = path.resolve().parts
    if "experiments" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("experiments")
        rel = Path(*parts[i + 1 :])
        return str(rel.with_suffix("")).replace(os.sep, "/")
    return path.stem


def _check_experiment(path: Path) -> None:
    if not path.is_file():
        raise PlanError(
            f"experiment file {path} does not exist: give paths such as "
            "experiments/router/latency.yaml"
        )
    from chaoslib.exceptions import ChaosException
    from chaoslib.experiment import ensure_experiment_is_valid
    from chaoslib.loader import load_experiment

    try:
        experiment = load_experiment(str(path))
        ensure_experiment_is_valid(experiment)
    except ChaosException as exc:
        raise PlanError(
            f"experiment {path} is not a valid Chaos Toolkit experiment: {exc} "
            f"(check it with `chaos validate {path}`)"
        ) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise PlanError(f"experiment {path} cannot be read: {exc}") from None


def _target_file(given: Path | None) -> Path | None:
    if given is not None:
        return given
    env = os.environ.get(DEFAULT_TARGET_ENV)
    if env:
        return Path(env)
    return DEFAULT_TARGET_FILE if DEFAULT_TARGET_FILE.is_file() else None


def _target_data(path: Path | None) -> dict[str, object]:
    if path is None:
        return {"kind": "local"}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"target file {path}: {exc}") from None
    return dict(data) if isinstance(data, dict) else {}


def plan_run(
    experiments: list[Path],
    target_file: Path | None = None,
    out_dir: Path = Path("reports"),
    stack_config: Path | None = None,
    base_port: int | None = None,
    experiment_timeout_s: float = 600.0,
    run_id: str | None = None,
    repeat: int = 1,
    certify: bool = False,
    load_seed: int | None = None,
    prometheus_url: str | None = None,
) -> RunPlan:
    """``plan_run`` checks every input a person gives (experiment files exist and are valid
    Chaos Toolkit experiments, the target file loads, the stack options make sense for the
    target) and raises ``PlanError`` naming the input and what to do — before a stack is
    started or a fault injected.

    Isolation: when the target is local and no stack runs in its ``state_dir``, the run owns
    the stack and starts a fresh one per experiment (own state folder, so the broker's
    release, the gate's state and every fault start clean), stopped after the experiment.
    When a stack already runs there (or the target is Kubernetes), the run uses it as it is:
    each experiment's method first checks the starting state (release progressing, the
    configured canary weight, no active fault) and fails clearly when it does not hold.
    """
    if prometheus_url is not None:
        prometheus_url = _loopback_url(prometheus_url, "--prometheus")
    planned = _planned_experiments(experiments, repeat, certify, load_seed)
    chosen = _target_file(target_file)
    try:
        target = load_target(chosen) if chosen else load_target(None)
    except TargetError as exc:
        raise PlanError(str(exc)) from None
    data = _target_data(chosen)
    owns, notes = _stack_ownership(target, stack_config, base_port)
    if certify and repeat < CERTIFY_RUNS:
        notes.append(
            f"--certify with --repeat {repeat}: p95 <= SLO at 95 % confidence needs "
            f">= {CERTIFY_RUNS} runs without an exceedance, so this campaign can only say "
            "what fewer runs prove (the verdict is inconclusive unless a run fails)"
        )
    if experiment_timeout_s <= 0:
        raise PlanError(f"--experiment-timeout-s must be above 0, got {experiment_timeout_s}")
    # The evidence an inconclusive verdict rests on: a bad threshold stops the run here,
    # before any stack starts, naming the variable (gameday.run.sufficiency, LoadTolerances).
    try:
        thresholds()
        LoadTolerances.from_env()
    except ValueError as exc:
        raise PlanError(f"{exc}") from None
    rid, run_dir = _run_folder(out_dir, run_id)
    return RunPlan(
        run_id=rid,
        run_dir=run_dir,
        out_dir=out_dir,
        experiments=planned,
        target=target,
        target_file=chosen.resolve() if chosen else None,
        target_data=data,
        owns_stack=owns,
        stack_config=stack_config.resolve() if stack_config else None,
        base_port=base_port,
        experiment_timeout_s=experiment_timeout_s,
        notes=notes,
        repeat=repeat,
        certify=certify,
        load_seed=planned[0].load_seed if planned else None,
        prometheus_url=prometheus_url,
    )


def _planned_experiments(
    experiments: list[Path], repeat: int, certify: bool, load_seed: int | None
) -> list[PlannedExperiment]:
    """The experiments the run holds, in order: each file checked, named after its path
    (a second file of the same name gets ``-2``), then repeated (``campaign_runs``).
    PlanError for no experiment, a wrong ``--repeat`` or ``--load-seed``, or a file that is
    not a valid experiment."""
    if not experiments:
        raise PlanError("no experiment given: e.g. gameday run experiments/router/*.yaml")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise PlanError(
            f"--repeat {repeat!r}: give a whole number of runs per experiment from 1 to "
            f"{MAX_REPEAT} (e.g. --repeat 59 for a --certify campaign)"
        )
    if load_seed is not None and not 0 <= load_seed <= 2**31 - repeat:
        raise PlanError(
            f"--load-seed {load_seed}: give a seed from 0 to {2**31 - repeat} (run k of each "
            "experiment uses the seed plus k - 1)"
        )
    planned: list[PlannedExperiment] = []
    seen: dict[str, int] = {}
    for path in experiments:
        _check_experiment(path)
        name = experiment_name(path)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}-{seen[name]}"
        planned.append(PlannedExperiment(name, path.resolve()))
    return campaign_runs(planned, repeat, certify, load_seed)


def _stack_ownership(
    target: Target, stack_config: Path | None, base_port: int | None
) -> tuple[bool, list[str]]:
    """Whether the run owns the stack (a local target with no stack running in its
    ``state_dir``), and the notes saying it uses one already running. PlanError when
    ``--stack-config`` or ``--base-port`` cannot apply (no such file, a stack already
    running, a target that is not local) or whether a stack runs cannot be told."""
    if stack_config is not None and not stack_config.is_file():
        raise PlanError(f"--stack-config {stack_config}: no such file")
    owns = False
    notes: list[str] = []
    if isinstance(target, LocalTarget):
        try:
            status = stack_status(target.state_dir)
        except (StackCommandError, OSError, ValueError) as exc:
            raise PlanError(
                f"cannot tell whether a stack runs in {target.state_dir}: {exc}"
            ) from None
        running = bool(status and status.get("running"))
        owns = not running
        if running and (stack_config is not None or base_port is not None):
            raise PlanError(
                f"a stack is already running in {target.state_dir}; --stack-config and "
                "--base-port apply only to the stacks gameday run starts itself. Stop it "
                f"(`gameday stack down --state-dir {target.spec.state_dir}`) or drop the options."
            )
        if running:
            notes.append(
                f"using the stack already running in {target.state_dir}: experiments share "
                "it, so each checks its starting state first"
            )
    elif stack_config is not None or base_port is not None:
        raise PlanError(
            f"--stack-config and --base-port apply to a local target only; the target "
            f"is {target.kind!r}"
        )
    return owns, notes


def _run_folder(out_dir: Path, run_id: str | None) -> tuple[str, Path]:
    """The run's id (``run_id``, else a new one) and its folder under ``out_dir``, which
    must not exist yet; PlanError for an id that is not a plain name."""
    rid = run_id or new_run_id()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", rid) or rid == "latest":
        raise PlanError(f"--run-id {rid!r}: use letters, digits, '.', '_' and '-' only")
    run_dir = out_dir / rid
    if run_dir.exists():
        raise PlanError(f"run folder {run_dir} exists already: pick another --run-id")
    return rid, run_dir


def _loopback_url(url: str, option: str) -> str:
    """``url`` if it is http(s) to 127.0.0.1, [::1] or localhost (the harness sends traffic
    to nothing else), without a trailing slash; else a PlanError naming ``option``."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in (
        "127.0.0.1",
        "::1",
        "localhost",
    ):
        raise PlanError(
            f"{option} {url!r}: give an http URL on loopback, e.g. http://127.0.0.1:9090 "
            "(the harness sends traffic to 127.0.0.1 or [::1] only)"
        )
    return url.rstrip("/")


def campaign_runs(
    planned: list[PlannedExperiment], repeat: int, certify: bool, load_seed: int | None
) -> list[PlannedExperiment]:
    """Each experiment ``repeat`` times, round-robin (round k runs every experiment once,
    so an interrupted campaign stays balanced), named ``<name>@rKK``, with the load seed
    ``load_seed + k - 1`` (0 when not given). ``repeat == 1`` without ``certify``: the
    plan as it was (no suffix; the seed only when given)."""
    if repeat == 1 and not certify:
        if load_seed is None:
            return planned
        return [replace(e, load_seed=load_seed) for e in planned]
    first = load_seed or 0
    return [
        PlannedExperiment(
            run_folder_name(e.name, k), e.path, base=e.name, run_index=k, load_seed=first + k - 1
        )
        for k in range(1, repeat + 1)
        for e in planned
    ]


def effective_target_data(plan: RunPlan, state_dir: Path | None) -> dict[str, object]:
    """The target file an experiment's activities read: the user's, with the local state
    folder made absolute (or replaced by the fresh stack's)."""
    data = dict(plan.target_data)
    if plan.target.kind == "local":
        data["kind"] = "local"
        assert isinstance(plan.target, LocalTarget)
        data["state_dir"] = str(state_dir or plan.target.state_dir)
    return data
