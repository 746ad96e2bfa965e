"""Read a run folder (docs/ARCHITECTURE.md §7, §7.1) into memory, and say what is missing.

Must never raise on bad run-folder content (only ``ReportInputError`` for a RUN_DIR that
is not a run folder at all) and never write anything: every absent, empty or unreadable
piece becomes a ``Missing`` entry and the loader goes on with what it has. At ~400
lines because each run-folder file's reader sits beside the ``Missing`` it may give.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from canary_contract.json import JsonObject
from gameday.errors import GamedayError
from gameday.load.records import part_paths
from gameday.report.frames import (
    LOAD_COLUMNS,
    LOAD_KEY_COLUMNS,
    ORACLE_COLUMNS,
    ORACLE_KEY_COLUMNS,
    empty_frame,
    read_parquet,
)
from gameday.report.missing import Missing, short
from gameday.report.spec import GamedaySpec, spec_from_definition, spec_from_name

# Record files a killed writer may leave only as closed parts (gameday.load.records).
PART_FILES = ("records.parquet", "oracle.parquet")
EXPERIMENT_FILES = (
    "journal.json",
    "experiment.yaml",
    "records.parquet",
    "oracle.parquet",
    "faults.jsonl",
    "timeline.json",
    "result.json",
    "chaos.log",
)

UNKNOWN_BUCKET = "unknown"


class ReportInputError(GamedayError, ValueError):
    """RUN_DIR is not something a report can be built from (a usage error)."""


@dataclass
class ExperimentData:
    name: str
    path: Path
    journal: JsonObject | None = None
    definition: JsonObject | None = None  # the experiment (from the journal or yaml)
    spec: GamedaySpec | None = None
    records: pd.DataFrame = field(default_factory=lambda: empty_frame(LOAD_COLUMNS))
    oracle: pd.DataFrame = field(default_factory=lambda: empty_frame(ORACLE_COLUMNS))
    faults: list[JsonObject] = field(default_factory=list)
    timeline: JsonObject | None = None
    result: JsonObject | None = None
    missing: list[Missing] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.definition and isinstance(self.definition.get("title"), str):
            return str(self.definition["title"])
        return self.name

    @property
    def description(self) -> str:
        if self.definition and isinstance(self.definition.get("description"), str):
            return str(self.definition["description"])
        return ""

    def window_start(self) -> float | None:
        """When the experiment started (journal, else result.json), epoch seconds."""
        return self._journal_else_result("start", "started_at")

    def window_end(self) -> float | None:
        """When the experiment ended (journal, else result.json), epoch seconds."""
        return self._journal_else_result("end", "ended_at")

    def _journal_else_result(self, journal_key: str, result_key: str) -> float | None:
        t = parse_time(self.journal.get(journal_key)) if self.journal is not None else None
        if t is None and self.result is not None:
            return parse_time(self.result.get(result_key))
        return t


@dataclass
class RunData:
    run_dir: Path
    run_info: JsonObject | None
    experiments: list[ExperimentData]
    missing: list[Missing]

    @property
    def run_id(self) -> str:
        if self.run_info and isinstance(self.run_info.get("run_id"), str):
            return str(self.run_info["run_id"])
        return self.run_dir.resolve().name


def parse_time(value: Any) -> float | None:
    """Epoch seconds from a float or an ISO 8601 string (Chaos Toolkit writes ISO)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------------------------------
# The run folder


