"""``python -m canarystack.cluster``: up, status, down, logs, timeline of the local stack."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from canary_contract.stack import StackStatus
from canarystack.cluster import stack
from canarystack.cluster.spec import StackConfigError, load_stack_config
from canarystack.common.cli import entry

DEFAULT_STATE_DIR = ".stack"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gameday stack", description="Run the reference LLM release stack locally."
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def state_dir(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--state-dir",
            default=DEFAULT_STATE_DIR,
            help="folder for config, logs, SQLite and the credentials (default %(default)s)",
        )

    up = sub.add_parser("up", help="start the stack (no change if it is running)")
    state_dir(up)
    up.add_argument("--base-port", type=int, default=None, help="first port (default 18100)")
    up.add_argument("--config", default=None, help="stack config YAML (see README)")
    up.add_argument("--canary-weight", type=int, default=None, help="initial canary %% (5)")
    up.add_argument(
        "--engine", default=None, choices=["sim", "llamacpp", "vllm"], help="model engine (sim)"
    )
    up.add_argument("--json", action="store_true", help="print the status as JSON")

    st = sub.add_parser("status", help="components, PIDs, URLs, states, restarts")
    state_dir(st)
    st.add_argument("--json", action="store_true")

    down = sub.add_parser("down", help="stop the stack")
    state_dir(down)

    logs = sub.add_parser("logs", help="print a component's log")
    state_dir(logs)
    logs.add_argument("component", help="program (router-0) or role (router), or supervisord")
    logs.add_argument("-n", "--lines", type=int, default=50)

    tl = sub.add_parser("timeline", help="the release's events, relative to the first fault")
    state_dir(tl)
    tl.add_argument("release", nargs="?", default=None)
    tl.add_argument("--json", action="store_true")
    return p


def _print_status(console: Console, st: StackStatus) -> None:
    table = Table(title=f"stack in {st['state_dir']}")
    for col in ("component", "pid", "url", "state", "restarts", "health"):
        table.add_column(col)
    # The shared dependency (Redis) is a program like the others, shown after them.
    for c in [*st["components"], *st.get("dependencies", [])]:
        table.add_row(
            c["name"],
            str(c["pid"] or "-"),
            c["url"],
            c["state"],
            str(c["restarts"]),
            "ok" if c["healthy"] else "-",
        )
    console.print(table)
    console.print(f"router: {st['router_url']}   broker: {st['broker_url']}")


def _summarise_change(change: Mapping[str, object]) -> str:
    if "annotation" in change:
        rest = {k: v for k, v in change.items() if k != "annotation"}
        return f"{change['annotation']} {json.dumps(rest, default=str)}"
    return json.dumps(change, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Messages are never hard-wrapped (they get piped and grepped); tables get room.
    width = None if sys.stdout.isatty() else 160
    console = Console(soft_wrap=True, width=width)
    err = Console(stderr=True, soft_wrap=True)
    state_dir = Path(args.state_dir)
    try:
        if args.cmd == "up":
            spec = load_stack_config(
                args.config,
                state_dir=state_dir,
                base_port=args.base_port,
                canary_weight=args.canary_weight,
                engine=args.engine,
            )
            started, st = stack.up(spec)
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                if not started:
                    console.print(f"stack already running in {st['state_dir']}: nothing changed")
                _print_status(console, st)
                console.print(f"\nsend requests to {st['router_url']}/v1/completions")
        elif args.cmd == "status":
            st = stack.status(state_dir)
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                _print_status(console, st)
            return 0 if st["running"] else 3
        elif args.cmd == "down":
            if stack.down(state_dir):
                console.print(f"stack in {state_dir.resolve()} stopped")
            else:
                console.print(f"no running stack in {state_dir.resolve()}")
        elif args.cmd == "logs":
            for path in stack.log_paths(state_dir, args.component):
                console.print(f"==> {path} <==", style="bold")
                try:
                    lines = path.read_text(errors="replace").splitlines()
                except OSError:
                    lines = ["(no log yet)"]
                print("\n".join(lines[-args.lines :]))
        elif args.cmd == "timeline":
            tl = stack.timeline(state_dir, args.release)
            if args.json:
                print(json.dumps(tl, indent=2))
            else:
                ref = "first fault" if tl["t0_is_fault"] else "first event (no fault injected)"
                table = Table(title=f"release {tl['release']}: times relative to the {ref}")
                for col in ("t (s)", "rev", "actor", "change", "reason"):
                    table.add_column(col, overflow="fold")
                for e in tl["events"]:
                    table.add_row(
                        f"{e['t_rel_s']:+.3f}",
                        str(e.get("revision", "")),
                        str(e.get("actor", "")),
                        _summarise_change(e.get("change") or {}),
                        str(e.get("reason") or ""),
                    )
                console.print(table)
    except (stack.StackError, StackConfigError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    return 0


if __name__ == "__main__":
    entry(main)
