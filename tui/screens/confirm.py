"""A yes/no question over the screen: `q` while a run is in progress asks before it stops the run."""

from __future__ import annotations

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

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question, self.detail = question, detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-body") as body:
            body.border_title = "memlab tui"
            body.border_subtitle = "y (or q) yes · n (or esc) no"
            yield Static(f"[b]{self.question}[/b]", id="confirm-question")
            if self.detail:
                yield Static(self.detail, id="confirm-detail", markup=False)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