def load_run(run_dir: str | Path) -> RunData:
    """Read everything under ``run_dir``; raises ``ReportInputError`` only for a wrong path.

    A run folder is ``reports/<run-id>/`` with ``run.json`` and one sub-folder per
    experiment (``journal.json``, ``experiment.yaml``, ``records.parquet``,
    ``oracle.parquet``, ``faults.jsonl``, ``timeline.json``, ``result.json``,
    ``chaos.log``), possibly nested one level (``router/latency``). Any piece may be
    absent, empty or unreadable (an interrupted run, a load generator that died, a full
    disk): each becomes a ``Missing`` saying which piece, what is wrong, what the report
    cannot show and whether the verdict fails because of it. Records always come back as
    DataFrames with the columns the report uses, possibly with no rows.
    """
    root = Path(run_dir)
    if not root.exists():
        raise ReportInputError(
            f"RUN_DIR {str(root)!r} does not exist: give a run folder such as reports/latest"
        )
    if not root.is_dir():
        raise ReportInputError(
            f"RUN_DIR {str(root)!r} is a file: give the run folder (reports/<run-id>)"
        )
    if (root / "journal.json").exists() or (root / "records.parquet").exists():
        raise ReportInputError(
            f"RUN_DIR {str(root)!r} looks like one experiment's folder (it holds journal.json "
            f"or records.parquet): give the run folder above it, {str(root.parent)!r}"
        )
    runs = [c.name for c in sorted(root.iterdir()) if c.is_dir() and (c / "run.json").exists()]
    if runs:
        raise ReportInputError(
            f"RUN_DIR {str(root)!r} holds run folders ({', '.join(runs[:3])}"
            f"{', ...' if len(runs) > 3 else ''}): give one of them, e.g. "
            f"{str(root / runs[-1])!r} or reports/latest"
        )
    missing: list[Missing] = []
    run_info = _read_json(
        root / "run.json",
        None,
        missing,
        "run.json",
        required=False,
        effect="the run id and the list of planned experiments are unknown",
    )
    folders = discover_experiments(root)
    planned = _planned_experiments(run_info)
    if not folders and run_info is None:
        raise ReportInputError(
            f"RUN_DIR {str(root)!r} holds neither run.json nor an experiment folder: "
            "give a run folder written by `gameday run` (reports/<run-id> or reports/latest)"
        )
    experiments = [load_experiment(name, path) for name, path in folders]
    found = {e.name for e in experiments} | {e.path.name for e in experiments}
    for name in planned:
        if name not in found:
            exp = ExperimentData(name=name, path=root / name)
            exp.spec = spec_from_name(name)
            exp.missing.append(
                Missing(
                    name,
                    "experiment folder",
                    "listed in run.json but absent",
                    "the run stopped before this experiment ran",
                    required=True,
                )
            )
            experiments.append(exp)
    if not experiments:
        missing.append(
            Missing(
                None,
                "experiments",
                "no experiment folder in the run",
                "the run stopped before its first experiment",
                required=True,
            )
        )
    return RunData(run_dir=root, run_info=run_info, experiments=experiments, missing=missing)


def discover_experiments(root: Path) -> list[tuple[str, Path]]:
    """Sub-folders (one or two levels down) holding any experiment file, sorted by name.
    An experiment folder may hold others: ``control`` (experiments/control.yaml) holds
    ``control/benign-noise`` (experiments/control/benign-noise.yaml)."""
    found: list[tuple[str, Path]] = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.is_symlink() or child.name.startswith("."):
            continue
        if _is_experiment_dir(child):
            found.append((child.name, child))
        for grandchild in sorted(child.iterdir()):
            if grandchild.is_dir() and _is_experiment_dir(grandchild):
                found.append((f"{child.name}/{grandchild.name}", grandchild))
    return found


def _is_experiment_dir(path: Path) -> bool:
    if any((path / name).exists() for name in EXPERIMENT_FILES):
        return True
    # A load run killed before it merged its records leaves only their closed parts.
    return any(part_paths(path / name) for name in PART_FILES)


def _planned_experiments(run_info: JsonObject | None) -> list[str]:
    if not run_info:
        return []
    names: list[str] = []
    for item in run_info.get("experiments") or []:
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, dict):
            for key in ("name", "experiment", "dir"):
                if isinstance(item.get(key), str):
                    names.append(item[key])
                    break
    return names


# ---------------------------------------------------------------------------------------
# One experiment


