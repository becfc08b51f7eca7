"""Events and sinks. The engine emits plain dicts to a sink; sinks share one tiny interface.

Each event kind is declared once below as a TypedDict: its fields, their types, and which may be absent
(NotRequired). `make_event` checks the required ones, so a reader can index them (`ev["step"]`) without guessing.
Every event carries "event" (its kind) and "t" (unix seconds; a gpu_sample's "t" is seconds since the run started).
A failed event's reason is one of FAIL_REASONS.
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired[...] evaluated to leave it out of
# __required_keys__.
import json
import math
import sys
import threading
import time
from typing import IO, Any, Callable, NotRequired, Protocol, TypedDict

FAIL_REASONS = ("oom", "nan", "interrupted", "error")


class Event(TypedDict):
    event: str
    t: float


class StartedEvent(Event):
    """The run is built and about to take its first step: who, what, where."""

    run_id: str | None
    run_dir: str | None
    started_at: str  # UTC ISO-8601
    device: str  # cuda | cpu
    profile: dict[str, Any]  # the resolved profile (config.to_dict)
    experiment: dict[str, Any]  # the resolved experiment
    experiment_id: str
    changes: list[str]  # what the profile changes, in words
    environment: dict[str, Any]  # memlab.core.environment
    params: int
    vocab_size: int
    total_steps: int
    micro_batch: int  # per rank
    grad_accum: int
    world_size: int
    distributed: str
    tokens_per_step: int
    data: dict[str, Any]  # source, tokenizer, train_tokens, val_tokens, cache_hit
    attention_kernel: str  # the kernel that actually runs, e.g. sdpa:cudnn
    nvml: bool


class StepEvent(Event):
    """One optimizer step, as measured (a row of steps.parquet: memlab.core.schema.STEP_SCHEMA)."""

    step: int  # 0-based
    total_steps: int
    loss: float | None  # mean over ranks; None when not finite
    lr: float
    grad_norm: float | None
    step_ms: float
    fwd_ms: float | None
    bwd_ms: float | None
    opt_ms: float | None
    tokens: int
    tokens_per_s: float | None
    peak_alloc_fwd_bytes: int | None
    peak_alloc_bwd_bytes: int | None
    peak_alloc_opt_bytes: int | None
    peak_reserved_bytes: int | None
    host_rss_bytes: int | None
    measured: bool  # False for warm-up steps


class EvalEvent(Event):
    step: int  # steps completed when evaluated
    val_loss: float
    val_ppl: float


class GpuSampleEvent(Event):
    """One NVML sample (a row of gpu.parquet); its "t" is seconds since the run started."""

    used_bytes: int
    process_bytes: NotRequired[int | None]  # this process's (NVML per-process), where NVML lists it
    util_pct: float
    power_w: float | None


class FinishedEvent(Event):
    summary: dict[str, Any]  # memlab.core.metrics: one value per summary metric
    ranks: NotRequired[list[dict[str, Any]]]  # distributed runs: each rank's own row (schema.RANK_SCHEMA)


class FailedEvent(Event):
    reason: str  # FAIL_REASONS
    message: str
    step: int  # steps completed
    summary: dict[str, Any]
    ranks: NotRequired[list[dict[str, Any]]]


EVENT_TYPES: dict[str, type] = {
    "started": StartedEvent,
    "step": StepEvent,
    "eval": EvalEvent,
    "gpu_sample": GpuSampleEvent,
    "finished": FinishedEvent,
    "failed": FailedEvent,
}
EVENT_KINDS = tuple(EVENT_TYPES)
# Fields a caller of make_event must give ("event" and "t" it adds itself), and every declared field, by kind.
REQUIRED: dict[str, frozenset[str]] = {k: frozenset(td.__required_keys__) - {"event", "t"} for k, td in EVENT_TYPES.items()}
FIELDS: dict[str, frozenset[str]] = {k: frozenset(td.__required_keys__ | td.__optional_keys__) for k, td in EVENT_TYPES.items()}


class Sink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    """An event of `kind` stamped with the time; ValueError when the kind is unknown or a required field is missing
    (a set difference: cheap enough for every step and NVML sample). Undeclared extra fields pass through."""
    required = REQUIRED.get(kind)
    if required is None:
        raise ValueError(f"unknown event kind {kind!r}; one of: {', '.join(EVENT_KINDS)}")
    missing = required - fields.keys()
    if missing:
        raise ValueError(f"{kind} event without {', '.join(sorted(missing))}")
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

    def __init__(self, stream: IO[str] | None = None, path: str | None = None, on_reader_gone: Callable[[], None] | None = None):
        self._own = stream is None
        self._stream = stream if stream is not None else open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()  # the NVML sampler thread emits too
        # a pipe whose reader died (the supervisor): drop what follows and call this once, instead of failing the run
        self.on_reader_gone = on_reader_gone
        self.reader_gone = False

    def emit(self, event: dict[str, Any]) -> None:
        line = dumps(event) + "\n"
        with self._lock:
            if self.reader_gone:
                return
            try:
                self._stream.write(line)
                self._stream.flush()
            except BrokenPipeError:
                if self.on_reader_gone is None:
                    raise
                self.reader_gone = True
        if self.reader_gone:
            self.on_reader_gone()

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
