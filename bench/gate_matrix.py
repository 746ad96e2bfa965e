"""The three-gate matrix (#29): the same experiments against three canary gates, one
column each, written to ``bench/results/gate_matrix.json`` for the README to quote.

- ``canarystack``: the project's own stack and gate (``targets/local.yaml``, a fresh local
  stack per experiment, as ``make gameday`` runs it);
- ``alert-errors-latency``: the foreign stack (deploy/foreign: Envoy, two engines, the fault
  proxy, Prometheus, Alertmanager, a rollback hook) with its alert on errors and latency
  only (``targets/foreign.yaml``);
- ``alert-judge``: the same foreign stack with Envoy mirroring to the drift judge and an
  alert on its verdict beside the other two (``targets/foreign-judge.yaml``).

Rows: time from the fault to the trip (the faulty and the broken kernel), drifted answers
served to users (canary-served requests the kernel fault reached, from the load records,
the harness's own ``drifted_responses`` count), and false trips under the healthy controls
(``control``, ``control/benign-noise``, ``control/small-drift``).

Must never compute a figure the run's own report does not: times and verdicts are each
run's ``summary.json``; the drifted count is ``gameday.evidence.checks.drifted_responses``
over the run folder's records, as the probe computes it.

    .venv/bin/python bench/gate_matrix.py                 # all three gates (~20 min)
    .venv/bin/python bench/gate_matrix.py --from-runs reports/gate-matrix-<time>  # quote them
    make gate-matrix
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _results

from canary_contract.json import JsonObject
from gameday.evidence.checks import drifted_responses
from gameday.run.folder import RunFolder

NAME = "gate_matrix"
ROOT = _results.ROOT
FAULTY = ("router/faulty-kernel", "router/broken-kernel")
CONTROLS = ("control", "control/benign-noise", "control/small-drift")
EXPERIMENTS = (*CONTROLS, *FAULTY)
FOREIGN = [sys.executable, str(ROOT / "deploy" / "foreign" / "foreign.py")]
FOREIGN_STATE = ".foreign"  # the foreign target files' state folder
# gate -> (what it is, target file, foreign.py up flags; None: the local stack)
GATES: dict[str, tuple[str, str, list[str] | None]] = {
    "canarystack": ("canarystack's gate (local stack)", "targets/local.yaml", None),
    "alert-errors-latency": (
        "Envoy + Prometheus alert on errors and latency",
        "targets/foreign.yaml",
        ["--no-judge"],
    ),
    "alert-judge": (
        "Envoy + Prometheus alert on the drift judge's verdict",
        "targets/foreign-judge.yaml",
        ["--judge"],
    ),
}


def _experiment_file(name: str) -> str:
    return f"experiments/{name}.yaml"


def moved_target(target: str, base: int, out: Path) -> Path:
    """A foreign target file moved to the ports from ``base`` (its reset too), in ``out``:
    other stacks on the machine may hold the default 18700..18708."""
    text = (ROOT / target).read_text()
    text = re.sub(r"1870(\d)", lambda m: str(base + int(m.group(1))), text)
    text = text.replace(", reset, ", f", reset, --base-port, '{base}', ")
    path = out / Path(target).name
    path.write_text(text)
    return path


def run_gate(gate: str, out: Path, run_id: str, local_base: int, foreign_base: int) -> Path:
    """One gate's run of every experiment with the gameday CLI (the foreign stack brought
    up before and down after); returns its run folder."""
    _, target, up_flags = GATES[gate]
    out.mkdir(parents=True, exist_ok=True)
    if up_flags is None:
        where = ["--target", target, "--base-port", str(local_base)]
    else:
        where = ["--target", str(moved_target(target, foreign_base, out))]
    cmd = [
        str(ROOT / ".venv" / "bin" / "gameday"),
        "run",
        *(_experiment_file(e) for e in EXPERIMENTS),
        *where,
        "--out",
        str(out),
        "--run-id",
        run_id,
    ]
    state = ["--state-dir", FOREIGN_STATE]
    if up_flags is not None:
        up = subprocess.run(
            [*FOREIGN, "up", *state, "--base-port", str(foreign_base), *up_flags],
            cwd=ROOT,
            check=False,
        )
        if up.returncode != 0:
            raise SystemExit(
                f"foreign.py up {' '.join(up_flags)} failed (exit {up.returncode}): is a "
                f"foreign stack already running in {FOREIGN_STATE}, or are ports "
                f"{foreign_base}..{foreign_base + 8} taken? Pick --foreign-base-port"
            )
    try:
        # Exit 1 (an experiment failed, by design for the errors-and-latency alert) still
        # leaves the run's report.
        subprocess.run(cmd, cwd=ROOT, check=False, timeout=len(EXPERIMENTS) * 600)
    finally:
        if up_flags is not None:
            subprocess.run([*FOREIGN, "down", *state], cwd=ROOT, check=False)
    return out / run_id


def drifted_served(folder: Path) -> int | None:
    """Canary-served requests the kernel fault reached (the probe's own count)."""
    run = RunFolder(folder)
    kernel = run.first_fault("inject", "kernel")
    frame = run.records("drifted_responses", 0.0, "count")
    if kernel is None or isinstance(frame, dict):
        return None
    measured = drifted_responses(frame, kernel, 0)["measured"]
    return None if measured is None else int(measured)


def gate_figures(run_dir: Path) -> JsonObject:
    """Each experiment's verdict, trip and drifted count in ``run_dir``."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a readable summary.json ({exc})") from exc
    by_name = {e["name"]: e for e in summary["experiments"]}
    rows: dict[str, Any] = {}
    for name in EXPERIMENTS:
        e = by_name.get(name)
        if e is None:
            rows[name] = {"verdict": "not run"}
            continue
        row: dict[str, Any] = {
            "verdict": e["verdict"],
            "tripped": bool(e.get("tripped")),
            "time_to_trip_s": e.get("time_to_trip_s"),
        }
        if name in FAULTY:
            row["drifted_served"] = drifted_served(run_dir / name)
        rows[name] = row
    controls = [rows[c] for c in CONTROLS if rows[c]["verdict"] != "not run"]
    return {
        "run_dir": str(run_dir),
        "verdict": summary.get("verdict"),
        "experiments": rows,
        "false_trips": sum(1 for r in controls if r.get("tripped")),
        "controls_run": len(controls),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reports", type=Path, default=ROOT / "reports", help="where runs go")
    p.add_argument(
        "--from-runs",
        type=Path,
        help="quote runs made before: DIR/<gate> for each gate (a previous run's folder)",
    )
    p.add_argument("--gates", default=",".join(GATES), help="comma-separated (default: all)")
    p.add_argument(
        "--local-base-port", type=int, default=18100, help="canarystack's stack (default 18100)"
    )
    p.add_argument(
        "--foreign-base-port",
        type=int,
        default=18700,
        help="the foreign stack's B (default 18700, the target files'; another moves them)",
    )
    p.add_argument("--out", type=Path, help=f"results file (default bench/results/{NAME}.json)")
    args = p.parse_args()
    gates = [g.strip() for g in args.gates.split(",") if g.strip()]
    unknown = [g for g in gates if g not in GATES]
    if unknown:
        raise SystemExit(f"--gates: unknown {unknown}; choose from {', '.join(GATES)}")
    run = _results.Run(NAME)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    figures: dict[str, Any] = {
        "experiments": list(EXPERIMENTS),
        "faulty": list(FAULTY),
        "controls": list(CONTROLS),
        "gates": {},
    }
    out = args.from_runs or args.reports / f"gate-matrix-{stamp}"
    for gate in gates:
        label, target, _ = GATES[gate]
        if args.from_runs is not None:
            run_dir = out / gate
        else:
            run_dir = run_gate(gate, out, gate, args.local_base_port, args.foreign_base_port)
        figures["gates"][gate] = {"label": label, "target": target, **gate_figures(run_dir)}
    figures["runs"] = str(out)
    run.write(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
