"""Textual's Sparkline, drawn for a fraction of the cost. The live panel redraws six of them up to 8 times a
second; Textual's renderable blends a colour and builds a Style for every cell of every row (with Fractions for
the buckets), which at 200x50 took most of a core of the UI thread (bench/tui_load.py). Here a column's bar is
worked out once for all its rows, colours come from a small table, and a run of cells of one colour is one
Segment. Same bars, same buckets, same min-to-max colour ramp (in COLOR_STEPS steps).

A memory series is drawn from zero (`floor=0`): min-to-max scaling would blow a 9 MB wobble of a 500 MB RSS up to
the full height, a change that is not there."""

from __future__ import annotations

from collections.abc import Sequence

from rich.color import Color, blend_rgb
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.widgets import Sparkline as TextualSparkline

BARS = "▁▂▃▄▅▆▇█"
COLOR_STEPS = 32  # colours between min and max: finer than a one-cell-tall bar can show


def column_values(data: Sequence[float], width: int) -> list[float]:
    """One value per column: the data cut into `width` buckets (the max of each), stretched over the width when
    there are fewer points than columns; the same buckets Textual's Sparkline draws."""
    n = len(data)
    buckets = [max(data[b * n // width:(b + 1) * n // width]) for b in range(width) if b * n // width < (b + 1) * n // width]
    step, index, values = len(buckets) / width, 0.0, []
    for _ in range(width):
        values.append(buckets[int(index)])
        index += step
    return values


class Bars:
    """A rich renderable: `data` as bars `width` cells wide and `height` rows tall."""

    def __init__(self, data: Sequence[float], width: int, height: int, min_color: Color, max_color: Color, floor: float | None = None):
        self.data, self.width, self.height = data, width, max(1, height)
        self.min_color, self.max_color = min_color, max_color
        self.floor = floor  # the value of an empty bar; None: the series' own minimum

    def _styles(self) -> list[Style]:
        low, high, last = self.min_color.get_truecolor(), self.max_color.get_truecolor(), COLOR_STEPS - 1
        return [Style(color=Color.from_triplet(blend_rgb(low, high, i / last))) for i in range(COLOR_STEPS)]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width, height, data = self.width, self.height, self.data
        if width <= 0:
            return
        if len(data) < 2:  # nothing to scale: a floor line (no data) or full bars (one point), as Textual draws
            char, style = ("▁", Style(color=self.min_color)) if not data else ("█", Style(color=self.max_color))
            for row in range(height):
                if not data and row < height - 1:
                    yield Segment.line()
                    continue
                yield Segment(char * width, style)
                if row < height - 1:
                    yield Segment.line()
            return
        low, high = min(data), max(data)
        if self.floor is not None:
            low = min(low, self.floor)
        extent = high - low or 1
        levels = len(BARS) * height - 1
        ratios = [(v - low) / extent for v in column_values(data, width)]
        bar_of = [int(r * levels) for r in ratios]
        styles = self._styles()
        style_of = [styles[round(r * (COLOR_STEPS - 1))] for r in ratios]
        for row in reversed(range(height)):
            floor, ceiling = row * len(BARS), (row + 1) * len(BARS)
            run_text, run_style = [], None
            for bar, style in zip(bar_of, style_of):
                if bar < floor:
                    char, style = " ", None
                else:
                    char = "█" if bar >= ceiling else BARS[bar % len(BARS)]
                if style is not run_style and run_text:
                    yield Segment("".join(run_text), run_style)
                    run_text = []
                run_text.append(char)
                run_style = style
            yield Segment("".join(run_text), run_style)
            if row > 0:
                yield Segment.line()


class Sparkline(TextualSparkline):
    """Textual's widget (its CSS, its `data` reactive and its min/max colour component classes) with Bars."""

    def __init__(self, data=None, *, floor: float | None = None, **kwargs) -> None:
        super().__init__(data, **kwargs)
        self.floor = floor

    def render(self) -> Bars:
        _, base = self.background_colors
        low = base + (self.get_component_styles("sparkline--min-color").color if self.min_color is None else self.min_color)
        high = base + (self.get_component_styles("sparkline--max-color").color if self.max_color is None else self.max_color)
        return Bars(list(self.data or []), self.size.width, self.size.height, low.rich_color, high.rich_color, self.floor)
