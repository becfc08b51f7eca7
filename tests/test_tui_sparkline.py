"""memlab's Sparkline renderable draws what Textual's does (same bars, colours within one ramp step), cheaper."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.color import Color
from rich.console import Console
from textual.renderables.sparkline import Sparkline as TextualBars

from memlab.tui.widgets.sparkline import COLOR_STEPS, Bars

CONSOLE = Console(width=200, color_system="truecolor")
LOW, HIGH = Color.from_rgb(10, 40, 90), Color.from_rgb(200, 230, 250)


def cells(renderable, width: int) -> list[list[tuple[str, tuple[int, int, int] | None]]]:
    """Each row as (character, colour) per cell."""
    rows = []
    for line in CONSOLE.render_lines(renderable, CONSOLE.options.update(width=width), pad=False):
        row = []
        for seg in line:
            color = seg.style.color.get_truecolor() if seg.style and seg.style.color else None
            row += [(ch, tuple(color) if color else None) for ch in seg.text]
        rows.append(row)
    return rows


series = st.one_of(
    st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), max_size=400),
    st.lists(st.integers(0, 3), max_size=50),  # flat runs and ties
)


@settings(max_examples=150, deadline=None)
@given(data=series, width=st.integers(1, 150), height=st.integers(1, 3))
def test_same_bars_as_textuals_sparkline_and_colours_within_a_step(data, width, height):
    ours = cells(Bars(data, width, height, LOW, HIGH), width)
    theirs = cells(TextualBars(data, width=width, height=height, min_color=LOW, max_color=HIGH), width)
    assert [[ch for ch, _ in row] for row in ours] == [[ch for ch, _ in row] for row in theirs]
    # One ramp step is 1/(COLOR_STEPS - 1) of the way from LOW to HIGH; rounding to a step moves a colour by half that.
    tolerance = [abs(h - lo) / (COLOR_STEPS - 1) / 2 + 1 for lo, h in zip(LOW.get_truecolor(), HIGH.get_truecolor())]
    for row_ours, row_theirs in zip(ours, theirs):
        for (_, a), (_, b) in zip(row_ours, row_theirs):
            assert (a is None) == (b is None)
            if a is not None:
                assert all(abs(x - y) <= t for x, y, t in zip(a, b, tolerance)), (a, b)


def test_a_memory_series_drawn_from_zero_shows_a_small_wobble_as_small():
    mb = 1 << 20
    wobble = [500 * mb, 509 * mb, 503 * mb, 507 * mb]  # 9 MB on 500 MB of RSS
    rows = cells(Bars(wobble, 4, 1, LOW, HIGH, floor=0), 4)
    assert {ch for ch, _ in rows[0]} <= {"▇", "█"}  # every bar near full height: the wobble is 2%
    scaled = cells(Bars(wobble, 4, 1, LOW, HIGH), 4)
    assert scaled[0][0][0] == "▁" and scaled[0][1][0] == "█"  # without a floor, min to max: the 2% fills the height
