"""``gameday run``: run experiments one after the other, gather, decide, report (``GameDay``).

Over 400 lines because ``GameDay`` is one loop (stack, chaos, safety nets, evidence, verdict).
This module never kills anything by name, and never stops a stack it did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

import requests
import yaml

from gameday.api import StackApi
from gameday.atomic import write_json
from gameday.errors import GamedayError
from gameday.load.runner import ENV_LOAD_SEED
from gameday.run.capabilities import missing
from gameday.run.chaos import ChaosRun
from gameday.run.collect import (
    clear_leftover_faults,
    collect_timeline,
    read_json,
    records_rows,
    stop_orphan_locust,
    trips_between,
)
from gameday.run.external import (
    OBSERVATIONS_NAME,
    Sampler,
    exposed_answers,
    observed_gate_evidence,
    prepare,
)
from gameday.run.figures import (
    evidence_brief,
    evidence_figures,
    experiment_window,
    figures,
    inconclusive_reasons,
)
from gameday.run.plan import PlannedExperiment, RunJson, RunPlan, effective_target_data
from gameday.run.result import ExperimentResult
from gameday.run.sufficiency import (
    GATE_EVIDENCE_NAME,
    thresholds,
    write_gate_evidence,
    write_gate_start,
)
from gameday.run.verdict import FAIL, INCONCLUSIVE, NOT_APPLICABLE, PASS, Evidence, decide
from gameday.stack import StackCommandError, stack_down, stack_up
from gameday.targets import Target, TargetError, load_target
from gameday.targets.health import stated_faults

EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE = 0, 1, 3
CHAOS_GRACE_S = 60.0  # rollbacks + the load's stop timeout + margin
POLL_S = 0.2


class _NotStarted(GamedayError):
    pass


class Progress(Protocol):
    """What the terminal shows (``gameday.run.cli``); tests pass a silent one."""

    def run_started(self, plan: RunPlan) -> None: ...
    def experiment_started(self, index: int, total: int, name: str) -> None: ...
    def stage(self, name: str, text: str) -> None: ...
    def chaos_line(self, name: str, level: str, message: str, elapsed_s: float) -> None: ...
    def experiment_done(self, name: str, result: ExperimentResult) -> None: ...
    def run_done(self, outcome: RunOutcome) -> None: ...


class SilentProgress:
    def run_started(self, plan: RunPlan) -> None:
        pass

    def experiment_started(self, index: int, total: int, name: str) -> None:
        pass

    def stage(self, name: str, text: str) -> None:
        pass

    def chaos_line(self, name: str, level: str, message: str, elapsed_s: float) -> None:
        pass

    def experiment_done(self, name: str, result: ExperimentResult) -> None:
        pass

    def run_done(self, outcome: RunOutcome) -> None:
        pass


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    results: list[ExperimentResult]
    interrupted: str | None = None
    report_headline: str | None = None
    report_html: Path | None = None
    report_error: str | None = None
    not_run: list[str] = field(default_factory=list)
    campaign_lines: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_PASS


class Interrupts:
    """SIGINT/SIGTERM while a run is in progress: remembered, forwarded to chaos."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.chaos: ChaosRun | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: no locks, nothing that blocks.
        self.count += 1
        self.signum = self.signum or signum
        chaos = self.chaos
        if chaos is not None:
            if self.count == 1:
                chaos.interrupt()
            else:
                chaos.kill()  # a second signal: no more waiting for rollbacks

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interrupts]:
        old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def _point_latest(plan: RunPlan) -> None:
    link = plan.out_dir / "latest"
    tmp = plan.out_dir / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(plan.run_id, target_is_directory=True)
        os.replace(tmp, link)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for dist in ("chaostoolkit", "chaostoolkit-lib", "locust"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


class GameDay:
    """One ``gameday run``.

    Per experiment, in ``reports/<run-id>/<experiment>/``:

    1. a stack to act on — a fresh local stack when the run owns it (see ``gameday.run.plan``),
       and ``target.yaml``, the target file the experiment's activities read;
    2. ``chaos run`` in a subprocess (``gameday.run.chaos``) with ``GAMEDAY_TARGET`` and
       ``GAMEDAY_RUN_DIR`` pointing there; the experiment's own activities write the fault
       ledger (``faults.jsonl``), the load records and ``load.json``;
    3. safety nets (a Locust left running, faults left in the ledger), ``timeline.json``
       from the broker, the stack's logs (``stack/``) when the run owned the stack;
    4. could the gate have seen (``gameday.run.sufficiency``): ``gate-evidence.json``
       (the gate's counters; read here, before the stack stops, when the experiment's own
       probe did not) and the load generator's check in ``load.json``;
    5. the verdict (``gameday.run.verdict``) in ``result.json``: pass, fail or inconclusive.

    A campaign (``--repeat N``, ``gameday.run.plan.campaign_runs``) is the same loop over N
    rounds: run k of ``router/latency`` lives in ``router/latency@rKK``, its chaos gets
    ``GAMEDAY_LOAD_SEED`` (the load's seed for that run, also in its ``result.json`` under
    ``campaign`` and in ``run.json``), and the report adds the campaign's cells
    (``gameday.report.campaign``).

    Exit codes: 0 every experiment passed, 1 one failed (fail wins), 3 none failed but one was
    inconclusive (the gate could not have seen, or the load was not valid), 128+N a signal.

    Then ``run.json`` and the report (``gameday.report.build_report``) at the run folder's top,
    and ``reports/latest`` -> the run. On SIGINT/SIGTERM: chaos gets SIGINT (its rollbacks
    clear the faults and its controls stop Locust), is killed by PID after a grace period,
    then the run clears whatever the ledgers still hold, stops Locust by PID if needed, stops
    the stack it started, writes the verdict (fail) and exits non-zero. A second signal
    skips the waiting.
    """

    def __init__(self, plan: RunPlan, progress: Progress | None = None) -> None:
        self.plan = plan
        self.progress = progress or SilentProgress()
        self.interrupts = Interrupts()
        self.results: list[ExperimentResult] = []
        self.started_at = time.time()
        self._stack_dir: Path | None = None  # the stack this run started and has not stopped
        # The harness's HTTP to the stack (gameday.api) goes over this one session.
        self.http = requests.Session()

    # -- the run -------------------------------------------------------------------
    def run(self, build_report: bool = True) -> RunOutcome:
        plan = self.plan
        plan.run_dir.mkdir(parents=True, exist_ok=False)
        _point_latest(plan)
        self._write_run_json(final=False)
        self.progress.run_started(plan)
        not_run: list[str] = []
        with self.interrupts.installed():
            try:
                for i, exp in enumerate(plan.experiments, start=1):
                    if self.interrupts.signum:
                        not_run.append(exp.name)
                        continue
                    self.progress.experiment_started(i, len(plan.experiments), exp.name)
                    result = self._experiment(exp)
                    self.results.append(result)
                    self.progress.experiment_done(exp.name, result)
            finally:
                self._stop_stack()  # whatever happened, the stack this run started stops
                self.http.close()
            outcome = RunOutcome(
                run_dir=plan.run_dir,
                exit_code=EXIT_FAIL,
                results=self.results,
                interrupted=self.interrupts.name,
                not_run=not_run,
            )
            verdict = run_verdict(self.results)
            self._write_run_json(final=True, verdict=verdict, not_run=not_run)
            if build_report and self.interrupts.count < 2:
                self.progress.stage("", "building the report")
                self._report(outcome)
        outcome.interrupted = self.interrupts.name
        if outcome.report_error or (outcome.report_headline or "").startswith("FAIL"):
            verdict = FAIL
        elif verdict == PASS and (outcome.report_headline or "").startswith("INCONCLUSIVE"):
            verdict = INCONCLUSIVE
        if self.interrupts.signum:
            outcome.exit_code = 128 + self.interrupts.signum
        else:
            outcome.exit_code = EXIT_CODES[verdict]
        _point_latest(plan)
        self.progress.run_done(outcome)
        return outcome

    def _report(self, outcome: RunOutcome) -> None:
        # The report's own module (another part of the harness) decides its verdict from
        # the same folder; a report that fails to build fails the run (fail-closed).
        try:
            from gameday.report import build_report

            summary = build_report(self.plan.run_dir, prometheus_url=self.plan.prometheus_url)
        except Exception as exc:  # any failure of the report is reported, not raised
            outcome.report_error = f"{exc.__class__.__name__}: {exc}"
            return
        outcome.report_headline = str(summary.headline)
        outcome.report_html = Path(summary.report_html)
        if self.plan.is_campaign:  # what the campaign proves, for the terminal
            doc = read_json(self.plan.run_dir / "summary.json") or {}
            campaign = doc.get("campaign") if isinstance(doc.get("campaign"), dict) else {}
            outcome.campaign_lines = [
                f"{c.get('experiment')}: {c.get('passes_text')} passed, verdict {c.get('verdict')}"
                for c in (campaign or {}).get("cells") or []
                if isinstance(c, dict)
            ] + [str(s) for s in (campaign or {}).get("certification") or []]

    def _write_run_json(
        self, final: bool, verdict: str | None = None, not_run: list[str] | None = None
    ) -> None:
        plan = self.plan
        doc: RunJson = {
            "run_id": plan.run_id,
            "started_at": self.started_at,
            "ended_at": time.time() if final else None,
            "experiments": [{"name": e.name, "file": str(e.path)} for e in plan.experiments],
            **plan.describe(),
            "argv": sys.argv,
            "versions": _versions(),
            "notes": plan.notes,
        }
        if final:
            doc["verdict"] = verdict or FAIL
            doc["interrupted"] = self.interrupts.name
            doc["not_run"] = not_run or []
            doc["results"] = [
                {"experiment": r["experiment"], "verdict": r["verdict"], "reasons": r["reasons"]}
                for r in self.results
            ]
        write_json(plan.run_dir / "run.json", doc)

    # -- one experiment ------------------------------------------------------------
    def _experiment(self, exp: PlannedExperiment) -> ExperimentResult:
        folder = self.plan.run_dir / exp.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exp.path, folder / "experiment.yaml")
        started = time.time()
        evidence = Evidence(None, None, None, None)
        target: Target | None = None
        chaos_result = None
        sampler = Sampler(None)
        try:
            target = self._prepare(exp, folder)
            experiment = yaml.safe_load(exp.path.read_text()) or {}
            stated = stated_faults(StackApi(self.http, target))
            not_applicable = missing(target, experiment, stated)
            if not_applicable:
                return self._not_applicable(exp, folder, started, not_applicable)
            prepare(target, folder)  # a foreign stack's own reset, when its file has one
            write_gate_start(target, folder, self.http)  # what the gate had counted before this one
            if self.interrupts.signum:
                raise _NotStarted(f"interrupted ({self.interrupts.name}) before chaos started")
            chaos = ChaosRun(
                exp.path,
                folder.resolve(),
                self._env(folder, exp),
                on_line=lambda level, msg: self.progress.chaos_line(
                    exp.name, level, msg, chaos.elapsed_s()
                ),
                cwd=Path.cwd(),
            )
            self.interrupts.chaos = chaos
            sampler = Sampler(target).__enter__()  # a foreign gate's observer, sampled
            chaos.start()
            deadline = time.monotonic() + self.plan.experiment_timeout_s
            stop_by: float | None = None  # once interrupted: SIGKILL after the grace period
            while chaos.poll() is None:
                now = time.monotonic()
                if self.interrupts.signum and not chaos.interrupted:
                    chaos.interrupt()  # (also when the signal came while chaos was starting)
                if now > deadline and not chaos.timed_out:
                    chaos.timed_out = True
                    self.progress.stage(exp.name, "timed out: interrupting chaos")
                    chaos.interrupt()
                if chaos.interrupted and stop_by is None:
                    stop_by = now + CHAOS_GRACE_S
                    self.progress.stage(exp.name, "interrupting chaos: rollbacks, then cleanup")
                if stop_by is not None and now > stop_by:
                    chaos.kill()
                time.sleep(POLL_S)
            chaos_result = chaos.finish(grace_s=CHAOS_GRACE_S)
        except _NotStarted as exc:
            evidence.setup_error = str(exc)
        except (StackCommandError, TargetError, OSError) as exc:
            evidence.setup_error = f"could not prepare the experiment: {exc}"
        finally:
            sampler.__exit__(None, None, None)
            self.interrupts.chaos = None
            if chaos_result is not None and chaos_result.timed_out:
                evidence.timed_out_s = self.plan.experiment_timeout_s
            self._after_chaos(exp, folder, target, evidence)
        if chaos_result is not None:
            evidence.chaos_exit_code = chaos_result.exit_code
        evidence.interrupted = self.interrupts.name if self.interrupts.signum else None
        evidence.journal = read_json(folder / "journal.json")
        evidence.records_rows = records_rows(folder)
        evidence.exposed = exposed_answers(folder)
        evidence.inconclusive = inconclusive_reasons(folder, evidence)
        verdict, reasons = decide(evidence)
        seen = evidence_figures(folder)
        result: ExperimentResult = {
            "experiment": exp.name,
            "verdict": verdict,
            "reasons": reasons,
            "chaos_exit_code": evidence.chaos_exit_code,
            "started_at": started,
            "ended_at": time.time(),
            "file": str(exp.path),
            "figures": {
                **figures(evidence.journal, evidence.records_rows),
                **evidence_brief(seen),
            },
            "evidence": seen,
            "stack": {"owned": self.plan.owns_stack},
        }
        if exp.base is not None or exp.load_seed is not None:
            # a campaign's run (or a seed given): which trial this was and its load seed
            result["campaign"] = {
                "experiment": exp.base or exp.name,
                "run": exp.run_index,
                "of": self.plan.repeat,
                "load_seed": exp.load_seed,
            }
        write_json(folder / "result.json", result)
        return result

    def _env(self, folder: Path, exp: PlannedExperiment | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "GAMEDAY_TARGET": str((folder / "target.yaml").resolve()),
            "GAMEDAY_RUN_DIR": str(folder.resolve()),
            "GAMEDAY_RUN_ID": self.plan.run_id,
            "PYTHONUNBUFFERED": "1",
        }
        if exp is not None and exp.load_seed is not None:
            env[ENV_LOAD_SEED] = str(exp.load_seed)  # probes.load passes it to Locust
        else:
            env.pop(ENV_LOAD_SEED, None)  # the plan decides the seed, not the shell
        return env

    def _prepare(self, exp: PlannedExperiment, folder: Path) -> Target:
        state_dir = None
        if self.plan.owns_stack:
            self.progress.stage(exp.name, "starting a fresh local stack")
            state_dir = Path(tempfile.mkdtemp(prefix="gameday-stack-"))
            self._stack_dir = state_dir
            extra: list[str] = []
            if self.plan.base_port is not None:
                extra += ["--base-port", str(self.plan.base_port)]
            if self.plan.stack_config is not None:
                extra += ["--config", str(self.plan.stack_config)]
            stack_up(state_dir, extra)
        target_path = folder / "target.yaml"
        data = effective_target_data(self.plan, state_dir)
        if data.get("kind") == "external":  # the gate observer's snapshots live here
            data["observations"] = str((folder / OBSERVATIONS_NAME).resolve())
        target_path.write_text(yaml.safe_dump(data, sort_keys=False))
        return load_target(target_path)

    @staticmethod
    def _started_at(folder: Path) -> float:
        """When this experiment's chaos run began (its journal's start, else the folder's
        experiment.yaml copy): the foreign gate's evidence counts from here."""
        journal = read_json(folder / "journal.json") or {}
        start, _ = experiment_window(journal, folder)
        return float(start)

    def _not_applicable(
        self, exp: PlannedExperiment, folder: Path, started: float, reasons: list[str]
    ) -> ExperimentResult:
        """The result of an experiment the target cannot run: said out loud, chaos not run."""
        self.progress.stage(exp.name, "not applicable to this target")
        result: ExperimentResult = {
            "experiment": exp.name,
            "verdict": NOT_APPLICABLE,
            "reasons": reasons,
            "chaos_exit_code": None,
            "started_at": started,
            "ended_at": time.time(),
            "file": str(exp.path),
            "figures": {},
            "evidence": {},
            "stack": {"owned": self.plan.owns_stack},
        }
        write_json(folder / "result.json", result)
        return result

    def _after_chaos(
        self, exp: PlannedExperiment, folder: Path, target: Target | None, ev: Evidence
    ) -> None:
        note = stop_orphan_locust(folder)
        if note:
            ev.load_problem = note
        load = read_json(folder / "load.json")
        if load and load.get("state") not in ("stopped", None):
            ev.load_problem = (
                ev.load_problem
                or (
                    f"the load ended in state {load.get('state')!r}: {load.get('error') or ''}"
                ).strip()
            )
        ev.faults_left = clear_leftover_faults(target, folder)
        if target is not None:
            observed_gate_evidence(target, folder, thresholds(), self._started_at(folder))
        if target is not None and not (folder / GATE_EVIDENCE_NAME).exists():
            # the experiment has no probes.evidence probe: read the gate's counters now,
            # while the stack still runs (they last until a new canary version)
            try:
                write_gate_evidence(
                    target, folder, thresholds(), source="gameday run", session=self.http
                )
            except (ValueError, OSError) as exc:  # (thresholds were checked by the plan)
                ev.setup_error = ev.setup_error or f"the gate's evidence was not written: {exc}"
        if target is not None:
            events, problem = collect_timeline(target, folder, self.http)
            journal = read_json(folder / "journal.json") or {}
            start, end = experiment_window(journal, folder)
            ev.trips_in_window = None if events is None else trips_between(events, start, end)
            if problem and ev.setup_error is None:
                ev.load_problem = ev.load_problem or problem
        if self.plan.owns_stack and self._stack_dir is not None:
            self.progress.stage(exp.name, "stopping the stack")
            self._stop_stack(keep_logs_in=folder / "stack")

    def _stop_stack(self, keep_logs_in: Path | None = None) -> None:
        state_dir, self._stack_dir = self._stack_dir, None
        if state_dir is None:
            return
        if keep_logs_in is not None:
            with contextlib.suppress(OSError):
                shutil.copytree(state_dir / "logs", keep_logs_in / "logs", dirs_exist_ok=True)
                shutil.copyfile(state_dir / "stack.json", keep_logs_in / "stack.json")
        with contextlib.suppress(StackCommandError, OSError):
            stack_down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


EXIT_CODES = {PASS: EXIT_PASS, FAIL: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}


def run_verdict(results: Iterable[Mapping[str, object]]) -> str:
    """The run's verdict: fail wins, then inconclusive; pass only when every experiment
    passed (and there was at least one)."""
    verdicts = [r.get("verdict") for r in results if r.get("verdict") != NOT_APPLICABLE]
    if not verdicts or any(v not in (PASS, INCONCLUSIVE) for v in verdicts):
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS
