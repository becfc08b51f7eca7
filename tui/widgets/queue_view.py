"""The queue: profiles waiting, running and done, in the order they run. Reorder and remove with the keyboard."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from memlab.tui.model import RUNNING, STATUS_ICON, WAITING, QueueItem, display_name

STATUS_STYLE = {WAITING: "dim", RUNNING: "bold", "finished": "green", "interrupted": "yellow"}


def item_text(item: QueueItem, position: int) -> Text:
    style = STATUS_STYLE.get(item.status, "red")
    text = Text(f"{position:>2} ", style="dim")
    text.append(f"{STATUS_ICON.get(item.status, '?')} ", style=style)
    text.append(display_name(item.profile), style="bold" if item.status == RUNNING else "")
    if item.status not in (WAITING,):
        text.append(f" {item.status}", style=style)
    return text


class QueueView(OptionList):
    """Waiting profiles run top to bottom; shift+up/down moves the highlighted one, delete removes it."""

    BINDINGS = [  # one footer entry for both moves: `q Quit` keeps its place at 80 columns
        Binding("shift+up,K", "move(-1)", "Move", key_display="⇧↑↓", tooltip="Move the highlighted item up or down (K, J too)"),
        Binding("shift+down,J", "move(1)", show=False),
        Binding("delete,backspace,x", "remove", "Remove", key_display="del", tooltip="Remove a waiting (or finished) item; c cancels the running one"),
    ]

    @dataclass
    class Move(Message):
        item_id: int
        delta: int

    @dataclass
    class Remove(Message):
        item_id: int

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._shown: list[tuple] = []

    def show(self, items: list[QueueItem], keep: int | None = None) -> None:
        """Render `items`; the highlight stays on the same item (or on `keep`, an item id, after a move)."""
        key = [(i.id, i.profile, i.status) for i in items]
        if key == self._shown and keep is None:
            return
        self._shown = key
        current = keep if keep is not None else self._highlighted_id()
        index = self.highlighted
        self.set_options([Option(item_text(item, n), id=str(item.id)) for n, item in enumerate(items, 1)])
        ids = [i.id for i in items]
        if current in ids:
            self.highlighted = ids.index(current)
        elif items:
            self.highlighted = min(index or 0, len(items) - 1)  # a removed item's place
        waiting = sum(i.status == WAITING for i in items)
        self.border_subtitle = f"{waiting} waiting" if items else "enter adds"

    def _highlighted_id(self) -> int | None:
        option = self.highlighted_option
        return int(option.id) if option is not None and option.id is not None else None

    def action_move(self, delta: int) -> None:
        item_id = self._highlighted_id()
        if item_id is not None:
            self.post_message(self.Move(item_id, delta))

    def action_remove(self) -> None:
        item_id = self._highlighted_id()
        if item_id is not None:
            self.post_message(self.Remove(item_id))
