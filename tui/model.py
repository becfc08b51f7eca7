"""What the TUI shows, as plain Python: the queue of profiles and the state of one run, built from its events.

No Textual here: the widgets render these objects, the queue worker (a thread) and the UI both touch the queue
under its lock, and `LiveState.apply` folds the supervisor's JSON-lines events (or a finished run folder) into the
series the live panel draws.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memlab.core.units import gib  # noqa: F401 (the TUI's widgets format bytes with it)

SERIES_LEN = 600  # points kept per live series; a sparkline squeezes them into its width
SERIES = ("device_used", "allocated", "reserved", "host_rss", "step_times", "losses")

# Queue item statuses: the ChildResult statuses, plus the two before an outcome.
WAITING = "queued"
RUNNING = "running"
FAILED = ("oom", "nan", "interrupted", "error", "crashed", "rejected")
STATUS_ICON = {
    WAITING: "·",
    RUNNING: "▶",
    "finished": "✓",
    "interrupted": "■",
    "oom": "✗",
    "nan": "✗",
    "error": "✗",
    "crashed": "✗",
    "rejected": "✗",
}


@dataclass
class QueueItem:
    id: int
    profile: str  # a built-in name or a TOML path
    status: str = WAITING
    run_dir: str | None = None
    message: str = ""

    @property
    def done(self) -> bool:
        return self.status not in (WAITING, RUNNING)


class RunQueue:
    """Profiles to run, in order. The worker claims the first waiting one; the UI reorders and removes waiting ones."""

    def __init__(self) -> None:
        self._items: list[QueueItem] = []
        self._next_id = 1
        self.lock = threading.Lock()

    def items(self) -> list[QueueItem]:
        with self.lock:
            return [QueueItem(**vars(i)) for i in self._items]

    def add(self, profile: str) -> QueueItem:
        with self.lock:
            item = QueueItem(self._next_id, profile)
            self._next_id += 1
            self._items.append(item)
            return item

    def move(self, item_id: int, delta: int) -> bool:
        with self.lock:
            i = self._index(item_id)
            j = i + delta if i is not None else None
            if i is None or j is None or not 0 <= j < len(self._items):
                return False
            self._items[i], self._items[j] = self._items[j], self._items[i]
            return True

    def remove(self, item_id: int) -> bool:
        """Remove a waiting or finished item; the running one is cancelled, not removed."""
        with self.lock:
            i = self._index(item_id)
            if i is None or self._items[i].status == RUNNING:
                return False
            del self._items[i]
            return True

    def claim_next(self) -> QueueItem | None:
        with self.lock:
            for item in self._items:
                if item.status == WAITING:
                    item.status = RUNNING
                    return QueueItem(**vars(item))
            return None

    def update(self, item_id: int, **fields: Any) -> None:
        with self.lock:
            i = self._index(item_id)
            if i is not None:
                for k, v in fields.items():
                    setattr(self._items[i], k, v)

    def pending(self) -> int:
        with self.lock:
            return sum(i.status == WAITING for i in self._items)

    def _index(self, item_id: int) -> int | None:
        for i, item in enumerate(self._items):
            if item.id == item_id:
                return i
        return None


def display_name(profile: str) -> str:
    """A profile as shown: built-in names as they are, a TOML path by its file name."""
    return Path(profile).name if profile.endswith(".toml") or "/" in profile else profile


def duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "—"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _max(*values: Any) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


@dataclass
class LiveState:
    """One run as the live panel shows it: identity, progress, series for the sparklines, peaks so far."""

    profile: str = ""
    run_id: str = ""
    run_dir: str = ""
    experiment: str = ""
    device: str = ""  # cuda | cpu ("" until the run says)
    expected_device: str = ""  # cuda | cpu as the app expects it before the run says ("" unknown): no GPU rows on CPU
    status: str = ""  # "" (nothing yet) | running | finished | oom | ...
    message: str = ""
    source: str = "live"  # live | folder (a past run opened from disk)
    total_steps: int | None = None
    step: int = 0  # steps completed
    loss: float | None = None
    step_ms: float | None = None
    tokens_per_s: float | None = None
    val_ppl: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    device_used: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))  # NVML, bytes
    allocated: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))  # torch, max of the phase peaks
    reserved: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    host_rss: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    step_times: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    losses: deque = field(default_factory=lambda: deque(maxlen=SERIES_LEN))
    peaks: dict[str, int] = field(default_factory=dict)  # fwd bwd opt reserved device host: max so far
    _first: tuple[int, float] | None = None  # (steps done, event time) at the first step event
    _last_t: float | None = None

    @property
    def on_cpu(self) -> bool:
        """No device memory to show: the CPU backend (or a run with no torch figures at all)."""
        if self.device:
            return self.device == "cpu"
        if self.expected_device:
            return self.expected_device == "cpu"
        return not self.allocated and bool(self.host_rss)

    @property
    def eta_s(self) -> float | None:
        if self.total_steps is None or self.status not in ("running",):
            return None
        remaining = self.total_steps - self.step
        if remaining <= 0:
            return 0.0
        if self._first is not None and self._last_t is not None and self.step > self._first[0]:
            per_step = (self._last_t - self._first[1]) / (self.step - self._first[0])
            return per_step * remaining
        return self.step_ms / 1000.0 * remaining if self.step_ms else None

    @property
    def fraction(self) -> float | None:
        if not self.total_steps:
            return None
        return min(1.0, self.step / self.total_steps)

    def _peak(self, key: str, value: Any) -> None:
        if value is not None:
            self.peaks[key] = max(self.peaks.get(key, 0), int(value))

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "started":
            fresh = LiveState()
            self.__dict__.update(fresh.__dict__)
            self.profile = (ev.get("profile") or {}).get("name", "") if isinstance(ev.get("profile"), dict) else str(ev.get("profile", ""))
            self.experiment = (ev.get("experiment") or {}).get("name", "") if isinstance(ev.get("experiment"), dict) else str(ev.get("experiment", ""))
            self.run_id = ev.get("run_id") or ""
            self.run_dir = ev.get("run_dir") or ""
            self.device = ev.get("device") or ""
            self.total_steps = ev.get("total_steps")
            self.status = "running"
        elif kind == "step":
            self.step = int(ev.get("step", -1)) + 1
            self.total_steps = ev.get("total_steps") or self.total_steps
            self.loss = ev.get("loss")
            self.step_ms = ev.get("step_ms")
            self.tokens_per_s = ev.get("tokens_per_s")
            t = ev.get("t")
            if t is not None:
                if self._first is None:
                    self._first = (self.step, t)
                self._last_t = t
            self._add_step(ev)
        elif kind == "gpu_sample":
            used = ev.get("used_bytes")
            if used is not None:
                self.device_used.append(used)
                self._peak("device", used)
        elif kind == "eval":
            self.val_ppl = ev.get("val_ppl")
        elif kind in ("finished", "failed"):
            self.status = "finished" if kind == "finished" else ev.get("reason", "error")
            self.message = ev.get("message", "") or ""
            self.summary = ev.get("summary") or {}
            if self.summary.get("val_ppl") is not None:
                self.val_ppl = self.summary["val_ppl"]

    def _add_step(self, row: dict[str, Any]) -> None:
        fwd, bwd, opt = row.get("peak_alloc_fwd_bytes"), row.get("peak_alloc_bwd_bytes"), row.get("peak_alloc_opt_bytes")
        alloc = _max(fwd, bwd, opt)
        if alloc is not None:
            self.allocated.append(alloc)
        if row.get("peak_reserved_bytes") is not None:
            self.reserved.append(row["peak_reserved_bytes"])
        if row.get("host_rss_bytes") is not None:
            self.host_rss.append(row["host_rss_bytes"])
        if row.get("step_ms") is not None:
            self.step_times.append(row["step_ms"])
        if row.get("loss") is not None:
            self.losses.append(row["loss"])
        for key, value in (("fwd", fwd), ("bwd", bwd), ("opt", opt), ("reserved", row.get("peak_reserved_bytes")), ("host", row.get("host_rss_bytes"))):
            self._peak(key, value)

    def ended(self, status: str, message: str = "") -> None:
        """The supervisor's word on how the child ended (covers crashes the child could not report)."""
        if self.status in ("", "running"):
            self.status = status
            self.message = message or self.message


