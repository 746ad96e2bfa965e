"""Read a run folder (docs/ARCHITECTURE.md §7, §7.1) into memory, and say what is missing.

A run folder is ``reports/<run-id>/`` with ``run.json`` and one sub-folder per
experiment (``journal.json``, ``experiment.yaml``, ``records.parquet``,
``oracle.parquet``, ``faults.jsonl``, ``timeline.json``, ``result.json``, ``chaos.log``).
Experiment folders may also be nested one level (``router/latency``).

Every piece may be absent, empty or unreadable (an interrupted run, a load generator that
died, a disk that filled up). The loader then records a ``Missing`` entry — which piece,
what is wrong with it, what the report cannot show because of it, and whether it makes
the experiment's verdict fail (fail-closed: a piece the verdict depends on) — and goes
on with what it has. Records always come back as DataFrames with the columns the report
uses, possibly with no rows.

This module must never raise on bad run-folder content (only ``ReportInputError`` for a
RUN_DIR that is not a run folder at all) and never write anything.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from canary_contract.json import JsonObject
from gameday.load.records import part_paths, read_records_report
from gameday.report.jsonfields import fields_json

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

# The columns of the §7 schemas that the report reads, with the dtype it computes in.
LOAD_COLUMNS: dict[str, str] = {
    "start_time": "float64",
    "ttft_s": "float64",
    "e2e_s": "float64",
    "prompt_tokens": "float64",
    "status": "float64",
    "ok": "bool",
    "error_kind": "category",
    "served_by": "category",
    "bucket": "category",
}
ORACLE_COLUMNS: dict[str, str] = {
    "time": "float64",
    "prompt_tokens": "float64",
    "kl_mean": "float64",
    "kl_first": "float64",
    "top1_agree": "float64",
    "bucket": "category",
    "error": "category",
}
# Without these a records file is useless to the report.
LOAD_KEY_COLUMNS = ("start_time", "served_by")
ORACLE_KEY_COLUMNS = ("time", "kl_mean")

UNKNOWN_BUCKET = "unknown"


class ReportInputError(ValueError):
    """RUN_DIR is not something a report can be built from (a usage error)."""


@dataclass(frozen=True)
class Missing:
    """One thing the report could not read, and what follows from it."""

    experiment: str | None  # None: the run as a whole
    piece: str
    problem: str
    effect: str
    required: bool  # True: the experiment's verdict fails because of it (fail-closed)

    def to_json(self) -> JsonObject:
        return fields_json(self, rename={"required": "fails_verdict"})

    def sentence(self) -> str:
        where = f"{self.experiment}/{self.piece}" if self.experiment else self.piece
        return f"{where}: {self.problem} — {self.effect}"


@dataclass
class GamedaySpec:
    """The experiment's ``gameday`` extension: what it expects (§7.1)."""

    component: str | None
    fault: str | None
    expect: str | None  # "trip" | "no_trip" | "blind" | "colour_lost"
    slo: dict[str, float]
    drift_kl: float | None
    notes: list[str] = field(default_factory=list)
    from_extension: bool = True
    lost_at: str | None = None  # expect colour_lost: the hop that drops the colour


