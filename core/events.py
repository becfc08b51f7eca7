"""Events and sinks. The engine emits plain dicts to a sink; sinks share one tiny interface.

Event kinds: started, step, eval, gpu_sample, finished, failed (reason: oom | nan | interrupted | error).
Every event carries "event" (its kind) and "t" (unix seconds).
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import IO, Any, Protocol

EVENT_KINDS = ("started", "step", "eval", "gpu_sample", "finished", "failed")
FAIL_REASONS = ("oom", "nan", "interrupted", "error")


class Sink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"event": kind, "t": time.time(), **fields}


def _json_safe(value: Any) -> Any:
    # NaN/inf are not JSON: a diverged loss is written as null rather than breaking every reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def dumps(event: dict[str, Any]) -> str:
    return json.dumps(_json_safe(event), separators=(",", ":"), allow_nan=False)


class JsonLinesSink:
    """One JSON object per line to a stream (stdout for `--events -`) or a file opened for append."""

    def __init__(self, stream: IO[str] | None = None, path: str | None = None):
        self._own = stream is None
        self._stream = stream if stream is not None else open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()  # the NVML sampler thread emits too

    def emit(self, event: dict[str, Any]) -> None:
        line = dumps(event) + "\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()

    def close(self) -> None:
        if self._own:
            self._stream.close()


class ListSink:
    """Keeps every event in memory: for tests and in-process callers."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def close(self) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


class MultiSink:
    """Fans every event out to several sinks; one sink failing does not stop the others (or the run)."""

    def __init__(self, *sinks: Sink):
        self.sinks = [s for s in sinks if s is not None]

    def emit(self, event: dict[str, Any]) -> None:
        errors = []
        for sink in self.sinks:
            try:
                sink.emit(event)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def stdout_sink() -> JsonLinesSink:
    return JsonLinesSink(stream=sys.stdout)
