"""``gameday run EXPERIMENT... [--target FILE] [--out DIR] [--stack-config FILE]``.

This module parses arguments and prints; the work is ``gameday.run.runner``.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gameday.run.plan import PlanError, RunPlan, plan_run
from gameday.run.result import ExperimentResult
from gameday.run.runner import EXIT_INCONCLUSIVE, EXIT_PASS, GameDay, RunOutcome

EXIT_USAGE = 2
VERDICT_COLOURS = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
SHOWN_LEVELS = ("INFO", "WARNING", "ERROR", "CRITICAL", "OUTPUT")
QUIET_PREFIXES = ("Validating the experiment", "Experiment looks valid", "Steady-state strategy")

FIGURES = (
    ("time_to_trip_s", "trip {:.2f} s after the fault"),
    ("rollback_s", "last canary request +{:.2f} s"),
    ("drifted_responses", "{:g} drifted served"),
    ("baseline_ttft_p99_s", "baseline TTFT p99 {:.3f} s"),
    ("failed_requests", "{} failed"),
    ("requests", "of {} requests"),
    ("gate_comparisons", "gate saw {} comparisons"),
    ("gate_canary_outcomes", "{} canary outcomes"),
    ("load_rps", "load {:.1f} req/s"),
    ("load_cpu", "Locust CPU {:.0%}"),
)


class TerminalProgress:
    """Shows progress on the terminal (rich): each experiment's stage, Chaos Toolkit's activity
    lines as they happen, the verdict and key figures of each experiment, and the run's
    verdict with the report's path. Exit code: 0 when every experiment passed (and the
    report agrees), 1 when any failed, 2 on a usage error, 3 when none failed but one was
    inconclusive (the gate could not have seen the fault, or the load generator was not
    valid: never a pass), 128+N when interrupted by signal N (130 for Ctrl-C).
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()
        self.current = ""

    def _stamp(self) -> str:
        return f"[dim]{time.monotonic() - self.t0:6.1f}s[/dim]"

    def run_started(self, plan: RunPlan) -> None:
        stack = (
            "a fresh local stack per experiment, started and stopped by gameday run"
            if plan.owns_stack
            else "the target as it is"
        )
        runs = f"{len(plan.experiments)} experiment(s)"
        if plan.repeat > 1:
            runs = (
                f"a campaign of {len(plan.experiments)} runs "
                f"({len(plan.experiments) // plan.repeat} experiment(s) x {plan.repeat})"
            )
        self.console.print(
            f"[bold]gameday run {plan.run_id}[/bold]: {runs} "
            f"on target {plan.target.name!r} ({plan.target.kind}), {stack}"
        )
        for note in plan.notes:
            self.console.print(f"  [yellow]note:[/yellow] {note}")
        self.console.print(f"  folder: {plan.run_dir}")

    def experiment_started(self, index: int, total: int, name: str) -> None:
        self.current = name
        self.console.rule(f"[bold][{index}/{total}] {name}")

    def stage(self, name: str, text: str) -> None:
        self.console.print(f"{self._stamp()} [cyan]{text}[/cyan]")

    def chaos_line(self, name: str, level: str, message: str, elapsed_s: float) -> None:
        if level not in SHOWN_LEVELS or message.startswith(QUIET_PREFIXES):
            return
        style = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}.get(level, "")
        text = message if not style else f"[{style}]{message}[/{style}]"
        self.console.print(f"{self._stamp()} [dim]chaos +{elapsed_s:5.1f}s[/dim] {text}",
                           markup=True, highlight=False)  # fmt: skip

    def experiment_done(self, name: str, result: ExperimentResult) -> None:
        verdict = result["verdict"]
        took = result["ended_at"] - result["started_at"]
        colour = VERDICT_COLOURS.get(verdict, "red")
        head = f"[bold {colour}]{verdict.upper()}[/bold {colour}]"
        self.console.print(f"{self._stamp()} {head} {name} in {took:.0f} s — {_figures(result)}")
        for reason in result["reasons"]:
            self.console.print(f"    [{colour}]-[/{colour}] {reason}", highlight=False)

    def run_done(self, outcome: RunOutcome) -> None:
        self.console.rule()
        table = Table(title=f"run {outcome.run_dir.name}")
        for col in ("experiment", "verdict", "figures"):
            table.add_column(col, overflow="fold")
        for r in outcome.results:
            colour = VERDICT_COLOURS.get(r["verdict"], "red")
            table.add_row(r["experiment"], f"[{colour}]{r['verdict']}[/{colour}]", _figures(r))
        for name in outcome.not_run:
            table.add_row(name, "[yellow]not run[/yellow]", "")
        self.console.print(table)
        # Why each experiment did not pass, again under the table: a CI log shows its tail.
        for r in outcome.results:
            if r["verdict"] in ("fail", "inconclusive") and r["reasons"]:
                colour = VERDICT_COLOURS.get(r["verdict"], "red")
                self.console.print(f"[{colour}]{r['experiment']} ({r['verdict']}):[/{colour}]")
                for reason in r["reasons"]:
                    self.console.print(f"    - {reason}", highlight=False)
        if outcome.interrupted:
            self.console.print(
                f"[bold red]interrupted by {outcome.interrupted}[/bold red]: faults in the "
                "ledgers were cleared, the load and the stack this run started were stopped"
            )
        if outcome.report_error:
            self.console.print(f"[red]the report could not be built:[/red] {outcome.report_error}")
        elif outcome.report_headline:
            for line in outcome.campaign_lines:
                self.console.print(f"campaign: {line}")
            self.console.print(f"report: {outcome.report_headline}")
            self.console.print(f"        {outcome.report_html}")
        word = {EXIT_PASS: "pass", EXIT_INCONCLUSIVE: "inconclusive"}.get(outcome.exit_code, "fail")
        colour = VERDICT_COLOURS[word]
        self.console.print(
            f"verdict: [bold {colour}]{word.upper()}[/bold {colour}] "
            f"(exit code {outcome.exit_code})"
        )


