"""The timeline figure: one bar per milestone, from the fault to when it happened.

Drawing only (matplotlib's Agg canvas, no pyplot): it must never compute a number of its
own; they come from ``gameday.report.timeline``.
"""

from __future__ import annotations

from pathlib import Path

from gameday.report.timeline import Timeline

OK_COLOUR, BAD_COLOUR, NEUTRAL_COLOUR = "#2da44e", "#cf222e", "#8c959f"


def render_timeline(timeline: Timeline, path: Path, title: str) -> None:
    """Each bar's length is the milestone's time since the fault; green within its SLO,
    red over it, grey without one; the SLO is a black tick on the bar's row. A milestone
    that never happened is written out ("not recorded") instead of drawn; other
    fault-ledger events (pod kills, clears) are thin vertical lines."""
    from matplotlib.figure import Figure

    milestones = timeline.milestones
    fig = Figure(figsize=(10, 0.45 * len(milestones) + 1.6))
    fig.subplots_adjust(left=0.27, right=0.97, top=0.86, bottom=0.2)
    ax = fig.subplots()
    ref = timeline.reference_time
    labels = []
    extent = [0.0]
    for row, m in enumerate(milestones):
        since = None if m.time is None or ref is None else m.time - ref
        labels.append(m.label)
        if since is None:
            why = "not recorded" if m.name != "fault_injected" else "no fault"
            ax.text(0, row, f"  {why}: {m.source}", va="center", fontsize=8, color="#57606a")
            continue
        colour = NEUTRAL_COLOUR if m.ok is None else OK_COLOUR if m.ok else BAD_COLOUR
        ax.barh(row, since, left=0, height=0.55, color=colour)
        # Right of both the bar and the SLO tick, so neither hides the number.
        label_x = max(since, 0.0, m.allowed_s or 0.0)
        ax.text(label_x, row, f"  {since:+.2f} s", va="center", fontsize=8)
        extent.append(since)
        if m.allowed_s is not None:
            ax.plot([m.allowed_s, m.allowed_s], [row - 0.38, row + 0.38], color="black", lw=2)
            extent.append(m.allowed_s)
    if ref is not None:
        for marker in timeline.markers:
            if marker.kind in ("kill", "clear"):
                x = marker.time - ref
                ax.axvline(x, color="#bf8700", lw=0.8, ls=":")
                # Name the line inside the plot, along its bottom edge.
                ax.text(x, 0.02, "pod kill " if marker.kind == "kill" else "faults cleared ",
                        transform=ax.get_xaxis_transform(), color="#bf8700", fontsize=7,
                        va="bottom", ha="right", rotation=90,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
    ax.set_yticks(range(len(milestones)), labels)
    ax.invert_yaxis()
    lo, hi = min(extent), max(extent)
    ax.set_xlim(min(lo, 0) - 0.05 * (hi - lo + 1), hi + 0.25 * (hi - lo + 1))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"seconds since the {timeline.reference} (black ticks: SLO)")
    ax.set_title(title, fontsize=11, loc="left")
    fig.savefig(path, dpi=72, format="png", pil_kwargs={"compress_level": 1})