def load_experiment(name: str, path: Path) -> ExperimentData:
    exp = ExperimentData(name=name, path=path)
    m = exp.missing
    exp.journal = _read_json(
        path / "journal.json",
        name,
        m,
        "journal.json",
        required=True,
        effect="no Chaos Toolkit status, probe results or SLO checks for this experiment",
    )
    if exp.journal is not None and isinstance(exp.journal.get("experiment"), dict):
        exp.definition = exp.journal["experiment"]
    else:
        exp.definition = _read_yaml(path / "experiment.yaml", name, m)
    exp.spec = spec_from_definition(exp.definition, name, m)
    exp.result = _read_json(
        path / "result.json",
        name,
        m,
        "result.json",
        required=True,
        effect="the run did not record its own verdict (interrupted before the end?)",
    )
    exp.timeline = _read_json(
        path / "timeline.json",
        name,
        m,
        "timeline.json",
        required=bool(exp.spec and exp.spec.expect == "trip"),
        effect="no broker events: trip, weights applied and rollback times are unknown",
    )
    if exp.timeline is not None and not isinstance(exp.timeline.get("events"), list):
        m.append(
            Missing(
                name,
                "timeline.json",
                "has no 'events' list",
                "trip, weights applied and rollback times are unknown",
                required=bool(exp.spec and exp.spec.expect == "trip"),
            )
        )
        exp.timeline = None
    exp.faults = _read_faults(path / "faults.jsonl", name, m, exp.spec)
    exp.records = read_parquet(
        path / "records.parquet",
        LOAD_COLUMNS,
        LOAD_KEY_COLUMNS,
        name,
        m,
        required=True,
        effect="no heatmaps of TTFT, errors or canary share; last canary request unknown",
    )
    needs_oracle = bool(exp.spec and exp.spec.fault in ("faulty-kernel", "pod-kill"))
    exp.oracle = read_parquet(
        path / "oracle.parquet",
        ORACLE_COLUMNS,
        ORACLE_KEY_COLUMNS,
        name,
        m,
        required=False,
        effect="no drift heatmap; first drifted sample taken from the gate's evidence",
        quiet_when_absent=not needs_oracle,
    )
    if (exp.result or {}).get("verdict") == "not_applicable":
        # Never run on this target (gameday.run.capabilities): nothing of it is missing.
        exp.missing = []
    return exp


def _read_json(
    path: Path,
    experiment: str | None,
    missing: list[Missing],
    piece: str,
    required: bool,
    effect: str,
) -> JsonObject | None:
    if not path.exists():
        missing.append(Missing(experiment, piece, "absent", effect, required))
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        missing.append(Missing(experiment, piece, f"unreadable ({short(exc)})", effect, required))
        return None
    if not isinstance(value, dict):
        missing.append(Missing(experiment, piece, "is not a JSON object", effect, required))
        return None
    return value


def _read_yaml(path: Path, experiment: str, missing: list[Missing]) -> JsonObject | None:
    if not path.exists():
        return None
    try:
        value = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        missing.append(
            Missing(
                experiment,
                "experiment.yaml",
                f"unreadable ({short(exc)})",
                "the experiment's title and description are unknown",
                False,
            )
        )
        return None
    return value if isinstance(value, dict) else None


def _read_faults(
    path: Path, experiment: str, missing: list[Missing], spec: GamedaySpec | None
) -> list[JsonObject]:
    has_fault = not (spec and spec.fault in (None, "none"))
    effect = "the fault time is taken from the broker's fault_injected annotation, if any"
    if not path.exists():
        if has_fault:
            missing.append(Missing(experiment, "faults.jsonl", "absent", effect, False))
        return []
    entries: list[JsonObject] = []
    bad: list[int] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        missing.append(
            Missing(experiment, "faults.jsonl", f"unreadable ({short(exc)})", effect, False)
        )
        return []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if isinstance(entry, dict) and parse_time(entry.get("time")) is not None:
            entry["time"] = parse_time(entry.get("time"))
            entries.append(entry)
        else:
            bad.append(number)
    if bad:
        # A harness killed mid-write leaves a torn last line: keep the rest.
        missing.append(
            Missing(
                experiment,
                "faults.jsonl",
                f"unreadable line(s) {bad[:5]}",
                "those ledger entries are ignored",
                False,
            )
        )
    entries.sort(key=lambda e: e["time"])
    return entries
