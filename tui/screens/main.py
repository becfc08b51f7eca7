"""The one working screen: profiles, queue and knobs on the left; the live panel, results and log on the right."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

from memlab.tui.widgets.event_log import EventLog
from memlab.tui.widgets.lanes_view import LanesView
from memlab.tui.widgets.live_panel import LivePanel
from memlab.tui.widgets.profile_list import ProfileInfo, ProfileList, label_text
from memlab.tui.widgets.queue_view import QueueView
from memlab.tui.widgets.results_table import ResultsTable
from memlab.tui.widgets.settings_panel import Settings, SettingsPanel


LEFT_MIN, LEFT_SHARE = 30, 0.35  # the left column: 30 cells at 80 columns, up to about a third of a wide terminal
LEFT_CHROME = 7  # the profile list's border, padding and scrollbar


def left_width(screen_width: int, profiles: list[ProfileInfo]) -> int:
    """Wide enough for the longest profile label (with its mark) where the terminal has room, never under 30."""
    longest = max((len(label_text(p)) for p in profiles), default=0)
    return max(LEFT_MIN, min(longest + LEFT_CHROME, int(screen_width * LEFT_SHARE)))


class MainScreen(Screen):
    BINDINGS = [
        Binding("1", "tab('results')", "Results", show=False, tooltip="Results tab (reads the runs folder again)"),
        Binding("2", "tab('log')", "Log", show=False, tooltip="Log tab: runs started, evaluations, how each run ended"),
        Binding("w", "columns", "Columns", tooltip="Results: cycle the column sets (key figures, memory, speed, all in pages that fit), from any panel"),
        Binding("e", "edit_settings", "Edit knobs", show=False, tooltip="Edit the knobs (experiment, steps, batch: N or max) for runs that start next; esc or enter leaves them"),
        Binding("z", "zoom", "Zoom", show=False, tooltip="Zoom the focused panel to the whole screen (z or esc again to leave)"),
        Binding("escape", "unzoom", "Leave zoom", show=False),
    ]

    def __init__(self, profiles: list[ProfileInfo], settings: Settings, experiments: list[str]) -> None:
        super().__init__()
        self._profiles = profiles
        self._settings = settings
        self._experiments = experiments
        self._outside_knobs: Widget | None = None  # the widget focused before the Knobs: where esc goes back to

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="left"):
            profiles = ProfileList(self._profiles, id="profiles")
            profiles.border_title = "Profiles"
            profiles.border_subtitle = f"{len(self._profiles)}"
            yield profiles
            yield Static("", id="profile-help")
            queue = QueueView(id="queue")
            queue.border_title = "Queue"
            queue.border_subtitle = "enter adds"
            yield queue
            knobs = SettingsPanel(self._settings, self._experiments, id="settings")
            knobs.border_title = "Knobs"
            yield knobs
        with Vertical(id="right"):
            live = LivePanel(id="live")
            live.border_title = "Live"
            yield live
            yield LanesView(id="lanes")  # one row per busy GPU lane; hidden unless two or more runs are live
            with TabbedContent(id="tabs", initial="results"):
                with TabPane("Results", id="results"):
                    yield ResultsTable(id="results-table")
                    yield Static("", id="results-notes")
                with TabPane("Log", id="log"):
                    yield EventLog(id="event-log")
        yield Footer(show_command_palette=False, compact=True)

    def on_mount(self) -> None:
        self.query_one(ProfileList).focus()

    def on_resize(self) -> None:
        # Taller sparklines when there is room for them.
        self.set_class(self.size.height >= 34, "-tall")
        self.query_one("#left").styles.width = left_width(self.size.width, self._profiles)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        settings = self.query_one(SettingsPanel)
        if settings not in event.widget.ancestors_with_self:
            self._outside_knobs = event.widget

    def on_settings_panel_done(self, message: SettingsPanel.Done) -> None:
        back = self._outside_knobs
        if back is None or not back.is_attached or not back.focusable:
            back = self.query_one(ProfileList)
        back.focus()

    def _on_profile_list_highlighted(self, event: ProfileList.Highlighted) -> None:
        info = event.info
        if info is not None and info.error:
            text = Text.assemble(("✗ does not load: ", "bold red"), (info.error, "red"))
        else:
            text = Text("" if info is None else (info.description or info.changes))
            if info is not None and info.refusal(event.device):  # short: enter says it whole, in the Live panel
                text.append("\n✗ " + info.short_refusal(event.device), "red")
            elif info is not None and info.needs_cuda:
                text.append(f"\nneeds CUDA: {info.needs_cuda}", "dim")
        self.query_one("#profile-help", Static).update(text)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        if tab == "results":
            self.app.load_results()  # also picks up runs that other processes (a sweep) wrote meanwhile
        target = self.query_one(ResultsTable) if tab == "results" else self.query_one(EventLog)
        target.focus()

    def action_columns(self) -> None:
        self.query_one(TabbedContent).active = "results"  # from the Log tab: show what changed
        self.query_one(ResultsTable).action_next_columns()

    def action_edit_settings(self) -> None:
        self.query_one("#knob-experiment").focus()

    def action_zoom(self) -> None:
        """Maximize the focused panel (toggle): for a wide results table in a small terminal."""
        if self.maximized is not None:
            self.minimize()
            return
        focused = self.focused
        if focused is None:
            return
        panel = focused
        for node in focused.ancestors_with_self:
            if node.id in ("profiles", "queue", "settings", "live", "tabs"):
                panel = node
                break
        self.maximize(panel, container=False)

    def action_unzoom(self) -> None:
        if self.maximized is not None:
            self.minimize()
