"""Presenting a comparison frame: its columns (memlab.core.metrics), cells as text, notes, and a markdown table.

Rich rendering lives with the CLI (core never imports rich) and the TUI renders with Textual; both take their
columns, cells and notes from here, so every view shows the same figures the same way.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from memlab.core import metrics
from memlab.core.compare.comparing import groups
from memlab.core.runfolder import atomic_write_parquet
from memlab.core.units import MISSING, gib_number

DisplayColumn = metrics.Metric  # a column as every view shows it: name, header, kind, help, figure
Kind = metrics.Kind
DISPLAY_COLUMNS: tuple[metrics.Metric, ...] = metrics.TABLE


def format_value(value: object, kind: Kind) -> str:
    """A cell as text: GiB with 2 decimals, MFU as percent, relative figures signed; None (null) is "—"."""
    if value is None or (isinstance(value, float) and value != value):
        return MISSING
    if kind == "text":
        return str(value)
    if kind == "int":
        return f"{int(value):,}"
    v = float(value)  # type: ignore[arg-type]
    if kind == "gib":
        return gib_number(v)
    if kind == "signed_pct":
        return f"{v + 0.0 if round(v, 1) else 0.0:+.1f}%"  # never "-0.0%"
    if kind in _NUMBER_FORMATS:
        return _NUMBER_FORMATS[kind](v)
    raise ValueError(f"unknown column kind {kind!r}")


_NUMBER_FORMATS = {
    "ms": lambda v: f"{v:,.1f}" if v < 1000 else f"{v:,.0f}",
    "rate": lambda v: f"{v:,.0f}",
    "fraction_pct": lambda v: f"{100 * v:.1f}%",
    "seconds": lambda v: f"{v:,.1f}",
    "ppl": lambda v: f"{v:,.2f}",
    "loss": lambda v: f"{v:.4f}",
    "times": lambda v: f"{v:.2f}×",
}


def visible_columns(g: pl.DataFrame) -> tuple[list[metrics.Metric], list[metrics.Metric]]:
    """(shown, hidden): DISPLAY_COLUMNS minus measured figures that are null on every row of `g` (e.g. NVML and MFU
    on CPU), and minus a twin column (wall tokens/s, MFU at the bf16 peak) within 3 % of its sibling on every row."""
    shown, hidden = [], []
    for c in DISPLAY_COLUMNS:
        if c.twin:
            if _differs(g, c.name, c.twin):  # else it says nothing its sibling does not: left out, without a note
                shown.append(c)
            continue
        (hidden if c.figure and g[c.name].null_count() == g.height else shown).append(c)
    return shown, hidden


def _differs(g: pl.DataFrame, name: str, twin: str) -> bool:
    """Some row where `name` and `twin` both have a figure and they differ by more than metrics.TWIN_TOLERANCE."""
    a, b = pl.col(name).cast(pl.Float64), pl.col(twin).cast(pl.Float64)
    off = g.select(((a / b - 1).abs().fill_nan(None) > metrics.TWIN_TOLERANCE).fill_null(False).any()).item()
    return bool(off)


def host_memory_only(g: pl.DataFrame) -> bool:
    """A group with no device memory figures but host RSS (the CPU backend)."""
    return g["peak_alloc_bytes"].null_count() == g.height and g["peak_host_rss_bytes"].null_count() < g.height


def group_notes(g: pl.DataFrame, hidden: list[metrics.Metric]) -> list[str]:
    """The lines under one group's table: baseline, what was not measured, why runs did not finish."""
    notes = []
    if g["baseline"][0] is None:
        notes.append("no baseline in this experiment: relative columns blank")
    if not (g["status"] == "finished").any():
        notes.append("no finished runs in this experiment")
    elif hidden:
        notes.append("not measured on these runs: " + ", ".join(c.header for c in hidden))
    mixed = mixed_setups(g)
    if mixed:
        notes.append(f"runs here differ in {mixed}: their figures may not compare")
    if host_memory_only(g):
        notes.append("memory here is the host process's peak RSS (no device memory on CPU); mem saved compares it")
    if "later_run" in g.columns:
        for r in g.filter(g["later_run"].is_not_null()).select("profile", "later_run").iter_rows(named=True):
            notes.append(f"{r['profile']}: its latest finished run is shown; a later run was {r['later_run']} (--all shows every run)")
    for r in g.filter(g["status"] != "finished").select("profile", "status", "reason", "steps").iter_rows(named=True):
        if r["status"] == "interrupted":
            steps = f"{r['steps']:,} steps" if r["steps"] is not None else "the steps"
            notes.append(f"{r['profile']} (interrupted): its figures are from an interrupted run, over {steps} it completed")
        elif r["reason"]:
            notes.append(f"{r['profile']} ({r['status']}): {r['reason'][:160]}")
    return notes


MIXED_IDENTITY = (("n_gpus", "GPUs"), ("torch_version", "torch"), ("memlab_version", "memlab"), ("memlab_commit", "memlab commit"))


def mixed_setups(g: pl.DataFrame) -> str:
    """What differs between a group's runs that the group does not split on (GPU count, torch, memlab, its commit), e.g.
    "GPUs (1, 2); torch (2.5.1, 2.6.0)"; empty when they all agree."""
    parts = []
    for column, word in MIXED_IDENTITY:
        if column in g.columns:
            values = sorted({str(v) for v in g[column].drop_nulls().to_list()})
            if len(values) > 1:
                parts.append(f"{word} ({', '.join(values)})")
    return "; ".join(parts)


def render_markdown(result: pl.DataFrame) -> str:
    """The comparison as markdown: one table per group, its notes as a list."""
    out = []
    n_groups = result["group_index"].n_unique()
    if n_groups > 1:
        out.append(f"_{n_groups} experiments: runs of different experiments or hardware are never compared; one table each._\n")
    for label, g in groups(result):
        out.extend(_markdown_group(label, g))
    return "\n".join(out) + "\n"


def _markdown_group(label: str, g: pl.DataFrame) -> list[str]:
    shown, hidden = visible_columns(g)
    base = g["baseline"][0]
    out = [f"### {_md(label)}\n"]
    runs = f"{g.height} run{'s' if g.height != 1 else ''}"
    out.append(f"Baseline: `{base}` · {runs}\n" if base else f"{runs}\n")
    out.append("| " + " | ".join(_md(c.header) for c in shown) + " |")
    out.append("|" + "|".join(":---" if c.kind == "text" else "---:" for c in shown) + "|")
    for r in g.iter_rows(named=True):
        cells = [_md(format_value(r[c.name], c.kind)) for c in shown]
        if r["is_baseline"]:
            cells[0] = f"**{cells[0]}**"
        out.append("| " + " | ".join(cells) + " |")
    notes = group_notes(g, hidden)
    if notes:
        out.append("")
        out.extend(f"- {_md(n)}" for n in notes)
    out.append("")
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def machine_frame(result: pl.DataFrame) -> pl.DataFrame:
    """The frame for csv / json / parquet: every column, raw units (bytes, ms, fractions) as the names say."""
    return result.drop("group_index")


def write_parquet(table: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write the comparison frame atomically (temp file + rename); a folder gets comparison.parquet inside it."""
    path = Path(path)
    if path.is_dir():
        path = path / "comparison.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(path, table)
    return path
