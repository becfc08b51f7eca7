"""Charts of a comparison frame (core.compare.comparison) as a PNG a person would put in a report.

One band per group (experiment × hardware), each with its own title and up to six panels: peak memory by phase,
step time, throughput, validation perplexity, max batch, memory saved against the baseline. A panel no run of the
group measured (max batch on CPU) is left out. Bands stack in one column for one or two groups, in a grid of two
columns beyond, so the image stays readable. A profile keeps one colour in every band and panel. Runs that did
not finish keep their place on the x axis, labelled with their status, with no bars. Value labels are drawn flat
when they fit, turned upright when not, and left out when even that would overlap.

matplotlib is imported lazily, and only its object-oriented API with the Agg canvas: no pyplot, no global backend
switch, so it works headless, over SSH and from a TUI worker thread alike.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import polars as pl

from memlab.core.compare import groups
from memlab.core.units import GIB

BAND_W_IN = 15.0  # inches per band
BAND_H_IN = 7.5
DPI = 100
MAX_BAND_COLUMNS = 2

# 32 colours told apart at a glance (Kelly's, then tab10's darker cousins): enough for every built-in profile
# without a cycle that repeats within one plot.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#f3c300", "#875692", "#f38400", "#a1caf1", "#be0032", "#c2b280", "#848482", "#008856", "#e68fac", "#0067a5",
    "#f99379", "#604e97", "#f6a600", "#b3446c", "#dcd300", "#882d17", "#8db600", "#654522", "#e25822", "#2b3d26",
    "#393b79", "#637939",
)
LABEL_CHAR_IN = 0.055  # width of one value-label character at font size 7
LABEL_LINE_IN = 0.13  # room one upright label needs across the axis


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    column: str
    fmt: str = "{:.2f}"
    scale: float = 1.0
    whisker: str | None = None


PANELS = (
    Panel("Step time (median, whisker p90)", "ms", "step_ms_median", "{:.0f}", whisker="step_ms_p90"),
    Panel("Throughput", "tokens / s", "tokens_per_s", "{:,.0f}"),
    Panel("Validation perplexity", "perplexity (lower is better)", "val_ppl"),
    Panel("Max batch", "sequences per micro-batch", "max_batch", "{:.0f}"),
    Panel("Memory saved vs baseline", "% of baseline peak", "mem_saved_pct", "{:+.1f}%"),
)
HOST_MEMORY = Panel("Peak host memory (RSS)", "GiB", "peak_host_rss_bytes", scale=1 / GIB)
PHASES = (("forward", "peak_alloc_fwd_bytes"), ("backward", "peak_alloc_bwd_bytes"), ("optimizer", "peak_alloc_opt_bytes"), ("reserved", "peak_reserved_bytes"))


def band_grid(n_groups: int) -> tuple[int, int]:
    """(rows, columns) of bands for `n_groups` groups."""
    cols = 1 if n_groups <= 2 else MAX_BAND_COLUMNS
    return max(1, math.ceil(n_groups / cols)), cols


def figure_size_px(n_groups: int, dpi: int = DPI) -> tuple[int, int]:
    """(width, height) in pixels of the PNG `plot_comparison` writes for `n_groups` groups."""
    rows, cols = band_grid(n_groups)
    return round(BAND_W_IN * dpi * cols), round(BAND_H_IN * dpi * rows)


def profile_colors(table: pl.DataFrame, name_of: Callable[[str], str] = str) -> dict[str, str]:
    """One colour per profile name (`name_of` the run's profile) for the whole plot: the same colour in every band
    and panel."""
    names = sorted({name_of(str(p)) for p in table["profile"].to_list()}) if table.height else []
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def plot_comparison(table: pl.DataFrame, out: str | os.PathLike, dpi: int = DPI) -> Path:
    """Draw `table` (a comparison frame) to the PNG `out`, atomically; returns its path. Size: figure_size_px."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    bands = list(groups(table)) if table.height else []
    w, h = figure_size_px(len(bands), dpi)
    fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    if not bands:
        fig.text(0.5, 0.5, "no runs to plot", ha="center", va="center", fontsize=16, color="0.4")
    else:
        rows, cols = band_grid(len(bands))
        subfigs = fig.subfigures(rows, cols, squeeze=False).flat
        colors = profile_colors(table)
        for sub, (label, g) in zip(subfigs, bands):
            _draw_band(sub, label, g, colors)
    return _save(fig, out, dpi)


def _save(fig, out: Path, dpi: int) -> Path:
    """Write the figure to `out` atomically (temp file + rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


# ---------------------------------------------------------------------------------------------- frontier


@dataclass(frozen=True)
class FrontierPoint:
    label: str  # the run's profile name, e.g. compile_budget@budget=0.5 (sweep --vary)
    profile: str  # the profile it varies: one colour each
    step_ms: float
    peak_bytes: float


def base_profile(name: str) -> str:
    """`compile_budget@budget=0.5` (a sweep --vary run) -> `compile_budget`."""
    return name.split("@", 1)[0]


def frontier_points(rows: list[dict]) -> tuple[list[FrontierPoint], str]:
    """Finished runs as (step time, peak memory) points, and which peak: the allocator's on a GPU, the process's
    RSS where no run has one (CPU)."""
    column = "peak_alloc_bytes" if _has(rows, "peak_alloc_bytes") else "peak_host_rss_bytes"
    points = [FrontierPoint(str(r["profile"]), base_profile(str(r["profile"])), float(r["step_ms_median"]), float(r[column]))
              for r in rows if r.get("status") == "finished" and r.get("step_ms_median") is not None and r.get(column) is not None]
    return points, column


def plot_frontier(table: pl.DataFrame, out: str | os.PathLike, dpi: int = DPI) -> Path:
    """Peak memory against step time, one panel per group, one point per run, labelled, one colour per profile
    (the budgets of a `sweep --vary` share their profile's colour): the memory-for-time frontier."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bands = list(groups(table)) if table.height else []
    fig = Figure(figsize=(8.0 * max(1, len(bands)), 6.0), dpi=dpi)
    FigureCanvasAgg(fig)
    if not bands:
        fig.text(0.5, 0.5, "no runs to plot", ha="center", va="center", fontsize=16, color="0.4")
    colors = profile_colors(table, base_profile)
    for i, (label, g) in enumerate(bands):
        _draw_frontier(fig.add_subplot(1, len(bands), i + 1), label, g.to_dicts(), colors)
    fig.tight_layout()
    return _save(fig, Path(out), dpi)


def _draw_frontier(ax, title: str, rows: list[dict], colors: dict[str, str]) -> None:
    points, column = frontier_points(rows)
    for p in points:
        ax.scatter(p.step_ms, p.peak_bytes / GIB, color=colors[p.profile], s=36, zorder=3)
        short = p.label.split("@", 1)[1] if "@" in p.label else p.label
        ax.annotate(short, (p.step_ms, p.peak_bytes / GIB), textcoords="offset points", xytext=(5, 4), fontsize=7)
    for name in sorted({p.profile for p in points}):
        ax.scatter([], [], color=colors[name], label=name)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step time, median (ms)")
    ax.set_ylabel(("peak allocated" if column == "peak_alloc_bytes" else "peak host RSS") + " (GiB)")
    ax.grid(True, alpha=0.3)
    if points:
        ax.legend(fontsize=7, loc="best")


def _has(rows: list[dict], column: str) -> bool:
    return any(r.get(column) is not None for r in rows)


def band_panels(rows: list[dict]) -> list[Panel | str]:
    """The panels of one band that have figures: "phases" for device memory by phase, else Panel objects."""
    panels: list[Panel | str] = []
    if any(_has(rows, c) for _, c in PHASES):
        panels.append("phases")
    elif _has(rows, HOST_MEMORY.column):
        panels.append(HOST_MEMORY)
    panels += [p for p in PANELS if _has(rows, p.column)]
    return panels


def _draw_band(sub, label: str, g: pl.DataFrame, colors: dict[str, str]) -> None:
    rows = g.to_dicts()
    baseline = rows[0].get("baseline")
    many = len(rows) != len({r["profile"] for r in rows})  # --all: a profile may appear more than once
    names = [_xlabel(r, many) for r in rows]
    bar_colors = [colors.get(str(r["profile"]), PALETTE[0]) for r in rows]
    title = f"{label}  ·  baseline: {baseline}" if baseline else f"{label}  ·  no baseline"
    sub.suptitle(title, fontsize=13, fontweight="bold")
    panels = band_panels(rows)
    if not panels:
        sub.text(0.5, 0.5, "no figures measured on these runs", ha="center", va="center", fontsize=12, color="0.4")
        return
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    sub.subplots_adjust(left=0.05, right=0.99, top=0.88, bottom=0.17, wspace=0.25, hspace=0.7)
    axes = list(sub.subplots(nrows, ncols, squeeze=False).flat)
    panel_w_in = BAND_W_IN * 0.94 / ncols * 0.8
    for ax, panel in zip(axes, panels):
        if panel == "phases":
            _grouped(ax, rows, names, [(n, c) for n, c in PHASES if _has(rows, c)], 1 / GIB, panel_w_in)
            ax.set_title("Peak memory by phase")
            ax.set_ylabel("GiB")
        else:
            _bars(ax, rows, names, panel, bar_colors, panel_w_in)
            title = panel.title.replace("baseline", baseline) if panel.column == "mem_saved_pct" and baseline else panel.title
            ax.set_title(title)
            ax.set_ylabel(panel.ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        for tick, r in zip(ax.get_xticklabels(), rows):
            if r.get("is_baseline"):
                tick.set_fontweight("bold")
    for ax in axes[len(panels):]:
        ax.remove()  # the grid's spare slots


def _xlabel(r: dict, with_run: bool) -> str:
    name = r["profile"] or "?"
    if with_run and r.get("run_id"):
        name += "\n" + str(r["run_id"])[:15]
    if r.get("status") != "finished":
        name += f"\n({r.get('status')})"
    return name


def _ticks(ax, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    rotate = len(names) > 4 or max((len(n.split("\n")[0]) for n in names), default=0) > 12
    if len(names) > 12:  # upright, or the names run into each other
        ax.set_xticklabels(names, rotation=90, ha="center", fontsize=7)
    else:
        ax.set_xticklabels(names, rotation=30 if rotate else 0, ha="right" if rotate else "center", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)


def label_rotation(texts: list[str], width_in: float) -> int | None:
    """0 when the labels fit side by side over `width_in` inches, 90 when they fit upright, None when neither."""
    if not texts:
        return None
    slot = width_in / len(texts)
    if max(len(t) for t in texts) * LABEL_CHAR_IN <= slot * 0.9:
        return 0
    return 90 if slot >= LABEL_LINE_IN else None


def _label(ax, bars, texts: list[str], width_in: float, fontsize: int = 7) -> None:
    """Value labels that never overlap: flat, upright, or none; clipped to the axes so none lands on a title."""
    rotation = label_rotation(texts, width_in)
    if rotation is None:
        return
    for a in ax.bar_label(bars, labels=texts, fontsize=fontsize, padding=2, rotation=rotation):
        a.set_clip_on(True)


def _bars(ax, rows, names, panel: Panel, colors, width_in: float) -> None:
    _ticks(ax, names)
    values = [None if r.get(panel.column) is None else r[panel.column] * panel.scale for r in rows]
    xs = [i for i, v in enumerate(values) if v is not None]
    ys = [values[i] for i in xs]
    yerr = None
    if panel.whisker and any(rows[i].get(panel.whisker) is not None for i in xs):
        up = [max(0.0, (rows[i].get(panel.whisker) or values[i]) * panel.scale - values[i]) for i in xs]
        yerr = [[0.0] * len(xs), up]
    bars = ax.bar(xs, ys, color=[colors[i] for i in xs], edgecolor=["black" if rows[i].get("is_baseline") else "none" for i in xs],
                  linewidth=1.2, yerr=yerr, capsize=3 if yerr else 0, ecolor="0.3")
    texts = [panel.fmt.format(v) for v in ys]
    if panel.column == "mem_saved_pct":
        ax.axhline(0, color="0.3", linewidth=0.8)
        texts = ["" if rows[i].get("is_baseline") else t for i, t in zip(xs, texts)]  # the baseline saves 0% by definition
    _label(ax, bars, texts, width_in)
    ax.margins(y=0.25)


def _grouped(ax, rows, names, series, scale: float, width_in: float) -> None:
    _ticks(ax, names)
    n = len(series)
    width = 0.8 / n
    palette = ["#4c72b0", "#dd8452", "#55a868", "#bbbbbb"]
    for k, (label, column) in enumerate(series):
        xs = [i for i, r in enumerate(rows) if r.get(column) is not None]
        ys = [rows[i][column] * scale for i in xs]
        bars = ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], ys, width=width, label=label, color=palette[k % len(palette)])
        _label(ax, bars, [f"{v:.2f}" for v in ys], width_in * len(xs) / (len(rows) * n), fontsize=6)
    ax.legend(fontsize=7, loc="upper right", ncols=n, frameon=False)
    ax.margins(y=0.3)
