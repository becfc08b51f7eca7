"""`memlab fit --plot`: each profile's max micro-batch and longest sequence as bars (measured beside predicted where
--measure ran), with the table's header as the title. matplotlib's object-oriented API on the Agg canvas, as
memlab.core.plot draws."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

PANELS = (("max_batch", "measured_max_batch", "max micro-batch"), ("longest_seq", "measured_longest_seq", "longest sequence at micro-batch 1"))


def plot_fit(frame: pl.DataFrame, title: str, out: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    names = frame["profile"].to_list()
    for i, (predicted, measured, label) in enumerate(PANELS):
        ax = fig.add_subplot(1, 2, i + 1)
        _bars(ax, names, frame[predicted].to_list(), frame[measured].to_list() if measured in frame.columns else None)
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
    fig.suptitle("\n".join(textwrap.wrap(title, 160)), fontsize=7, x=0.01, ha="left")
    fig.subplots_adjust(top=0.78, bottom=0.22, wspace=0.25)
    fig.savefig(out)
    return out


def _bars(ax, names: list[str], predicted: list, measured: list | None) -> None:
    xs = range(len(names))
    width = 0.4 if measured else 0.8
    ax.bar([x - (width / 2 if measured else 0) for x in xs], [v or 0 for v in predicted], width, label="predicted")
    if measured:
        ax.bar([x + width / 2 for x in xs], [v or 0 for v in measured], width, label="measured")
        ax.legend(fontsize=8)
    ax.set_xticks(list(xs), names)
