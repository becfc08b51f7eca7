"""What happened, one line each: runs started, evaluations, and how each run ended (finished, OOM, crashed...)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import RichLog

OUTCOME_STYLE = {"finished": "green", "interrupted": "yellow", "warning": "yellow", "info": "", "start": "bold"}


class EventLog(RichLog):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=2000, wrap=True, min_width=20, markup=False, highlight=False, **kwargs)
        self.lines_text: list[str] = []  # plain copies, for tests and for the screenshot helper

    def add(self, message: str, kind: str = "info", t: float | None = None) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(t if t is not None else time.time()))
        line = Text(f"{stamp} ", style="dim")
        line.append(message, style=OUTCOME_STYLE.get(kind, "red"))
        self.lines_text.append(message)
        del self.lines_text[:-2000]
        self.write(line)