PEAK_OF_COLUMN = {  # LiveState.peaks key of each steps.parquet / summary.parquet memory column
    "peak_alloc_fwd_bytes": "fwd", "peak_alloc_bwd_bytes": "bwd", "peak_alloc_opt_bytes": "opt",
    "peak_reserved_bytes": "reserved", "host_rss_bytes": "host", "peak_nvml_bytes": "device", "peak_host_rss_bytes": "host",
}


def load_run(run_dir: str | Path, max_points: int = 2000) -> LiveState:
    """A past run folder as a LiveState: run.json for who, summary.parquet for the outcome, steps/gpu for the charts.
    Raises ValueError with a short reason when the folder is not a readable run."""
    from memlab.core import runfolder, schema

    d = Path(run_dir)
    try:
        run = runfolder.read_run(d)
    except ValueError as e:
        hint = " (not a run folder)" if not (d / schema.RUN_JSON).exists() else ""
        raise ValueError(f"{d}: {e}{hint}") from None
    s = _identity(run)
    for name in SERIES:
        setattr(s, name, deque(maxlen=max_points))
    _add_steps(s, run.steps, max_points)
    _add_gpu(s, run.gpu, max_points)
    _add_summary(s, run.summary)
    return s


def _identity(run: Any) -> LiveState:
    info = run.info
    profile, experiment = info.get("profile"), info.get("experiment")
    s = LiveState(source="folder", run_dir=str(run.path))
    s.profile = profile.get("name", "") if isinstance(profile, dict) else str(profile or "")
    s.experiment = experiment.get("name", "") if isinstance(experiment, dict) else str(experiment or "")
    s.run_id = info.get("run_id") or run.path.name
    s.device = info.get("device") or ""
    s.status = run.status
    s.message = info.get("message") or ""
    s.summary = {k: v for k, v in run.summary.items() if v is not None}
    return s


