"""`o`: pick a past run folder under --runs-dir (newest first) to show in the live panel."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

STATUS_STYLE = {"finished": "green", "interrupted": "yellow", "running": "yellow"}


def list_runs(runs_dir: str | Path) -> list[tuple[Path, str]]:
    """(folder, status) for each run folder, newest first (run ids start with the UTC time)."""
    from memlab.core import runfolder
    from memlab.core.errors import MemlabError

    try:
        dirs = runfolder.find_run_dirs([runs_dir])
    except MemlabError:
        return []
    out = []
    for d in dirs:
        try:
            status = runfolder.read_info(d).get("status", "?")
        except ValueError:
            status = "unreadable"
        out.append((d, str(status)))
    return sorted(out, key=lambda x: x[0].name, reverse=True)


class OpenRunScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, runs_dir: str | Path) -> None:
        super().__init__()
        self.runs_dir = runs_dir

    def compose(self) -> ComposeResult:
        runs = list_runs(self.runs_dir)
        with Vertical(id="open-body") as body:
            body.border_title = f"Open a run · {self.runs_dir}"
            body.border_subtitle = "enter opens · esc cancels"
            if not runs:
                yield Static(f"no run folders under {self.runs_dir}")
            options = []
            for d, status in runs:
                text = Text(d.name)
                text.append(f"  {status}", style=STATUS_STYLE.get(status, "red"))
                options.append(Option(text, id=str(d)))
            yield OptionList(*options, id="open-list")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def _on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
