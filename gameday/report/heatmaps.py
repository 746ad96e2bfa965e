"""Heatmaps: x = time since the fault (bins of a few seconds), y = prompt-length bucket.

Vectorised (numpy + pandas groupby, no loop over records); drawn on matplotlib's Agg
canvas (no display, no pyplot state). Must never read files or decide the verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gameday.load import buckets as load_buckets
from gameday.report.loader import UNKNOWN_BUCKET
from gameday.report.timeline import Marker

BIN_CHOICES_S = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
TARGET_BINS = 60
CELL_COLUMNS = ("panel", "variant", "bucket", "t_bin_s", "samples", "value")
PANELS = (
    ("ttft_p99_s", "baseline", "TTFT p99 (s), baseline"),
    ("ttft_p99_s", "canary", "TTFT p99 (s), canary"),
    ("error_rate", "baseline", "error rate, baseline"),
    ("error_rate", "canary", "error rate, canary"),
    ("canary_share", "all", "share of traffic served by the canary"),
    ("drift_kl", "oracle", "drift: oracle KL (nats, mean)"),
)
# The harness's default buckets, short to long: the tie-break when two start alike.
KNOWN_BUCKET_ORDER = tuple(load_buckets.bucket_labels())


@dataclass
class HeatmapData:
    experiment: str
    reference_time: float | None
    reference: str
    bin_s: float
    buckets: list[str]
    cells: pd.DataFrame
    markers: list[Marker]

    def grid(self, panel: str, variant: str) -> pd.DataFrame:
        """One panel as bucket x t_bin_s (NaN where a cell has no data)."""
        sel = self.cells[(self.cells["panel"] == panel) & (self.cells["variant"] == variant)]
        bins = self.bin_edges()[:-1]
        table = sel.pivot_table(
            index="bucket", columns="t_bin_s", values="value", aggfunc="first", observed=True
        )
        return table.reindex(index=self.buckets, columns=bins)

    def bin_edges(self) -> np.ndarray:
        if self.cells.empty:
            return np.array([0.0, self.bin_s])
        lo = float(self.cells["t_bin_s"].min())
        hi = float(self.cells["t_bin_s"].max())
        n = round((hi - lo) / self.bin_s) + 1
        return lo + self.bin_s * np.arange(n + 1)


def choose_bin_s(span_s: float) -> float:
    """The smallest round bin width giving at most ``TARGET_BINS`` bins over the span."""
    for choice in BIN_CHOICES_S:
        if span_s / choice <= TARGET_BINS:
            return choice
    return float(math.ceil(span_s / TARGET_BINS))


def bucket_labels(bucket: pd.Series) -> pd.Series:
    """Bucket labels as a categorical, a missing label as ``unknown`` (no per-row work)."""
    cat = bucket if isinstance(bucket.dtype, pd.CategoricalDtype) else bucket.astype("category")
    if UNKNOWN_BUCKET not in cat.cat.categories:
        cat = cat.cat.add_categories([UNKNOWN_BUCKET])
    return cat.fillna(UNKNOWN_BUCKET)


def bucket_order(records: pd.DataFrame, oracle: pd.DataFrame) -> list[str]:
    """Buckets from short to long prompts (by the shortest prompt seen in each)."""
    lowest: dict[str, float] = {}
    for frame in (records, oracle):
        if not len(frame):
            continue
        mins = frame["prompt_tokens"].groupby(bucket_labels(frame["bucket"]), observed=True).min()
        for label, tokens in mins.items():
            value = float(tokens) if pd.notna(tokens) else math.inf
            lowest[str(label)] = min(lowest.get(str(label), math.inf), value)
    known = {label: i for i, label in enumerate(KNOWN_BUCKET_ORDER)}

    def key(label: str) -> tuple[bool, float, int, str]:
        return (label == UNKNOWN_BUCKET, lowest[label], known.get(label, len(known)), label)

    return sorted(lowest, key=key)


def _bucket_codes(frame: pd.DataFrame, buckets: list[str]) -> pd.Categorical:
    labels = bucket_labels(frame["bucket"])
    labels = labels.cat.rename_categories([str(c) for c in labels.cat.categories])
    return pd.Categorical(labels.cat.set_categories(buckets))


def _variant(served_by: pd.Series) -> pd.Categorical:
    s = served_by.astype("category")
    values = np.full(len(s), "unknown", dtype=object)
    values[(s == "baseline").to_numpy()] = "baseline"
    values[(s == "canary").to_numpy()] = "canary"
    return pd.Categorical(values, categories=["baseline", "canary", "unknown"])


def heatmap_cells(
    records: pd.DataFrame,
    oracle: pd.DataFrame,
    reference_time: float | None,
    bin_s: float | None = None,
    experiment: str = "",
    reference: str = "fault",
    markers: list[Marker] | None = None,
) -> HeatmapData:
    """Bin records and oracle pairs into the panels' cells: one long DataFrame, the
    numbers behind every cell, which tests check and the report writes next to the PNG:

        panel         variant                  value
        ttft_p99_s    baseline | canary        p99 of ttft_s of successful requests
        error_rate    baseline | canary | unknown   failed / all requests (``ok`` false)
        canary_share  all                      canary-served / requests of a known variant
        drift_kl      oracle                   mean oracle kl_mean of pairs without error

    with the columns ``panel, variant, bucket, t_bin_s`` (the bin's left edge in seconds
    since the reference time), ``samples`` (what the value is computed from) and
    ``value``. Percentiles use numpy's default (linear interpolation). A request belongs
    to the bin of its ``start_time``, an oracle pair to the bin of its ``time``. "unknown"
    is a request whose variant the router never said (``served_by`` empty: it failed
    before headers).
    """
    if reference_time is None:
        starts = [
            float(f.min()) for f in (records["start_time"], oracle["time"]) if len(f.dropna())
        ]
        reference_time = min(starts) if starts else None
        reference = "first record" if starts else "none"
    buckets = bucket_order(records, oracle)
    if reference_time is None:
        return HeatmapData(
            experiment,
            None,
            reference,
            bin_s or BIN_CHOICES_S[1],
            buckets,
            pd.DataFrame(columns=list(CELL_COLUMNS)),
            markers or [],
        )
    rec_t = records["start_time"].to_numpy(dtype=float) - reference_time
    ora_t = oracle["time"].to_numpy(dtype=float) - reference_time
    if bin_s is None:
        spans = [a for a in (rec_t, ora_t) if np.isfinite(a).any()]
        span = max((float(np.nanmax(a) - np.nanmin(a)) for a in spans), default=0.0)
        bin_s = choose_bin_s(span)
    frames = [
        _request_cells(records, rec_t, bin_s, buckets),
        _drift_cells(oracle, ora_t, bin_s, buckets),
    ]
    cells = (
        pd.concat([f for f in frames if len(f)], ignore_index=True)
        if any(len(f) for f in frames)
        else pd.DataFrame(columns=list(CELL_COLUMNS))
    )
    if len(cells):
        cells["bucket"] = cells["bucket"].astype(str)
        cells["variant"] = cells["variant"].astype(str)
        cells = cells.sort_values(
            ["panel", "variant", "bucket", "t_bin_s"], kind="stable", ignore_index=True
        )
    return HeatmapData(
        experiment,
        reference_time,
        reference,
        float(bin_s),
        buckets,
        cells[list(CELL_COLUMNS)] if len(cells) else cells,
        markers or [],
    )


def _bins(t: np.ndarray, bin_s: float) -> np.ndarray:
    # Left edges; the small epsilon keeps a time exactly on an edge in the bin it opens
    # despite float error in start_time - reference_time.
    return np.floor(t / bin_s + 1e-9) * bin_s


def _request_cells(
    records: pd.DataFrame, t: np.ndarray, bin_s: float, buckets: list[str]
) -> pd.DataFrame:
    keep = np.isfinite(t)
    if not keep.any():
        return pd.DataFrame(columns=list(CELL_COLUMNS))
    rec = records.loc[keep]
    ok = rec["ok"].to_numpy(dtype=bool)
    frame = pd.DataFrame(
        {
            "variant": _variant(rec["served_by"]),
            "bucket": _bucket_codes(rec, buckets),
            "t_bin_s": _bins(t[keep], bin_s),
            "ttft_s": np.where(ok, rec["ttft_s"].to_numpy(dtype=float), np.nan),
            "failed": ~ok,
            "canary": (rec["served_by"] == "canary").to_numpy(),
            "known": rec["served_by"].isin(["baseline", "canary"]).to_numpy(),
        }
    )
    by = frame.groupby(["variant", "bucket", "t_bin_s"], observed=True, sort=True)
    ttft = by["ttft_s"].agg(["count"]).join(by["ttft_s"].quantile(0.99).rename("value"))
    ttft = ttft[ttft["count"] > 0].rename(columns={"count": "samples"}).reset_index()
    ttft = ttft[ttft["variant"] != "unknown"]
    ttft.insert(0, "panel", "ttft_p99_s")
    err = by["failed"].agg(samples="size", value="mean").reset_index()
    err.insert(0, "panel", "error_rate")
    share = _mean_cells(frame[frame["known"]], "canary", "canary_share", "all")
    return pd.concat([ttft[list(CELL_COLUMNS)], err[list(CELL_COLUMNS)], share], ignore_index=True)


def _mean_cells(frame: pd.DataFrame, column: str, panel: str, variant: str) -> pd.DataFrame:
    """One panel's cells: the mean of ``column`` per bucket and time bin, every variant
    pooled under ``variant``."""
    cells = (
        frame.groupby(["bucket", "t_bin_s"], observed=True, sort=True)[column]
        .agg(samples="size", value="mean")
        .reset_index()
    )
    cells.insert(0, "panel", panel)
    cells.insert(1, "variant", variant)
    return cells[list(CELL_COLUMNS)]


def _drift_cells(
    oracle: pd.DataFrame, t: np.ndarray, bin_s: float, buckets: list[str]
) -> pd.DataFrame:
    if not len(oracle):
        return pd.DataFrame(columns=list(CELL_COLUMNS))
    error = oracle["error"]
    keep = (
        np.isfinite(t)
        & (error.isna() | (error == "")).to_numpy()
        & np.isfinite(oracle["kl_mean"].to_numpy(dtype=float))
    )
    if not keep.any():
        return pd.DataFrame(columns=list(CELL_COLUMNS))
    ora = oracle.loc[keep]
    frame = pd.DataFrame(
        {
            "bucket": _bucket_codes(ora, buckets),
            "t_bin_s": _bins(t[keep], bin_s),
            "kl": ora["kl_mean"].to_numpy(dtype=float),
        }
    )
    return _mean_cells(frame, "kl", "drift_kl", "oracle")


# ---------------------------------------------------------------------------------------
# Drawing

MARKER_COLOURS = {
    "fault injected": "#d1242f",
    "first drifted sample": "#bf8700",
    "gate trip": "#8250df",
    "weights applied at every router": "#0969da",
    "last canary-served request": "#1a7f37",
    "rollback complete": "#57606a",
}


def render_heatmaps(data: HeatmapData, path: Path, title: str) -> None:
    from matplotlib.figure import Figure  # lazy: matplotlib is slow to import

    n_buckets = max(len(data.buckets), 1)
    # Fixed margins instead of constrained layout: the layout solver was most of the time.
    fig = Figure(figsize=(13, 1.6 + 3 * (0.35 * n_buckets + 0.9)))
    fig.subplots_adjust(left=0.07, right=0.95, top=0.9, bottom=0.16, hspace=0.45, wspace=0.16)
    axes = fig.subplots(3, 2, sharex=True, sharey=True)
    edges = data.bin_edges()
    scales = _scales(data)
    for ax, (panel, variant, label) in zip(axes.flat, PANELS, strict=True):
        grid = data.grid(panel, variant) if len(data.cells) else pd.DataFrame(index=data.buckets)
        values = (
            grid.to_numpy(dtype=float)
            if grid.size
            else np.full((n_buckets, len(edges) - 1), np.nan)
        )
        vmin, vmax, cmap_name = scales[panel]
        cmap = _cmap(cmap_name)
        image = ax.imshow(
            np.ma.masked_invalid(values),
            cmap=cmap,
            vmin=vmin,
            vmax=vmax,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
            extent=(float(edges[0]), float(edges[-1]), 0.0, float(n_buckets)),
        )
        fig.colorbar(image, ax=ax, pad=0.01, fraction=0.04)
        ax.set_title(label, fontsize=10, loc="left")
        ax.set_yticks(np.arange(n_buckets) + 0.5, data.buckets or [""], fontsize=8)
        for marker in data.markers:
            if data.reference_time is None or marker.kind != "milestone":
                continue
            ax.axvline(
                marker.time - data.reference_time,
                color=MARKER_COLOURS.get(marker.label, "k"),
                lw=1.4,
                ls="--",
            )
    for ax in axes[-1]:
        ax.set_xlabel(f"seconds since the {data.reference} (bins of {data.bin_s:g} s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("prompt tokens")
    handles = _marker_handles(data)
    if handles:
        fig.legend(
            handles=handles,
            loc="lower center",
            ncols=min(len(handles), 6),
            fontsize=8,
            frameon=False,
        )
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, dpi=72, format="png", pil_kwargs={"compress_level": 1})


def _cmap(name: str) -> object:
    from matplotlib import colormaps

    # Cells without data: a grey darker than any colormap's zero.
    return colormaps[name].with_extremes(bad="#c8ced6")


def _scales(data: HeatmapData) -> dict[str, tuple[float, float, str]]:
    def top(panel: str, floor: float) -> float:
        sel = (
            data.cells.loc[data.cells["panel"] == panel, "value"]
            if len(data.cells)
            else pd.Series()
        )
        v = float(np.nanmax(sel.to_numpy(dtype=float))) if len(sel) and sel.notna().any() else floor
        return max(v, floor)

    return {
        "ttft_p99_s": (0.0, top("ttft_p99_s", 0.1), "viridis"),
        "error_rate": (0.0, top("error_rate", 0.05), "Reds"),
        "canary_share": (0.0, max(top("canary_share", 0.1), 0.1), "Purples"),
        "drift_kl": (0.0, top("drift_kl", 0.1), "magma_r"),
    }


def _marker_handles(data: HeatmapData) -> list[object]:
    from matplotlib.lines import Line2D

    seen: dict[str, object] = {}
    for marker in data.markers:
        if (
            marker.kind == "milestone"
            and marker.label not in seen
            and data.reference_time is not None
        ):
            offset = marker.time - data.reference_time
            seen[marker.label] = Line2D(
                [],
                [],
                color=MARKER_COLOURS.get(marker.label, "k"),
                ls="--",
                label=f"{marker.label} ({offset:+.1f} s)",
            )
    return list(seen.values())
