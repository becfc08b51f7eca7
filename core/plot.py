"""Charts of a comparison frame (core.compare.comparison) as a PNG a person would put in a report.

One band per group (experiment × hardware), stacked in one figure, each with its own title, six panels:
peak memory by phase, step time, throughput, validation perplexity, max batch, memory saved against the baseline.
Runs that did not finish keep their place on the x axis, labelled with their status, with no bars.

matplotlib is imported lazily, and only its object-oriented API with the Agg canvas: no pyplot, no global backend
switch, so it works headless, over SSH and from a TUI worker thread alike.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from memlab.core.compare import groups
from memlab.core.units import GIB

BAND_W_IN = 15.0  # inches per band
BAND_H_IN = 7.5
DPI = 100


def figure_size_px(n_groups: int, dpi: int = DPI) -> tuple[int, int]:
    """(width, height) in pixels of the PNG `plot_comparison` writes for `n_groups` groups."""
    return round(BAND_W_IN * dpi), round(BAND_H_IN * dpi * max(n_groups, 1))


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
        subfigs = fig.subfigures(len(bands), 1, squeeze=False)[:, 0]
        for sub, (label, g) in zip(subfigs, bands):
            _draw_band(sub, label, g)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _draw_band(sub, label: str, g: pl.DataFrame) -> None:
    rows = g.to_dicts()
    baseline = rows[0].get("baseline")
    many = len(rows) != len({r["profile"] for r in rows})  # --all: a profile may appear more than once
    names = [_xlabel(r, many) for r in rows]
    colors = _colors([r["profile"] for r in rows])
    title = f"{label}  ·  baseline: {baseline}" if baseline else f"{label}  ·  no baseline"
    sub.suptitle(title, fontsize=13, fontweight="bold")
    sub.subplots_adjust(left=0.05, right=0.99, top=0.88, bottom=0.17, wspace=0.25, hspace=0.7)
    axes = sub.subplots(2, 3)

    # 1. Peak memory by phase: device figures where measured, host RSS on CPU groups.
    ax = axes[0, 0]
    device = any(r.get("peak_alloc_bytes") is not None for r in rows)
    if device:
        series = [("forward", "peak_alloc_fwd_bytes"), ("backward", "peak_alloc_bwd_bytes"), ("optimizer", "peak_alloc_opt_bytes"), ("reserved", "peak_reserved_bytes")]
        series = [(n, c) for n, c in series if any(r.get(c) is not None for r in rows)]
        _grouped(ax, rows, names, series, scale=1 / GIB)
        ax.set_title("Peak memory by phase")
        ax.set_ylabel("GiB")
    else:
        _bars(ax, rows, names, "peak_host_rss_bytes", colors, scale=1 / GIB, fmt="{:.2f}")
        ax.set_title("Peak host memory (RSS)")
        ax.set_ylabel("GiB")

    ax = axes[0, 1]
    _bars(ax, rows, names, "step_ms_median", colors, fmt="{:.0f}", whisker="step_ms_p90")
    ax.set_title("Step time (median, whisker p90)")
    ax.set_ylabel("ms")

    ax = axes[0, 2]
    _bars(ax, rows, names, "tokens_per_s", colors, fmt="{:,.0f}")
    ax.set_title("Throughput")
    ax.set_ylabel("tokens / s")

    ax = axes[1, 0]
    _bars(ax, rows, names, "val_ppl", colors, fmt="{:.2f}")
    ax.set_title("Validation perplexity")
    ax.set_ylabel("perplexity (lower is better)")

    ax = axes[1, 1]
    _bars(ax, rows, names, "max_batch", colors, fmt="{:.0f}")
    ax.set_title("Max batch")
    ax.set_ylabel("sequences per micro-batch")

    ax = axes[1, 2]
    _bars(ax, rows, names, "mem_saved_pct", colors, fmt="{:+.1f}%")
    ax.axhline(0, color="0.3", linewidth=0.8)
    ax.set_title(f"Memory saved vs {baseline}" if baseline else "Memory saved vs baseline")
    ax.set_ylabel("% of baseline peak")

    for ax in axes.flat:
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        for tick, r in zip(ax.get_xticklabels(), rows):
            if r.get("is_baseline"):
                tick.set_fontweight("bold")


def _xlabel(r: dict, with_run: bool) -> str:
    name = r["profile"] or "?"
    if with_run and r.get("run_id"):
        name += "\n" + str(r["run_id"])[:15]
    if r.get("status") != "finished":
        name += f"\n({r.get('status')})"
    return name


def _colors(profiles: list[str]) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    order = list(dict.fromkeys(profiles))
    return [cmap(order.index(p) % 10) for p in profiles]


def _ticks(ax, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    rotate = len(names) > 4 or max((len(n.split("\n")[0]) for n in names), default=0) > 12
    ax.set_xticklabels(names, rotation=30 if rotate else 0, ha="right" if rotate else "center", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)


def _empty(ax, what: str = "not measured on these runs") -> None:
    ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center", color="0.5", fontsize=10)
    ax.set_yticks([])


def _bars(ax, rows, names, column, colors, scale: float = 1.0, fmt: str = "{:.2f}", whisker: str | None = None) -> None:
    _ticks(ax, names)
    values = [None if r.get(column) is None else r[column] * scale for r in rows]
    if all(v is None for v in values):
        _empty(ax)
        return
    xs = [i for i, v in enumerate(values) if v is not None]
    ys = [values[i] for i in xs]
    yerr = None
    if whisker and any(rows[i].get(whisker) is not None for i in xs):
        up = [max(0.0, (rows[i].get(whisker) or values[i]) * scale - values[i]) for i in xs]
        yerr = [[0.0] * len(xs), up]
    bars = ax.bar(xs, ys, color=[colors[i] for i in xs], edgecolor=["black" if rows[i].get("is_baseline") else "none" for i in xs],
                  linewidth=1.2, yerr=yerr, capsize=3 if yerr else 0, ecolor="0.3")
    ax.bar_label(bars, labels=[fmt.format(v) for v in ys], fontsize=7, padding=2)
    ax.margins(y=0.18)


def _grouped(ax, rows, names, series, scale: float) -> None:
    _ticks(ax, names)
    if not series:
        _empty(ax)
        return
    n = len(series)
    width = 0.8 / n
    palette = ["#4c72b0", "#dd8452", "#55a868", "#bbbbbb"]
    for k, (label, column) in enumerate(series):
        xs = [i for i, r in enumerate(rows) if r.get(column) is not None]
        ys = [rows[i][column] * scale for i in xs]
        bars = ax.bar([x - 0.4 + width * (k + 0.5) for x in xs], ys, width=width, label=label, color=palette[k % len(palette)])
        if len(rows) * n <= 16:
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in ys], fontsize=6, padding=1, rotation=90 if n > 2 else 0)
    ax.legend(fontsize=7, loc="upper right", ncols=n, frameon=False)
    ax.margins(y=0.25)
