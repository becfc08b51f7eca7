"""The one queue supervisor: run child processes one after another and record an outcome for every item.

`memlab sweep` hands it a list; the TUI hands it a generator that claims the next waiting item only when the
previous one has ended (so items added, moved or paused meanwhile are honoured). Each item is a (key, ChildSpec)
pair; the key is whatever the caller knows the item by (a position, a queue item id).

Whatever a child or a callback does, every item the queue takes gets exactly one QueueOutcome: a child's own
outcome (see memlab.core.supervisor), or `skipped` for an item taken after `stop()`. A callback that raises is
noted on the outcome and the queue goes on. `cancel_current()` stops the running child (SIGINT: it keeps its
folder as `interrupted`) and the queue goes on; `stop()` does that and runs nothing more.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from memlab.core.supervisor import ChildResult, ChildRun, ChildSpec

SKIPPED = "skipped"  # not run: the queue was stopped before this item started


@dataclass
class QueueOutcome:
    key: Any
    spec: ChildSpec
    result: ChildResult
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # callbacks that raised (the queue went on)
    lane: Any = None  # the lane it ran on (memlab.core.lanes); None outside lanes

    @property
    def status(self) -> str:
        return self.result.status


class ChildQueue:
    """Runs (key, ChildSpec) items in the calling thread; cancel_current() / stop() may come from any thread."""

    def __init__(
        self,
        on_start: Callable[[Any, ChildSpec], None] | None = None,
        on_event: Callable[[Any, dict], None] | None = None,
        on_result: Callable[[QueueOutcome], None] | None = None,
        grace_s: float = 20.0,
    ):
        self.on_start, self.on_event, self.on_result = on_start, on_event, on_result
        self.grace_s = grace_s  # SIGINT, then SIGTERM after this, then SIGKILL (ChildRun.cancel)
        self.stopping = False
        self.current: ChildRun | None = None  # the child in flight
        self.current_key: Any = None  # the item in flight (set before its child exists)
        self._cancel_asked = False
        self._lock = threading.RLock()  # reentrant: sweep's SIGINT handler runs on the thread that may hold it

    def run(self, items: Iterable[tuple[Any, ChildSpec]]) -> list[QueueOutcome]:
        outcomes = []
        for key, spec in items:
            outcome = self._skip(key, spec) if self.stopping else self._run_one(key, spec)
            _call(self.on_result, outcome.notes, outcome)
            outcomes.append(outcome)
        return outcomes

    def cancel_current(self, grace_s: float | None = None) -> bool:
        """Ask the running item to stop (also one whose child is still starting); False when none runs."""
        with self._lock:
            if self.current_key is None:
                return False
            self._cancel_asked = True
            child = self.current
        if child is not None:
            child.cancel(self.grace_s if grace_s is None else grace_s)
        return True

    def stop(self, grace_s: float | None = None) -> None:
        """Start nothing more (items taken from now on are `skipped`) and cancel the running one."""
        self.stopping = True
        self.cancel_current(grace_s)

    def _skip(self, key: Any, spec: ChildSpec) -> QueueOutcome:
        return QueueOutcome(key, spec, ChildResult(SKIPPED, "not run: the queue was stopped first"))

    def _run_one(self, key: Any, spec: ChildSpec) -> QueueOutcome:
        t0 = time.monotonic()
        notes: list[str] = []
        with self._lock:
            self.current_key, self._cancel_asked = key, False
        _call(self.on_start, notes, key, spec)
        on_event = (lambda ev: self.on_event(key, ev)) if self.on_event is not None else None
        child = ChildRun(spec, on_event)
        with self._lock:
            self.current = child
            if self._cancel_asked or self.stopping:
                child.cancel(self.grace_s)
        try:
            result = child.wait()
        except Exception as e:  # noqa: BLE001 (wait never raises; if it ever did, this item still gets an outcome)
            child.kill("error", f"supervising the child failed: {e.__class__.__name__}: {e}")
            result = ChildResult("error", f"supervising the child failed: {e.__class__.__name__}: {e}")
        finally:
            with self._lock:
                self.current, self.current_key = None, None
        if result.callback_error:
            notes.append(result.callback_error)
        return QueueOutcome(key, spec, result, time.monotonic() - t0, notes)


def _call(callback: Callable[..., None] | None, notes: list[str], *args: Any) -> None:
    """A caller's callback: what it raises is noted, never allowed to stop the queue."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception as e:  # noqa: BLE001 (a display bug must not lose the other runs)
        notes.append(f"{getattr(callback, '__name__', 'callback')} raised {e.__class__.__name__}: {e}")
