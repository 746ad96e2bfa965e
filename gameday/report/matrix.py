"""The game day matrix: component (rows) x fault (columns), one cell per experiment.

Must never read files or decide a verdict: a cell is coloured by its experiments'
verdicts, which already include whether the trip matched the expectation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gameday.report.campaign import QUANTILES, CampaignCell
from gameday.report.noise import NOT_MEASURED, ExperimentNoise
from gameday.report.summary import ExperimentSummary

ROWS = ("router", "broker", "rollback", "dependency", "control")
COLUMNS = ("latency", "pod-kill", "faulty-kernel", "none")
COLOURS = {
    "pass": "#2da44e",
    "fail": "#cf222e",
    "not run": "#d0d7de",
    "inconclusive": "#bf8700",
    "not_applicable": "#8c959f",
}


def combine(verdicts: set[str]) -> str:
    """A cell's verdict from its experiments': fail wins, then inconclusive; not
    applicable only when nothing in it ran."""
    ran = verdicts - {"not_applicable"}
    if not ran:
        return "not_applicable"
    if ran - {"pass", "inconclusive"}:
        return "fail"
    return "inconclusive" if "inconclusive" in ran else "pass"


MATRIX_COLUMNS = (
    "component",
    "fault",
    "experiments",
    "expect",
    "tripped",
    "time_to_trip_s",
    "verdict",
    "text",
    "noise_floor",
)


def build_matrix(
    experiments: list[ExperimentSummary],
    campaign: list[CampaignCell] | None = None,
    *,
    noise: dict[str, ExperimentNoise] | None = None,
) -> pd.DataFrame:
    """One row per (component, fault) cell, in display order, including cells not run.

    Rows: ``ROWS`` (``dependency`` is the shared Redis, issue #16), then any other
    component seen; columns: ``COLUMNS`` (then any other fault seen, e.g.
    ``pool-exhaustion``; ``none`` is the control run). A cell says what happened — "trip
    +2.3 s" (fault to trip), "no trip", "not run" — and is coloured by its verdict (pass:
    green, fail: red, inconclusive: amber, not run: grey). Several experiments in one cell
    (a re-run) fail the cell if any failed (else it is inconclusive if any was) and show
    the slowest trip.

    ``noise`` (experiment name -> the noise floor its gate measured): the column
    ``noise_floor`` says, per experiment of the cell, "noise KL 0.00102 (n=340)" or
    "noise floor not measured" (empty in a cell not run, and everywhere without
    ``noise``), and the figure shows it under the cell's text.

    ``campaign`` (``gameday run --repeat``): each cell says passes/N and time to trip
    p50/p95 with their 95 % intervals instead of one run's trip, its verdict joins the
    campaign cell's (with --certify, not certified is inconclusive), and the frame gains
    the columns ``CAMPAIGN_COLUMNS``."""
    rows = list(ROWS) + sorted({e.component or "?" for e in experiments} - set(ROWS))
    cols = list(COLUMNS[:3]) + sorted({e.fault or "?" for e in experiments} - set(COLUMNS[:3]))
    if "none" in cols:  # the control run's column goes last
        cols.remove("none")
        cols.append("none")
    cells = []
    for component in rows:
        for fault in cols:
            here = [
                e
                for e in experiments
                if (e.component or "?") == component and (e.fault or "?") == fault
            ]
            cell = _cell(component, fault, here)
            cell["noise_floor"] = None if noise is None else _noise_text(here, noise)
            cells.append(cell)
    frame = pd.DataFrame(cells, columns=list(MATRIX_COLUMNS))
    if campaign is not None:
        frame = _with_campaign(frame, campaign)
    # Keep rows/columns that hold an experiment, plus the standard ones.
    used_rows = set(frame.loc[frame["verdict"] != "not run", "component"]) | set(ROWS)
    used_cols = set(frame.loc[frame["verdict"] != "not run", "fault"]) | set(COLUMNS[:3])
    return frame[frame["component"].isin(used_rows) & frame["fault"].isin(used_cols)].reset_index(
        drop=True
    )


CAMPAIGN_COLUMNS = ("runs", "passes", "p50_s", "p50_ci95_s", "p95_s", "p95_ci95_s", "worst_run")


def _with_campaign(frame: pd.DataFrame, campaign: list[CampaignCell]) -> pd.DataFrame:
    extra: dict[str, list[object]] = {c: [] for c in CAMPAIGN_COLUMNS}
    texts, verdicts = [], []
    for row in frame.itertuples():
        here = [
            c
            for c in campaign
            if (c.component or "?") == row.component and (c.fault or "?") == row.fault
        ]
        docs = [c.to_json() for c in here]
        if not here:
            texts.append(row.text)
            verdicts.append(row.verdict)
            for col in CAMPAIGN_COLUMNS:
                extra[col].append(None)
            continue
        lines = [(f"{c.name.split('/')[-1]}: " if len(here) > 1 else "") + c.text() for c in here]
        texts.append("\n".join(lines))
        cell_verdicts = {str(row.verdict)} | {c.verdict for c in here}
        verdicts.append(combine(cell_verdicts))
        extra["runs"].append(sum(d["runs"] for d in docs))
        extra["passes"].append(sum(d["passes"] for d in docs))
        for label, _ in QUANTILES:
            st = [d["time_to_trip"][label] for d in docs]
            extra[f"{label}_s"].append("; ".join(_s(x["value_s"]) for x in st))
            extra[f"{label}_ci95_s"].append(
                "; ".join(f"[{_s(x['ci95_s'][0])}, {_s(x['ci95_s'][1])}]" for x in st)
            )
        extra["worst_run"].append(
            "; ".join(d["worst_run"]["name"] if d["worst_run"] else "" for d in docs)
        )
    out = frame.copy()
    out["text"] = texts
    out["verdict"] = verdicts
    for col, values in extra.items():
        out[col] = pd.array(values, dtype="Int64") if col in ("runs", "passes") else values
    return out


def _noise_text(here: list[ExperimentSummary], noise: dict[str, ExperimentNoise]) -> str | None:
    """The cell's experiments' noise floors, one line each (None: no experiment)."""
    if not here:
        return None
    lines = []
    for e in here:
        found = noise.get(e.name)
        text = found.cell_text() if found is not None else NOT_MEASURED
        lines.append((f"{e.name.split('/')[-1]}: " if len(here) > 1 else "") + text)
    return "\n".join(lines)


def _s(value: object) -> str:
    return "unbounded" if value is None else f"{value}"


def _cell(component: str, fault: str, here: list[ExperimentSummary]) -> dict[str, object]:
    if not here:
        return {
            "component": component,
            "fault": fault,
            "experiments": "",
            "expect": None,
            "tripped": None,
            "time_to_trip_s": None,
            "verdict": "not run",
            "text": "not run",
        }
    tripped = [e for e in here if e.timeline.tripped]
    times = [e.timeline.trip_since_reference_s for e in tripped]
    known = [t for t in times if t is not None]
    worst = max(known) if known else None
    if tripped and worst is not None:
        after_start = any(e.timeline.reference != "fault" for e in tripped)
        text = f"trip +{worst:.1f} s" + (" after start" if after_start else "")
    elif tripped:
        text = "trip (no fault time)"
    else:
        text = "no trip"
    blind = [
        e for e in here if any(m.piece in ("timeline.json", "experiment folder") for m in e.missing)
    ]
    if not tripped and blind:
        text = "unknown: no timeline"
    if len(here) > 1:
        text += f" ×{len(here)}"
    verdict = combine({e.verdict for e in here})  # fail wins
    expects = sorted({e.expect for e in here if e.expect})
    return {
        "component": component,
        "fault": fault,
        "experiments": ", ".join(e.name for e in here),
        "expect": "/".join(expects),
        "tripped": bool(tripped),
        "time_to_trip_s": worst,
        "verdict": verdict,
        "text": text,
    }


def render_matrix(matrix: pd.DataFrame, path: Path) -> None:
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    rows = list(dict.fromkeys(matrix["component"]))
    cols = list(dict.fromkeys(matrix["fault"]))
    codes = {"pass": 0, "fail": 1, "not run": 2, "inconclusive": 3, "not_applicable": 4}
    grid = np.full((len(rows), len(cols)), 2)
    text = [["" for _ in cols] for _ in rows]
    for cell in matrix.itertuples():  # a few cells, not records
        i, j = rows.index(cell.component), cols.index(cell.fault)
        grid[i, j] = codes[str(cell.verdict)]
        expect = f"\nexpects {cell.expect}" if isinstance(cell.expect, str) and cell.expect else ""
        verdict = "" if cell.verdict == "not run" else f"\n{str(cell.verdict).upper()}"
        floor = getattr(cell, "noise_floor", None)
        shown = f"\n{floor}" if isinstance(floor, str) and floor else ""
        text[i][j] = f"{cell.text}{verdict}{expect}{shown}"
    floors = matrix["noise_floor"] if "noise_floor" in matrix.columns else pd.Series()
    row_h = 1.3 if floors.notna().any() else 1.0  # one more line per cell
    fig = Figure(figsize=(2.3 * len(cols) + 1.5, row_h * len(rows) + 1.2), layout="constrained")
    ax = fig.subplots()
    cmap = ListedColormap(
        [
            COLOURS["pass"],
            COLOURS["fail"],
            COLOURS["not run"],
            COLOURS["inconclusive"],
            COLOURS["not_applicable"],
        ]
    )
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            colour = "white" if grid[i, j] in (0, 1, 3) else "#57606a"
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=9, color=colour)
    ax.set_xticks(range(len(cols)), [c if c != "none" else "none (control)" for c in cols])
    ax.set_yticks(range(len(rows)), rows)
    ax.xaxis.tick_top()
    ax.set_xticks(np.arange(len(cols) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(rows) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=3)
    ax.tick_params(which="both", length=0)
    fig.suptitle("Game day: time from the fault to the trip, per component and fault", fontsize=11)
    fig.savefig(path, dpi=80, format="png", pil_kwargs={"compress_level": 1})