def _add_steps(s: LiveState, steps: Any, max_points: int) -> None:
    if steps is None or not steps.height:
        return
    stride = max(1, steps.height // max_points)
    for row in steps.gather_every(stride).iter_rows(named=True):
        s._add_step(row)
    last = steps.row(-1, named=True)
    s.step = int(last.get("step", -1)) + 1
    s.loss, s.step_ms, s.tokens_per_s = last.get("loss"), last.get("step_ms"), last.get("tokens_per_s")
    for col in steps.columns:
        if col in PEAK_OF_COLUMN:
            s._peak(PEAK_OF_COLUMN[col], steps[col].max())


def _add_gpu(s: LiveState, gpu: Any, max_points: int) -> None:
    if gpu is None or not gpu.height:
        return
    stride = max(1, gpu.height // max_points)
    s.device_used.extend(v for v in gpu["used_bytes"].gather_every(stride).to_list() if v is not None)
    s._peak("device", gpu["used_bytes"].max())


def _add_summary(s: LiveState, summary: dict[str, Any]) -> None:
    s.total_steps = summary.get("steps") or s.step or None
    if summary.get("steps") is not None:
        s.step = summary["steps"]
    s.tokens_per_s = summary.get("tokens_per_s", s.tokens_per_s)
    s.step_ms = summary.get("step_ms_median", s.step_ms)
    s.val_ppl = summary.get("val_ppl")
    for col, key in PEAK_OF_COLUMN.items():
        if col in summary:
            s._peak(key, summary[col])
