"""A yes/no question over the screen: `q` while a run is in progress asks before it stops the run.

The detail may be a function: it is read again a few times a second, so that what the question says (the step the
run is at) goes on with the run while the dialog is open."""

from __future__ import annotations

from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y,q", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    REFRESH_S = 0.25

    def __init__(self, question: str, detail: str | Callable[[], str] = "") -> None:
        super().__init__()
        self.question = question
        self._detail = detail

    @property
    def detail(self) -> str:
        return self._detail() if callable(self._detail) else self._detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-body") as body:
            body.border_title = "memlab tui"
            body.border_subtitle = "y (or q) yes · n (or esc) no"
            yield Static(f"[b]{self.question}[/b]", id="confirm-question")
            if self._detail:
                yield Static(self.detail, id="confirm-detail", markup=False)

    def on_mount(self) -> None:
        if callable(self._detail):
            self.set_interval(self.REFRESH_S, self._refresh_detail)

    def _refresh_detail(self) -> None:
        self.query_one("#confirm-detail", Static).update(self.detail)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
