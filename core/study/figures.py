"""A study's figures as PNG files (matplotlib's object API on the Agg canvas, as memlab.core.plot: headless-safe).

    memory_by_phase.png   forward / backward / optimizer peaks per profile, the estimator's prediction marked
    step_time.png         median step time at the common batch
    max_batch.png         max micro-batch: measured (solid) or predicted (hatched, CPU)
    ppl_vs_memory.png     validation perplexity against peak memory
    memory_vs_time.png    peak memory against step time, the Pareto front (nothing both smaller and faster) marked
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import polars as pl

from memlab.core.study.frame import common, finished, peak_column
from memlab.core.units import GIB

DPI = 100


def write_figures(frame: pl.DataFrame, folder: Path) -> list[tuple[str, Path]]:
    """(title, path) of each figure drawn; a figure with no data to show is left out. Raises ImportError without
    matplotlib (the report then says so and goes on)."""
    import matplotlib  # noqa: F401 (fail here, before any file, when it is missing)

    folder.mkdir(parents=True, exist_ok=True)
    rows = finished(common(frame)).to_dicts()
    col, label = peak_column(frame)
    drawn = []
    for name, title, draw, needs in (
        ("memory_by_phase", "Memory by phase", lambda ax: _phases(ax, rows, col, label), rows),
        ("step_time", "Step time at the common batch", lambda ax: _bars(ax, rows, "step_ms_median", "median step time (ms)"), rows),
        ("max_batch", "Max micro-batch", lambda ax: _max_batch(ax, common(frame).to_dicts()), common(frame).height),
        ("ppl_vs_memory", "Validation perplexity against peak memory", lambda ax: _scatter(ax, rows, col, "val_ppl", label, "val ppl", front=False), rows),
        ("memory_vs_time", "Peak memory against step time (Pareto front)", lambda ax: _scatter(ax, rows, "step_ms_median", col, "median step time (ms)", label, front=True), rows),
    ):
        if needs:
            drawn.append((title, _save(folder / f"{name}.png", title, draw)))
    return drawn


def figure(title: str, draw):
    """The figure `draw(ax)` makes, titled and laid out (what _save writes; tests read its axes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.8), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    draw(ax)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _save(path: Path, title: str, draw) -> Path:
    fig = figure(title, draw)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=DPI, format="png")
    os.replace(tmp, path)
    return path


def _names(ax, rows: list[dict]) -> list[int]:
    xs = list(range(len(rows)))
    ax.set_xticks(xs)
    ax.set_xticklabels([r["profile"] for r in rows], rotation=35, ha="right", fontsize=8)
    return xs


def _phases(ax, rows: list[dict], col: str, label: str) -> None:
    xs = _names(ax, rows)
    phases = [("peak_alloc_fwd_bytes", "forward"), ("peak_alloc_bwd_bytes", "backward"), ("peak_alloc_opt_bytes", "optimizer")]
    if col == "peak_host_rss_bytes":  # CPU: no per-phase allocator figures, the host's peak only
        phases = [(col, label)]
    width = 0.8 / len(phases)
    for i, (c, name) in enumerate(phases):
        ax.bar([x + (i - (len(phases) - 1) / 2) * width for x in xs], [(r[c] or 0) / GIB for r in rows], width, label=name)
    pred = [(x, r["estimate_peak_bytes"] / GIB) for x, r in zip(xs, rows) if r.get("estimate_peak_bytes")]
    if pred:
        ax.scatter([p[0] for p in pred], [p[1] for p in pred], marker="_", s=400, color="black", label="estimator's peak", zorder=3)
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8)


def _bars(ax, rows: list[dict], column: str, ylabel: str) -> None:
    xs = _names(ax, rows)
    values = [r[column] or 0 for r in rows]
    bars = ax.bar(xs, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=7)
    ax.set_ylabel(ylabel)


def _max_batch(ax, rows: list[dict]) -> None:
    from matplotlib.patches import Patch

    xs = _names(ax, rows)
    for x, r in zip(xs, rows):
        if r["max_batch_measured"] and r["max_batch"]:
            ax.bar(x, r["max_batch"], color="tab:green")
            ax.text(x, r["max_batch"], str(r["max_batch"]), ha="center", va="bottom", fontsize=7)
        elif r["predicted_max_batch"]:
            ax.bar(x, r["predicted_max_batch"], color="white", edgecolor="tab:gray", hatch="//")
            ax.text(x, r["predicted_max_batch"], f"~{r['predicted_max_batch']}", ha="center", va="bottom", fontsize=7)
        else:  # neither measured nor predicted: say so, rather than a gap that reads as zero
            ax.text(x, 0, "none", ha="center", va="bottom", fontsize=7, color="tab:gray")
    # the key in a legend: as the y label it was longer than the axis and was cut at both ends
    ax.legend(handles=[Patch(color="tab:green", label="measured"),
                       Patch(facecolor="white", edgecolor="tab:gray", hatch="//", label="predicted, not measured")], fontsize=8)
    ax.set_ylabel("max micro-batch")


def _scatter(ax, rows: list[dict], xcol: str, ycol: str, xlabel: str, ylabel: str, front: bool) -> None:
    scale = {c: (1 / GIB if c.endswith("_bytes") else 1.0) for c in (xcol, ycol)}
    pts = [(r[xcol] * scale[xcol], r[ycol] * scale[ycol], r["profile"]) for r in rows if r.get(xcol) is not None and r.get(ycol) is not None]
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="tab:blue")
    for x, y, name in pts:
        ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if front and pts:
        line = pareto_front([(p[0], p[1]) for p in pts])
        ax.plot([p[0] for p in line], [p[1] for p in line], color="tab:red", marker="o", fillstyle="none", drawstyle="steps-post",
                label="Pareto front (nothing both smaller and faster)")
        ax.legend(fontsize=8)
    for axis in (ax.xaxis, ax.yaxis):
        _plain_ticks(axis)
    ax.set_xlabel(xlabel + (" (GiB)" if xcol.endswith("_bytes") else ""))
    ax.set_ylabel(ylabel + (" (GiB)" if ycol.endswith("_bytes") else ""))


def _plain_ticks(axis) -> None:
    """Tick labels that read as the values themselves: matplotlib shows close values (perplexities 486.517 and 486.519)
    as an offset (`+4.8651e2`) and ticks of 0.0075; here each tick is the number, with as many decimals as tell the
    ticks apart."""
    from matplotlib.ticker import FuncFormatter

    def label(value, _pos):
        ticks = axis.get_ticklocs()
        step = min((b - a for a, b in zip(ticks, ticks[1:]) if b > a), default=1.0)
        decimals = -math.floor(math.log10(step))
        if abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:  # a step of 2.5e-4 needs 5 decimals
            decimals += 1
        decimals = max(0, min(8, decimals))
        return f"{value:,.{decimals}f}"

    axis.set_major_formatter(FuncFormatter(label))


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (smaller x and smaller y), sorted by x."""
    front, best_y = [], float("inf")
    for x, y in sorted(points):
        if y < best_y:
            front.append((x, y))
            best_y = y
    return front
