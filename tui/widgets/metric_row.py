"""One line of the live panel: a label, a sparkline of the series, and its latest value."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label

from memlab.tui.widgets.sparkline import Sparkline


class MetricRow(Horizontal):
    def __init__(self, label: str, floor: float | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._label = label
        self._floor = floor  # memory rows: bars from zero, not from the series' minimum
        self._data: tuple = ()
        self._value = ""

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="metric-label")
        yield Sparkline([], floor=self._floor, classes="metric-spark")
        yield Label("—", classes="metric-value")

    @property
    def data(self) -> tuple:
        return self._data

    def show(self, data: Sequence[float], value: str) -> None:
        """Redraw only what changed (no flicker, no needless refresh)."""
        data = tuple(data)
        if data != self._data:
            self._data = data
            self.query_one(Sparkline).data = list(data)
        if value != self._value:
            self._value = value
            # A fixed-size cell (memlab.tcss): a repaint, not a relayout of the whole screen, on every step.
            self.query_one(".metric-value", Label).update(value, layout=False)

    def relabel(self, label: str) -> None:
        if label != self._label:
            self._label = label
            self.query_one(".metric-label", Label).update(label)
