"""The stop that long work in this thread asks now and then. A study's lane sets it around each trace of its
replayed prediction (memlab.core.predict.axis); the trace's dispatch mode and the compiled step's tracing
child (compile_budget_model) ask it, so a stop does not wait for either to end."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("memlab_stop", default=None)


@contextlib.contextmanager
def asking(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within the block, `current()` is `should_stop` (in this thread)."""
    token = _STOP.set(should_stop)
    try:
        yield
    finally:
        _STOP.reset(token)


def current() -> Callable[[], bool] | None:
    return _STOP.get()


def asked() -> bool:
    stop = _STOP.get()
    return stop is not None and stop()