@dataclass
class ExperimentData:
    name: str
    path: Path
    journal: dict[str, Any] | None = None
    definition: dict[str, Any] | None = None  # the experiment (from the journal or yaml)
    spec: GamedaySpec | None = None
    records: pd.DataFrame = field(default_factory=lambda: empty_frame(LOAD_COLUMNS))
    oracle: pd.DataFrame = field(default_factory=lambda: empty_frame(ORACLE_COLUMNS))
    faults: list[dict[str, Any]] = field(default_factory=list)
    timeline: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
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
    run_info: dict[str, Any] | None
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


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (input is never trusted)."""
    return value if isinstance(value, dict) else {}


def empty_frame(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in columns.items()})


# ---------------------------------------------------------------------------------------
# The run folder


def load_run(run_dir: str | Path) -> RunData:
    """Read everything under ``run_dir``; raises ``ReportInputError`` only for a wrong path."""
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


def _planned_experiments(run_info: dict[str, Any] | None) -> list[str]:
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
    return exp


def _read_json(
    path: Path,
    experiment: str | None,
    missing: list[Missing],
    piece: str,
    required: bool,
    effect: str,
) -> dict[str, Any] | None:
    if not path.exists():
        missing.append(Missing(experiment, piece, "absent", effect, required))
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        missing.append(Missing(experiment, piece, f"unreadable ({_short(exc)})", effect, required))
        return None
    if not isinstance(value, dict):
        missing.append(Missing(experiment, piece, "is not a JSON object", effect, required))
        return None
    return value


def _read_yaml(path: Path, experiment: str, missing: list[Missing]) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        value = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        missing.append(
            Missing(
                experiment,
                "experiment.yaml",
                f"unreadable ({_short(exc)})",
                "the experiment's title and description are unknown",
                False,
            )
        )
        return None
    return value if isinstance(value, dict) else None


def _read_faults(
    path: Path, experiment: str, missing: list[Missing], spec: GamedaySpec | None
) -> list[dict[str, Any]]:
    has_fault = not (spec and spec.fault in (None, "none"))
    effect = "the fault time is taken from the broker's fault_injected annotation, if any"
    if not path.exists():
        if has_fault:
            missing.append(Missing(experiment, "faults.jsonl", "absent", effect, False))
        return []
    entries: list[dict[str, Any]] = []
    bad: list[int] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        missing.append(
            Missing(experiment, "faults.jsonl", f"unreadable ({_short(exc)})", effect, False)
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


def read_parquet(
    path: Path,
    columns: dict[str, str],
    key_columns: tuple[str, ...],
    experiment: str,
    missing: list[Missing],
    required: bool,
    effect: str,
    quiet_when_absent: bool = False,
) -> pd.DataFrame:
    """The file's rows as a DataFrame with exactly ``columns`` (absent ones all-null).

    When the file is absent but a writer that never merged it left closed parts
    (``records.part-000001.parquet``, ...), the readable parts are read
    (``gameday.load.records.read_records_report``) and the missing notes say how many
    rows came from how many parts, and which parts could not be read (their rows are
    lost: that note fails the verdict when the file is required).
    """
    piece = path.name
    if not path.exists():
        if part_paths(path):
            return _read_parts(path, columns, key_columns, experiment, missing, required, effect)
        if quiet_when_absent:
            return empty_frame(columns)
        missing.append(Missing(experiment, piece, "absent", effect, required))
        return empty_frame(columns)
    try:
        pfile = pq.ParquetFile(path)
        present = [c for c in columns if c in pfile.schema_arrow.names]
        dictionary = [c for c in present if columns[c] == "category"]
        table = pq.read_table(path, columns=present, read_dictionary=dictionary)
    except (OSError, pa.ArrowException, ValueError) as exc:
        missing.append(Missing(experiment, piece, f"unreadable ({_short(exc)})", effect, required))
        return empty_frame(columns)
    return _frame(
        table, present, columns, key_columns, experiment, piece, missing, required, effect
    )


def _read_parts(
    path: Path,
    columns: dict[str, str],
    key_columns: tuple[str, ...],
    experiment: str,
    missing: list[Missing],
    required: bool,
    effect: str,
) -> pd.DataFrame:
    piece = path.name
    try:
        found = read_records_report(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        missing.append(Missing(experiment, piece, f"unreadable ({_short(exc)})", effect, required))
        return empty_frame(columns)
    pattern = f"{path.stem}.part-*.parquet"
    if found.skipped:
        missing.append(
            Missing(
                experiment,
                pattern,
                f"{len(found.skipped)} part(s) unreadable: " + "; ".join(found.skipped),
                "the rows in those parts are lost: the records are incomplete",
                required,
            )
        )
    if found.source != "parts":
        missing.append(
            Missing(
                experiment,
                piece,
                f"absent; only {len(found.skipped)} part(s) ({pattern}) exist and none "
                "could be read (the run was interrupted)",
                effect,
                required,
            )
        )
        return empty_frame(columns)
    missing.append(
        Missing(
            experiment,
            piece,
            f"absent (the writer never merged it: the run was interrupted); "
            f"{found.table.num_rows} rows read from {len(found.parts)} closed part(s) "
            f"({pattern})",
            "rows not yet flushed when the writer died (its last batch) are not there",
            False,
        )
    )
    table = found.table
    present = [c for c in columns if c in table.column_names]
    return _frame(
        table.select(present),
        present,
        columns,
        key_columns,
        experiment,
        piece,
        missing,
        required,
        effect,
    )


def _frame(
    table: pa.Table,
    present: list[str],
    columns: dict[str, str],
    key_columns: tuple[str, ...],
    experiment: str,
    piece: str,
    missing: list[Missing],
    required: bool,
    effect: str,
) -> pd.DataFrame:
    lacking = [c for c in key_columns if c not in present]
    if lacking:
        missing.append(
            Missing(experiment, piece, f"lacks the column(s) {lacking}", effect, required)
        )
        return empty_frame(columns)
    if table.num_rows == 0:
        missing.append(Missing(experiment, piece, "has no rows", effect, required))
        return empty_frame(columns)
    other = [c for c in columns if c not in present]
    if other:
        missing.append(
            Missing(
                experiment,
                piece,
                f"lacks the column(s) {other}",
                "figures that need them stay empty",
                False,
            )
        )
    frame = table.to_pandas()
    return _normalise(frame, columns)


def _normalise(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    n = len(frame)
    out: dict[str, Any] = {}
    for name, dtype in columns.items():
        col = frame.get(name)
        if dtype == "float64":
            out[name] = np.full(n, np.nan) if col is None else pd.to_numeric(col, errors="coerce")
        elif dtype == "bool":
            # A null "ok" is not a success (fail-closed).
            out[name] = (
                np.zeros(n, dtype=bool)
                if col is None
                else col.astype("boolean").fillna(False).astype(bool)
            )
        elif col is None:
            out[name] = pd.Categorical(np.full(n, None, dtype=object))
        else:
            out[name] = (
                col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
            )
    result = pd.DataFrame(out)
    for name, dtype in columns.items():
        if dtype == "float64":
            result[name] = result[name].astype("float64")
    return result


# ---------------------------------------------------------------------------------------
# The gameday extension

DEFAULT_EXPECT = {
    "faulty-kernel": "trip",
    "pod-kill": "trip",
    "latency": "no_trip",
    "none": "no_trip",
    "broken-kernel": "trip",
    "client-flood": "no_trip",
    "pins-after-trip": "trip",
    "wrong-credential": "blind",
    "benign-noise": "no_trip",
    "small-drift": "no_trip",
}
_NAME_FAULTS = (
    "faulty-kernel",
    "broken-kernel",
    "pod-kill",
    "latency",
    "client-flood",
    "pins-after-trip",
    "wrong-credential",
    "benign-noise",
    "small-drift",
)
_NAME_COMPONENTS = ("router", "broker", "rollback", "hostile", "control")


def spec_from_name(name: str) -> GamedaySpec:
    """Where an experiment sits in the matrix when only its folder name is known."""
    low = name.lower()
    component = next((c for c in _NAME_COMPONENTS if c in low), None)
    fault = next((f for f in _NAME_FAULTS if f in low), None)
    if component == "control":
        fault = "none"
    return GamedaySpec(
        component=component,
        fault=fault,
        expect=None,
        slo={},
        drift_kl=None,
        notes=["placed by its folder name: no gameday extension was read"],
        from_extension=False,
    )


def spec_from_definition(
    definition: dict[str, Any] | None, name: str, missing: list[Missing]
) -> GamedaySpec:
    ext = None
    if definition is not None:
        for item in definition.get("extensions") or []:
            if isinstance(item, dict) and item.get("name") == "gameday":
                ext = item
                break
    if ext is None:
        if definition is not None:
            missing.append(
                Missing(
                    name,
                    "gameday extension",
                    "absent from the experiment",
                    "the report cannot tell whether a trip was expected",
                    True,
                )
            )
        return spec_from_name(name)
    config = definition.get("configuration") if isinstance(definition, dict) else None
    notes: list[str] = []
    slo: dict[str, float] = {}
    raw_slo = as_dict(ext.get("slo"))
    for key, value in raw_slo.items():
        number = _resolve_number(value, config)
        if number is None:
            notes.append(f"slo.{key} = {value!r} is not a number: the default is used")
        else:
            slo[str(key)] = number
    drift = _resolve_number(ext.get("drift_kl", raw_slo.get("drift_kl")), config)
    expect = ext.get("expect")
    if expect not in ("trip", "no_trip", "blind", "colour_lost"):
        missing.append(
            Missing(
                name,
                "gameday extension",
                f"expect is {expect!r}, not trip|no_trip|blind|colour_lost",
                "the report cannot tell whether a trip was expected",
                True,
            )
        )
        expect = None
    return GamedaySpec(
        component=ext.get("component") if isinstance(ext.get("component"), str) else None,
        fault=ext.get("fault") if isinstance(ext.get("fault"), str) else None,
        expect=expect,
        lost_at=ext.get("lost_at") if isinstance(ext.get("lost_at"), str) else None,
        slo=slo,
        drift_kl=drift,
        notes=notes,
    )


_VAR = re.compile(r"^\$\{([^}]+)\}$")


def _resolve_number(value: Any, configuration: Any) -> float | None:
    """A number, a numeric string, or ``${key}`` from the experiment's configuration.

    The journal keeps the experiment as written, so ``${detection_s}`` arrives
    unsubstituted; an ``env`` entry resolves to its default (the environment of the run
    is not recorded).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    match = _VAR.match(value.strip())
    if match and isinstance(configuration, dict):
        entry = configuration.get(match.group(1))
        if isinstance(entry, dict):
            entry = entry.get("default")
        return _resolve_number(entry, None)
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
