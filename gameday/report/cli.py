"""``gameday report RUN_DIR``: build the report of a run folder and say the verdict.

Prints the verdict (with the reasons when it failed) and the path of report.html.
Exit code: 0 when the verdict is pass, 1 when it is fail, 2 on a usage error (RUN_DIR
missing or not a run folder, a bad option, a run folder that cannot be written).

This module only parses arguments and prints; the work is ``gameday.report.build``.
"""

from __future__ import annotations

from pathlib import Path

import click

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
MAX_REASONS_SHOWN = 12


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--bin-s",
    type=click.FloatRange(min=0.1, max=3600),
    default=None,
    help="Heatmap bin width in seconds (default: chosen from the run's length).",
)
@click.pass_context
def report_cmd(ctx: click.Context, run_dir: Path, bin_s: float | None) -> None:
    """Build summary.json, junit.xml, report.html and the figures of RUN_DIR.

    RUN_DIR is a run folder written by `gameday run`, e.g. reports/latest. Exit code 0
    when the verdict is pass, 1 when it is fail, 2 on a usage error.
    """
    from gameday.report.build import build_report
    from gameday.report.loader import ReportInputError

    try:
        summary = build_report(run_dir, bin_s=bin_s)
    except ReportInputError as exc:
        raise click.UsageError(str(exc), ctx) from None
    except OSError as exc:
        # Exit 1 means "the verdict is fail": an unwritable folder must not look like one.
        click.echo(
            f"Error: cannot read the run folder or write the report in {str(run_dir)!r}: "
            f"{exc.strerror or exc} (give a run folder you can write to, or copy it first)",
            err=True,
        )
        ctx.exit(EXIT_USAGE)
    inconclusive = summary.verdict == "inconclusive"
    colour = "green" if summary.passed else ("yellow" if inconclusive else "red")
    click.secho(f"verdict: {summary.headline}", fg=colour, bold=True)
    for reason in summary.reasons[:MAX_REASONS_SHOWN]:
        click.echo(f"  - {reason}")
    if len(summary.reasons) > MAX_REASONS_SHOWN:
        click.echo(f"  ... and {len(summary.reasons) - MAX_REASONS_SHOWN} more (see summary.json)")
    missing = summary.all_missing()
    if missing:
        click.echo(f"missing: {len(missing)} piece(s) of data (listed in the report)")
    click.echo(f"report: {summary.report_html.resolve()}")
    # As gameday run: fail 1, inconclusive 3 (the gate could not see; never a pass).
    ctx.exit(EXIT_PASS if summary.passed else EXIT_INCONCLUSIVE if inconclusive else EXIT_FAIL)
