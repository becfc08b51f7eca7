"""The running profile (or a past run opened from disk): progress, sparklines of memory, step time and loss, and the
peak memory by phase so far. On the CPU backend there is no device memory: host RSS is shown, and labelled so."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from memlab.core.units import gib, gib_number
from memlab.tui.model import LiveState, duration
from memlab.tui.widgets.metric_row import MetricRow

MESSAGE_CHARS = 600  # of a run's closing message in the title: a few wrapped lines, never a screenful


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


class LivePanel(Vertical):
    """`show(state)` redraws from a LiveState; the app calls it at most a few times a second."""

    ROWS = (  # (key, label, floor): memory drawn from zero, time and loss from their own minimum
        ("device", "device NVML", 0),
        ("alloc", "allocated", 0),
        ("reserved", "reserved", 0),
        ("host", "host RSS", 0),
        ("step", "step ms", None),
        ("loss", "loss", None),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.renders = 0  # how many times show() redrew: the throttle's witness in tests
        self.state: LiveState | None = None
        self._shown: dict[str, object] = {}

    def compose(self) -> ComposeResult:
        notice = Static("", id="live-notice", markup=False)
        notice.display = False
        yield notice
        yield Static("no run yet: add profiles to the queue (enter) and press r to run them", id="live-title")
        bar = ProgressBar(total=None, show_eta=False, id="live-progress")
        bar.display = False  # no pulsing placeholder before a run: nothing moves on an idle screen
        yield bar
        yield Static("", id="live-stats")
        for key, label, floor in self.ROWS:
            yield MetricRow(label, floor, id=f"metric-{key}")
        yield Static("", id="live-peaks")

    def say(self, text: str | Text | None) -> None:
        """A line over the run, for what the user just did that did not happen (a profile refused at enqueue);
        None clears it."""
        notice = self.query_one("#live-notice", Static)
        notice.update(text or "")
        notice.display = bool(text)

    @property
    def notice(self) -> str:
        notice = self.query_one("#live-notice", Static)
        return str(notice.render()) if notice.display else ""

    def show(self, s: LiveState) -> None:
        self.renders += 1
        self.state = s
        cpu = s.on_cpu
        self.set_class(cpu, "-cpu")
        self.set_class(s.source == "folder", "-folder")
        self.border_title = "Live" if s.source == "live" else "Run folder"
        self.border_subtitle = s.run_id if s.source == "folder" else ""
        self._set("#live-title", self._title(s))
        bar = self.query_one(ProgressBar)
        bar.display = bool(s.total_steps)
        if s.total_steps:
            bar.update(total=s.total_steps, progress=s.step)
        self._set("#live-stats", self._stats(s))
        latest = lambda series: series[-1] if series else None  # noqa: E731
        self.query_one("#metric-device", MetricRow).show(s.device_used, gib(latest(s.device_used)))
        self.query_one("#metric-alloc", MetricRow).show(s.allocated, gib(latest(s.allocated)))
        self.query_one("#metric-reserved", MetricRow).show(s.reserved, gib(latest(s.reserved)))
        self.query_one("#metric-host", MetricRow).show(s.host_rss, gib(latest(s.host_rss)))
        self.query_one("#metric-step", MetricRow).show(s.step_times, _num(latest(s.step_times), "{:,.1f} ms"))
        self.query_one("#metric-loss", MetricRow).show(s.losses, _num(latest(s.losses), "{:.4f}"))
        self._set("#live-peaks", self._peaks(s))

    def _set(self, selector: str, content) -> None:
        """Update a line only when its text changed, and lay the screen out again only when its height did: a
        relayout costs tens of ms of the UI thread at 80x24, and the stats line changes on every step."""
        if self._shown.get(selector) == content:
            return
        self._shown[selector] = content
        widget = self.query_one(selector, Static)
        width = widget.content_size.width
        height_before = widget.get_content_height(widget.size, widget.size, width)
        widget.update(content, layout=False)
        if widget.get_content_height(widget.size, widget.size, width) != height_before:
            widget.refresh(layout=True)

    def _title(self, s: LiveState) -> Text:
        icon = "▶" if s.status == "running" else "◼"
        text = Text.from_markup(f"{icon} [b]{s.profile or '?'}[/b]")
        where = " · ".join(x for x in (s.experiment, s.device) if x)
        if where:
            text.append(f" · {where}")
        style = {"running": "bold", "finished": "bold green", "interrupted": "bold yellow", "": "dim"}.get(s.status, "bold red")
        text.append(f" · {s.status or 'starting'}", style=style)
        if s.message and s.status not in ("running", "finished"):  # whole, wrapped: a rejection says what to fix
            text.append("\n" + " ".join(s.message.split())[:MESSAGE_CHARS], style="red")
        return text

    def _stats(self, s: LiveState) -> str:
        total = s.total_steps if s.total_steps is not None else "?"
        parts = [f"step {s.step}/{total}", f"{_num(s.tokens_per_s, '{:,.0f}')} tok/s"]
        if s.source == "live" and s.status == "running":
            parts.append(f"ETA {duration(s.eta_s)}")
        if s.val_ppl is not None:
            parts.append(f"val ppl {s.val_ppl:,.2f}")
        elif s.loss is not None:
            parts.append(f"loss {s.loss:.4f}")
        return " · ".join(parts)

    def _peaks(self, s: LiveState) -> Text:
        p = s.peaks
        if s.on_cpu:
            text = Text("peak host RSS ", style="dim")
            text.append(gib(p.get("host")))
            text.append("  (CPU backend: no device memory)", style="dim italic")
            return text
        text = Text("peak ", style="dim")
        for i, (key, label) in enumerate((("fwd", "fwd"), ("bwd", "bwd"), ("opt", "opt"))):
            text.append(" · " if i else "", style="dim")
            text.append(f"{label} ", style="dim")
            text.append(gib_number(p.get(key)))
        text.append(" GiB\n     ", style="dim")
        text.append("reserved ", style="dim")
        text.append(gib_number(p.get("reserved")))
        text.append(" · device ", style="dim")
        text.append(gib_number(p.get("device")) if "device" in p else "— (no NVML)")
        text.append(" GiB", style="dim")
        return text

