"""The ``gameday`` command.

Subcommands are registered by their own modules (``gameday stack``, ``gameday run``,
``gameday report``, ``gameday fault-proxy``); this module only builds the group.
"""

from __future__ import annotations

import click

from gameday import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gameday")
def cli() -> None:
    """Chaos game days for an LLM canary gate.

    Inject latency, pod kills and faulty-kernel canaries into the router, broker and
    rollback components of an LLM release stack while Locust replays mixed-length
    prompts; check that the gate trips within its SLO and users were protected.
    """


def _register() -> None:
    from gameday.faultproxy.cli import fault_proxy_cmd
    from gameday.report.cli import report_cmd
    from gameday.run.cli import run_cmd
    from gameday.stack import stack_cmd

    cli.add_command(stack_cmd)
    cli.add_command(report_cmd)
    cli.add_command(run_cmd)
    cli.add_command(fault_proxy_cmd)


def main() -> None:
    _register()
    cli()


if __name__ == "__main__":
    main()