def _figures(result: ExperimentResult) -> str:
    figs = result["figures"]
    parts = []
    for key, fmt in FIGURES:
        value = figs.get(key)
        if value is not None:
            try:
                parts.append(fmt.format(value))
            except (TypeError, ValueError):
                parts.append(f"{key} {value}")
    return ", ".join(parts) or "no figures"


@click.command("run")
@click.argument(
    "experiments", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False)
)
@click.option(
    "--target",
    "target_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Target file (default: $GAMEDAY_TARGET, else targets/local.yaml).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("reports"),
    show_default=True,
    help="Where run folders go (reports/<run-id>/, reports/latest).",
)
@click.option(
    "--stack-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Stack config YAML for the local stacks this run starts (e.g. gate arguments).",
)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65000),
    default=None,
    help="First port of the local stacks this run starts (default: the stack's, 18100).",
)
@click.option(
    "--experiment-timeout-s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Interrupt an experiment that runs longer than this.",
)
@click.option("--run-id", default=None, help="Name of the run folder (default: UTC time).")
@click.option(
    "--repeat",
    type=click.IntRange(1, 1000),
    default=1,
    show_default=True,
    help="A campaign: run each experiment N times (round-robin, a fresh stack and the load "
    "seed --load-seed + k - 1 for run k, folder <experiment>@rKK); the report gives "
    "passes/N and time-to-trip p50/p95 with 95 % intervals per experiment.",
)
@click.option(
    "--certify",
    is_flag=True,
    help="Turn the detection SLO into a claim: p95 <= SLO at 95 % confidence, which "
    "needs >= 59 runs with none over (fewer: the verdict says what they prove, and is "
    "inconclusive).",
)
@click.option(
    "--load-seed",
    type=click.IntRange(0, 2**31 - 1),
    default=None,
    help="Seed of the load (prompt lengths, texts, order, user ids) of the first run "
    "(default: 0, the load's own).",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    default=None,
    envvar="GAMEDAY_PROMETHEUS_URL",
    help="A Prometheus on loopback that scrapes the stack (python -m gameday.prom up): the "
    "report adds its series (TTFT p99 and request rate per variant) beside the Locust "
    "records.",
)
@click.option("--no-report", is_flag=True, help="Skip building the report at the end.")
@click.pass_context
def run_cmd(
    ctx: click.Context,
    experiments: tuple[Path, ...],
    target_file: Path | None,
    out_dir: Path,
    stack_config: Path | None,
    base_port: int | None,
    experiment_timeout_s: float,
    run_id: str | None,
    repeat: int,
    certify: bool,
    load_seed: int | None,
    prometheus_url: str | None,
    no_report: bool,
) -> None:
    """Run Chaos Toolkit EXPERIMENTS against a target and decide a verdict.

    When the target is local and no stack runs in its state_dir, each experiment gets a
    fresh local stack (started and stopped by this command). Exit code 0 when every
    experiment passed, 1 when any failed, 2 on a usage error, 3 when none failed but one
    was inconclusive (the gate could not have seen, or the load was not valid), 130 on
    Ctrl-C.

    With --repeat N (a campaign) each experiment runs N times with different load seeds;
    with --certify the verdict also says what the runs prove about the detection SLO.
    """
    console = Console(highlight=False)
    if certify and no_report:
        console.print(
            "[red]error:[/red] --certify is decided by the report: drop --no-report "
            "(or drop --certify)"
        )
        ctx.exit(EXIT_USAGE)
    try:
        plan = plan_run(
            list(experiments),
            target_file=target_file,
            out_dir=out_dir,
            stack_config=stack_config,
            base_port=base_port,
            experiment_timeout_s=experiment_timeout_s,
            run_id=run_id,
            repeat=repeat,
            certify=certify,
            load_seed=load_seed,
            prometheus_url=prometheus_url,
        )
    except PlanError as exc:
        console.print(f"[red]error:[/red] {exc}")
        ctx.exit(EXIT_USAGE)
    outcome = GameDay(plan, TerminalProgress(console)).run(build_report=not no_report)
    ctx.exit(outcome.exit_code)
