"""Lanes: one live row per busy GPU lane while several runs train at once (a `memlab sweep --gpus` or `memlab study
--gpus` writing into this runs folder, or any runs side by side). Read from the run folders themselves, so it shows
runs this TUI did not start; hidden while fewer than two runs are live, when the Live panel says it all.

`busy_lanes(runs_dir)` is the reading (no Textual); `LanesView` polls it once a second and draws it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.widgets import Static

from memlab.core.runfolder import read_info

FRESH_S = 30.0  # a run whose events.jsonl has not grown for this long is not shown as live (killed, or stalled)
TAIL_BYTES = 16384  # of events.jsonl read first for the last step event (a gpu_sample every ~50 ms among the steps)
MAX_TAIL_BYTES = 2**20


@dataclass
class LaneRow:
    lane: str  # "gpu 2", "gpus 2,3", "cpu"
    profile: str
    step: int | None
    total_steps: int | None
    tokens_per_s: float | None
    run_dir: str

    def text(self) -> Text:
        line = Text(f"{self.lane:<9}", style="bold")
        line.append(f" {self.profile}")
        if self.step is not None:
            line.append(f" · step {self.step}" + (f"/{self.total_steps}" if self.total_steps else ""))
        if self.tokens_per_s:
            line.append(f" · {self.tokens_per_s:,.0f} tok/s")
        line.append(f" · {Path(self.run_dir).name}", style="dim")
        return line


def busy_lanes(runs_dir: str | os.PathLike, now: float | None = None, fresh_s: float = FRESH_S) -> list[LaneRow]:
    """The runs in `runs_dir` still running (run.json says so and events.jsonl grew within `fresh_s`), one row
    each, by the GPUs they run on (run.json's environment), ordered by lane."""
    now = time.time() if now is None else now
    rows = []
    try:
        entries = [e for e in os.scandir(runs_dir) if e.is_dir()]
    except OSError:
        return []
    for entry in entries:
        events = Path(entry.path, "events.jsonl")
        try:
            if now - events.stat().st_mtime > fresh_s:
                continue
            info = read_info(Path(entry.path))
        except (OSError, ValueError):
            continue
        if info.get("status") == "running":
            rows.append(_row(Path(entry.path), info))
    return sorted(rows, key=lambda r: (r.lane == "cpu", r.lane, r.profile))


def _row(d: Path, info: dict) -> LaneRow:
    env = info.get("environment") or {}
    gpus = env.get("gpu_index")
    lane = ("gpus " if "," in str(gpus) else "gpu ") + str(gpus) if gpus is not None else ("cpu" if info.get("device") == "cpu" else "?")
    profile = (info.get("profile") or {}).get("name") or d.name
    started, last = _first_and_last(d)
    step = last.get("step") if isinstance(last.get("step"), int) else None
    return LaneRow(lane, str(profile), None if step is None else step + 1, started.get("total_steps"), last.get("tokens_per_s"), str(d))


def _first_and_last(d: Path) -> tuple[dict, dict]:
    """The started event and the last step event of a live run's events.jsonl ({} where there is none): the tail
    is read, twice as much each time while it holds no step (a compile, or slow steps among GPU samples)."""
    try:
        with open(d / "events.jsonl", "rb") as f:
            started = _event(f.readline(), "started") or {}
            size = os.fstat(f.fileno()).st_size
            tail = TAIL_BYTES
            while True:
                f.seek(max(0, size - tail))
                lines = f.read().splitlines()[1 if size > tail else 0:]  # the first may be a partial line
                last = next((ev for ln in reversed(lines) if (ev := _event(ln, "step"))), None)
                if last is not None or tail >= min(size, MAX_TAIL_BYTES):
                    return started, last or {}
                tail *= 2
    except OSError:
        return {}, {}


def _event(line: bytes, kind: str) -> dict | None:
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    return ev if isinstance(ev, dict) and ev.get("event") == kind else None


class LanesView(Static):
    """The busy lanes, one row each; shown only while two or more runs are live."""

    DEFAULT_CSS = """
    LanesView { height: auto; max-height: 10; border: round $primary-darken-2; padding: 0 1; display: none; }
    LanesView.-busy { display: block; }
    """
    POLL_S = 1.0

    def __init__(self, runs_dir: str | None = None, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.runs_dir = runs_dir
        self.rows: list[LaneRow] = []

    def on_mount(self) -> None:
        self.border_title = "Lanes"
        if self.runs_dir is None:
            self.runs_dir = getattr(self.app, "runs_dir", "runs")
        self.set_interval(self.POLL_S, self.poll)

    def poll(self) -> None:
        self.show(busy_lanes(self.runs_dir))

    def show(self, rows: list[LaneRow]) -> None:
        self.rows = rows
        self.set_class(len(rows) >= 2, "-busy")
        self.border_subtitle = f"{len(rows)} busy"
        self.update(Text("\n").join(r.text() for r in rows))
