"""`?`: every key binding (read from the classes that define them, so it never goes stale) and what each panel is."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

PANELS = (
    ("Profiles", "built-in profiles and *.toml files of the current folder (or --profiles-dir)"),
    ("Queue", "r runs what waits, top to bottom, one child process each; a crash or an OOM ends only that run; once it runs dry, what you add waits for r again"),
    ("Knobs", "experiment, steps and batch (a number or max) for the runs that start next; a value that does not parse starts no run; a field takes only its own characters, so r, q and the other keys still act"),
    ("Live", "the running profile: memory (device NVML, torch allocated and reserved; host RSS on CPU), step time, loss"),
    ("Results", "the same comparison as `memlab table`, filled in as runs finish: the columns that fit, relative ones first (w cycles the sets, from any panel; the border names the one shown)"),
    ("Log", "runs started, evaluations, and how each ended (finished, oom, crashed, interrupted...)"),
)


def _key_text(binding: Binding, app) -> str:
    if binding.key_display:
        return binding.key_display
    keys = [k.strip() for k in binding.key.split(",")]
    return " ".join(app.get_key_display(Binding(k, binding.action)) for k in keys[:2])


def binding_sections(app) -> list[tuple[str, list[tuple[str, str]]]]:
    from memlab.tui.screens.main import MainScreen
    from memlab.tui.widgets.profile_list import ProfileList
    from memlab.tui.widgets.queue_view import QueueView
    from memlab.tui.widgets.results_table import ResultsTable
    from memlab.tui.widgets.settings_panel import SettingsPanel

    def rows(bindings) -> list[tuple[str, str]]:
        out = []
        for b in bindings:
            if isinstance(b, Binding) and b.description:
                out.append((_key_text(b, app), b.tooltip or b.description))
        return out

    return [
        ("Anywhere", rows(type(app).BINDINGS) + rows(MainScreen.BINDINGS) + [
            ("tab ⇧tab", "Next / previous panel"),
            ("ctrl+q", "Quit, also from a text field"),
            ("ctrl+p", "Command palette (themes, keys)"),
        ]),
        ("Profiles", [("enter", "Add to queue (a greyed-out profile cannot run here: the Live panel says why)")] + rows(ProfileList.BINDINGS)),
        ("Queue", rows(QueueView.BINDINGS)),
        ("Knobs (e)", rows(SettingsPanel.BINDINGS) + [("enter", "In a text field: leave the Knobs too (on the experiment: open its list)")]),
        ("Results (1)", rows(ResultsTable.BINDINGS)),
    ]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[tuple[str, list[tuple[str, str]]]] = []

    def compose(self) -> ComposeResult:
        self.sections = binding_sections(self.app)
        with VerticalScroll(id="help-body") as body:
            body.border_title = "memlab tui · keys"
            body.border_subtitle = "esc closes"
            yield Static(self._keys(), id="help-keys")
            yield Static(self._panels(), id="help-panels")

    def _keys(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for title, rows in self.sections:
            table.add_row(Text(title, style="bold underline"), "")
            for key, desc in rows:
                table.add_row(key, desc)
        return table

    def _panels(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        table.add_row(Text("Panels", style="bold underline"), "")
        for name, text in PANELS:
            table.add_row(name, text)
        return table

    def action_close(self) -> None:
        self.dismiss(None)
