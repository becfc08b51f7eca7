"""`memlab table` and `memlab plot`: compare run folders side by side, as a table or as charts.

The frame comes from memlab.core.compare (shared with the TUI); this module only renders it: rich on a terminal,
markdown / csv / json / parquet for files. Diagnostics (skipped folders, where files went) go to stderr, so that
`memlab table runs/ --format markdown > results.md` writes only the table.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memlab.cli.options import JsonFlagOpt, json_wins

if TYPE_CHECKING:
    import polars as pl
    from rich.console import Console


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"
    parquet = "parquet"


PathsArg = Annotated[Optional[list[Path]], typer.Argument(help="Run folders, or folders of runs (default: runs).", show_default=False)]
AllOpt = Annotated[bool, typer.Option("--all", help="Every run, not only the latest of each profile per experiment.")]
BaselineOpt = Annotated[Optional[str], typer.Option("--baseline", "-b", help="Profile the relative columns compare against (default: 'baseline' if present, else the first run).")]
SortOpt = Annotated[Optional[str], typer.Option("--sort", help="Sort rows within each experiment by this column (name or header, e.g. step_ms_median or 'peak GiB'); '-' in front for descending.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="A run folder that cannot be read is an error (exit 2) instead of a skipped line.")]
ExperimentOpt = Annotated[Optional[str], typer.Option("--experiment", "-e", help="Only this experiment (name or id).")]

STATUS_STYLE = {"finished": "green", "interrupted": "yellow", "incomplete": "yellow", "running": "yellow"}


def build(paths: list[Path] | None, all_: bool, baseline: str | None, sort: str | None, strict: bool, experiment: str | None, err: Console):
    """Read, filter and compare: the comparison frame and the paths it came from. Reports skipped folders on `err`."""
    from memlab.core import compare
    from memlab.core.errors import MemlabError

    paths = list(paths or [Path("runs")])
    if not compare.find_run_dirs(paths):
        raise MemlabError(f"no runs under {', '.join(map(str, paths))} (start one with: memlab run --profile baseline)")
    result, skipped = compare.load(paths, baseline=baseline, latest_only=not all_, experiment=experiment, sort=sort, strict=strict)
    # Reported once the options are known to be good, so that a user error stays a one-line message.
    for folder, reason in skipped:
        err.print(f"[yellow]skipped[/] {folder}: {reason}", highlight=False, soft_wrap=True)
    return result, paths


def table(
    paths: PathsArg = None,
    all_: AllOpt = False,
    baseline: BaselineOpt = None,
    format_: Annotated[Format, typer.Option("--format", "-f", help="table (rich, for a terminal) | markdown | csv | json | parquet (to stdout).")] = Format.table,
    sort: SortOpt = None,
    strict: StrictOpt = False,
    experiment: ExperimentOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write comparison.parquet (default: in the first folder given).")] = None,
    as_json: JsonFlagOpt = False,
) -> None:
    """Compare runs side by side: memory by phase, speed, quality, and each figure against a baseline."""
    from memlab.cli.console import make_console

    from memlab.core import compare
    from memlab.core.compare import machine_frame, render_markdown
    from memlab.core.errors import MemlabError

    format_ = json_wins(as_json, format_, Format.json, Format.table)
    err = make_console(stderr=True)
    result, paths = build(paths, all_, baseline, sort, strict, experiment, err)
    if result.height == 0:
        err.print("no readable runs")
        return

    target = out if out is not None else paths[0] / "comparison.parquet"
    try:
        written = compare.write_parquet(result, target)
    except OSError as e:
        if out is not None:
            raise MemlabError(f"cannot write {target}: {e.strerror or e}") from None
        err.print(f"[yellow]warning[/] could not write {target}: {e.strerror or e}")
        written = None

    if format_ is Format.table:
        console = make_console()
        render_rich(result, console)
    elif format_ is Format.markdown:
        sys.stdout.write(render_markdown(result))
    elif format_ is Format.csv:
        sys.stdout.write(machine_frame(result).write_csv())
    elif format_ is Format.json:
        sys.stdout.write(machine_frame(result).write_json() + "\n")
    elif format_ is Format.parquet:
        if sys.stdout.isatty():
            raise MemlabError("--format parquet writes binary to stdout: redirect it (> results.parquet) or use --out")
        import io

        buf = io.BytesIO()
        machine_frame(result).write_parquet(buf)
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.flush()
    if written is not None and format_ is Format.table:
        err.print(f"[dim]comparison frame: {written}[/]")


def plot(
    paths: PathsArg = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="PNG to write (default: compare.png in the first folder given).")] = None,
    all_: AllOpt = False,
    baseline: BaselineOpt = None,
    sort: SortOpt = None,
    strict: StrictOpt = False,
    experiment: ExperimentOpt = None,
    frontier: Annotated[bool, typer.Option("--frontier", help="Instead: peak memory against step time, one labelled point per run (default file: frontier.png).")] = False,
) -> None:
    """Draw the comparison as bar charts (PNG): peak memory by phase, step time, tokens/s, val ppl, max batch."""
    from memlab.cli.console import make_console

    from memlab.core.errors import MemlabError
    from memlab.core.plot import plot_comparison, plot_frontier

    err = make_console(stderr=True)
    result, paths = build(paths, all_, baseline, sort, strict, experiment, err)
    if result.height == 0:
        err.print("no readable runs: nothing to plot")
        return
    target = out if out is not None else paths[0] / ("frontier.png" if frontier else "compare.png")
    if target.suffix.lower() != ".png":
        raise MemlabError(f"{target}: plot writes PNG; give a file name ending in .png")
    try:
        written = (plot_frontier if frontier else plot_comparison)(result, target)
    except OSError as e:
        raise MemlabError(f"cannot write {target}: {e.strerror or e}") from None
    n = result["group_index"].n_unique()
    typer.echo(f"{written}  ({n} experiment{'s' if n != 1 else ''}, {result.height} run{'s' if result.height != 1 else ''})")


def register(app: typer.Typer) -> None:
    app.command("table")(table)
    app.command("plot")(plot)


# ---------------------------------------------------------------------------------------------- rendering


def render_rich(result: pl.DataFrame, console: Console) -> None:
    from rich.table import Table

    from memlab.core.compare import format_value, group_notes, groups, visible_columns

    n_groups = result["group_index"].n_unique()
    if n_groups > 1:
        console.print(f"[bold]{n_groups} experiments[/]: runs of different experiments or hardware are never compared; one table each.")
    for label, g in groups(result):
        shown, hidden = visible_columns(g)
        base = g["baseline"][0]
        console.print(f"[bold]{label}[/]  ·  baseline: {base or '—'}  ·  {g.height} run{'s' if g.height != 1 else ''}", soft_wrap=True)
        t = Table(header_style="bold")
        for c in shown:
            t.add_column(c.header, justify="left" if c.kind == "text" else "right", overflow="fold")
        for r in g.iter_rows(named=True):
            cells = []
            for c in shown:
                text = format_value(r[c.name], c.kind)
                if c.name == "status":
                    text = f"[{STATUS_STYLE.get(text, 'red')}]{text}[/]"
                elif c.name == "profile" and r["is_baseline"]:
                    text = f"[bold]{text}[/] (base)"
                cells.append(text)
            t.add_row(*cells)
        console.print(t)
        for note in group_notes(g, hidden):
            console.print(f"  [dim]{note}[/]", soft_wrap=True)
        console.print()
