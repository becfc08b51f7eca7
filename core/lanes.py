"""Lanes: one queue drained over the host's GPUs, one child at a time on each, pinned with CUDA_VISIBLE_DEVICES.

Each run is already its own process with its own CUDA context, so runs on different GPUs do not share an
allocator and their memory figures stay their own. `memlab sweep`, `memlab study`, `memlab find-batch --profiles`
(and `memlab fit --measure`) take `--gpus 0,1,2,3`:

    lanes = plan_lanes("0,1", device_type="cuda", nproc=None)     # [Lane(gpu 0), Lane(gpu 1)]; MemlabError on bad input
    outcomes = LaneQueue(lanes, on_result=...).run(items)          # (key, ChildSpec) pairs, claimed by whichever lane is free
    map_on_lanes(search, names, lanes)                             # in-process work that starts pinned children itself

A lane is one GPU, or N GPUs for a torchrun run (`--nproc N`: the GPUs are grouped in consecutive runs of N); on a
CPU-only host (or `--device cpu`) there is one CPU lane with nothing pinned. A lane whose GPU fails (the child's
error names a GPU fault, or NVML says the GPU is lost) is taken out: its run is recorded as `crashed`, the other
lanes go on, and when every lane is out the items left are `skipped`. `stop()` stops every lane (each child keeps
its folder as `interrupted`) and skips what is left.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from memlab.core.errors import ConfigError
from memlab.core.queue import SKIPPED, ChildQueue, QueueOutcome
from memlab.core.runstore import mark_status
from memlab.core.supervisor import ChildResult, ChildSpec

VISIBLE = "CUDA_VISIBLE_DEVICES"
# Tests (and a dry run on a laptop) fake how many GPUs this host has; children still see no GPU.
FAKE_COUNT_ENV = "MEMLAB_FAKE_GPU_COUNT"
# What a child's error says when its GPU, not its run, failed (lower case; matched anywhere in its last lines).
GPU_FAULT_SIGNS = (
    "uncorrectable ecc", "ecc error", "gpu is lost", "fallen off the bus", "cuda error: unknown error",
    "busy or unavailable", "no cuda-capable device", "nvml_error_gpu_is_lost", "xid ",
)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Lane:
    """One slot of the queue: the GPUs (as --gpus numbers them, and as CUDA_VISIBLE_DEVICES entries) it owns."""

    indices: tuple[int, ...] = ()  # () = the CPU lane
    ids: tuple[str, ...] = ()  # what the child's CUDA_VISIBLE_DEVICES holds (this host's own entries, or numbers)

    @property
    def name(self) -> str:
        if not self.indices:
            return "cpu"
        return f"gpu {self.indices[0]}" if len(self.indices) == 1 else "gpus " + ",".join(map(str, self.indices))

    @property
    def env(self) -> dict[str, str]:
        return {VISIBLE: ",".join(self.ids)} if self.ids else {}

    def pin(self, spec: ChildSpec) -> ChildSpec:
        """The spec with this lane's GPUs in its environment (a copy: the caller's stays as it was)."""
        return replace(spec, env={**spec.env, **self.env})


CPU_LANE = Lane()


# ---------------------------------------------------------------------------------------------- which lanes


def visible_gpu_ids() -> list[str]:
    """This process's visible GPUs as CUDA_VISIBLE_DEVICES entries, in CUDA's order (index i is --gpus i)."""
    fake = os.environ.get(FAKE_COUNT_ENV)
    count = int(fake) if fake and fake.isdigit() else _cuda_count()
    given = [e.strip() for e in os.environ.get(VISIBLE, "").split(",") if e.strip()]
    if os.environ.get(VISIBLE) is not None and not fake:
        return given[:count]
    return [str(i) for i in range(count)]


def _cuda_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 (no usable CUDA: no GPU lanes)
        return 0


def parse_gpus(text: str, visible: int) -> list[int]:
    """--gpus 0,2 -> [0, 2]; every index visible, none twice, else a one-line ConfigError."""
    valid = f"visible: {','.join(map(str, range(visible)))}" if visible else "this host has no visible GPU; leave --gpus out to run on the CPU"
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(parts):
        raise ConfigError(f"--gpus {text!r}: give comma-separated GPU indices, e.g. --gpus 0,1 ({valid})")
    bad = [p for p in parts if not p.isdigit()]
    if bad:
        raise ConfigError(f"--gpus {text}: {bad[0]!r} is not a GPU index ({valid})")
    indices = [int(p) for p in parts]
    missing = [i for i in indices if i >= visible]
    if missing:
        raise ConfigError(f"--gpus {text}: GPU {missing[0]} is not visible ({valid})")
    twice = next((i for n, i in enumerate(indices) if i in indices[:n]), None)
    if twice is not None:
        raise ConfigError(f"--gpus {text}: GPU {twice} is listed twice; give each GPU once")
    return indices


def plan_lanes(gpus: str | None, device_type: str, nproc: int | None = None) -> list[Lane]:
    """The lanes for --gpus (None: every visible GPU) on this device: one per GPU, or one per `nproc` GPUs for
    torchrun runs; one CPU lane on a CPU. Every refusal is a one-line ConfigError, before any work."""
    ids = visible_gpu_ids()
    indices = parse_gpus(gpus, len(ids)) if gpus is not None else list(range(len(ids)))
    ranks = nproc or 1
    if indices and ranks > len(indices) and (gpus is not None or device_type == "cuda"):
        raise ConfigError(f"--nproc {ranks} needs {ranks} GPUs a run but --gpus gives {len(indices)} "
                          f"({','.join(map(str, indices))}); give more GPUs or fewer ranks")
    if device_type != "cuda" or not indices:
        if gpus is not None and device_type != "cuda":
            raise ConfigError(f"--gpus {gpus} picks GPUs for CUDA runs; with --device {device_type} leave it out")
        return [CPU_LANE]
    groups = [indices[i:i + ranks] for i in range(0, len(indices) - ranks + 1, ranks)]
    return [Lane(tuple(g), tuple(ids[i] for i in g)) for g in groups]


def idle_gpus(lanes: Sequence[Lane], gpus: str | None) -> list[int]:
    """GPUs --gpus gave that no lane uses (the remainder when --nproc does not divide them)."""
    used = {i for lane in lanes for i in lane.indices}
    given = parse_gpus(gpus, len(visible_gpu_ids())) if gpus is not None else range(len(visible_gpu_ids()))
    return [i for i in given if i not in used]


# ---------------------------------------------------------------------------------------------- GPU faults


def gpu_fault(lane: Lane, result: ChildResult) -> str | None:
    """Why `lane`'s GPU (not the run) failed, or None: the child's error names a GPU fault, or NVML says so."""
    if not lane.ids or result.status not in ("crashed", "error"):
        return None
    return names_gpu_fault(f"{result.stderr_tail}\n{result.message}") or nvml_fault(lane)


def names_gpu_fault(text: str) -> str | None:
    """The last line of `text` that names a GPU fault (GPU_FAULT_SIGNS), or None."""
    for line in reversed(text.splitlines()):
        if any(sign in line.lower() for sign in GPU_FAULT_SIGNS):
            return line.strip().removeprefix("memlab: error: ")
    return None


def nvml_fault(lane: Lane) -> str | None:
    """NVML's word on the lane's GPUs: 'GPU is lost' and the like; None when they answer (or NVML is absent)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 (no NVML: nothing to ask)
        return None
    for gpu in lane.ids:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(gpu)
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as e:
            return f"NVML: {e}"
    return None


# ---------------------------------------------------------------------------------------------- the queue


class LaneQueue:
    """Drains (key, ChildSpec) items over `lanes`, one thread and one child per lane, every item claimed by the
    next lane that is free, in order. Every item gets one QueueOutcome (its `lane` set); `stop()` may come from any
    thread (a signal handler). Callbacks: on_start(key, spec, lane), on_event(key, event), on_result(outcome)."""

    def __init__(self, lanes: Sequence[Lane], on_start: Callable[[Any, ChildSpec, Lane], None] | None = None,
                 on_event: Callable[[Any, dict], None] | None = None, on_result: Callable[[QueueOutcome], None] | None = None,
                 grace_s: float = 20.0, fault: Callable[[Lane, ChildResult], str | None] = gpu_fault):
        if not lanes:
            raise ConfigError("no lanes to run on")
        self.lanes, self.grace_s, self.fault = list(lanes), grace_s, fault
        self.on_start, self.on_event, self.on_result = on_start, on_event, on_result
        self.stopping = False
        self.out: dict[Lane, str] = {}  # lanes taken out, and why
        self.busy: dict[Lane, Any] = {}  # the key each lane runs now
        self._queues: dict[Lane, ChildQueue] = {}
        self._lock = threading.RLock()  # claims, outcomes, stop (reentrant: a signal handler may come mid-claim)
        self._outcomes: list[QueueOutcome] = []

    def run(self, items: Iterable[tuple[Any, ChildSpec]]) -> list[QueueOutcome]:
        source = iter(items)
        threads = [threading.Thread(target=self._drain, args=(lane, source), name=f"lane {lane.name}", daemon=True)
                   for lane in self.lanes]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)  # short waits: the main thread stays free for a Ctrl-C handler
        self._skip_rest(source)
        return list(self._outcomes)

    def stop(self, grace_s: float | None = None) -> None:
        """Start nothing more on any lane and ask every running child to stop (it keeps its folder)."""
        with self._lock:
            self.stopping = True
            queues = list(self._queues.values())
        for q in queues:
            q.stop(grace_s)

    def _drain(self, lane: Lane, source: Iterator[tuple[Any, ChildSpec]]) -> None:
        queue = ChildQueue(on_start=lambda key, spec: self._started(lane, key, spec), on_event=self.on_event,
                           on_result=lambda outcome: self._ended(lane, outcome), grace_s=self.grace_s)
        with self._lock:
            self._queues[lane] = queue
            if self.stopping:
                queue.stop()
        queue.run(self._claims(lane, source))

    def _claims(self, lane: Lane, source: Iterator[tuple[Any, ChildSpec]]) -> Iterator[tuple[Any, ChildSpec]]:
        while True:
            with self._lock:
                if self.stopping or lane in self.out:
                    return
                try:
                    key, spec = next(source)
                except StopIteration:
                    return
                self.busy[lane] = key
            yield key, lane.pin(spec)

    def _started(self, lane: Lane, key: Any, spec: ChildSpec) -> None:
        if self.on_start is not None:
            self.on_start(key, spec, lane)

    def _ended(self, lane: Lane, outcome: QueueOutcome) -> None:
        outcome.lane = lane
        why = self._fault(lane, outcome.result) if outcome.status != SKIPPED else None
        if why:
            self._take_out(lane, outcome, why)
        with self._lock:
            self.busy.pop(lane, None)
            self._outcomes.append(outcome)
        if self.on_result is not None:
            self.on_result(outcome)  # a raise is noted on the outcome by the lane's ChildQueue

    def _fault(self, lane: Lane, result: ChildResult) -> str | None:
        try:
            return self.fault(lane, result)
        except Exception:  # noqa: BLE001 (asking NVML went wrong: the lane stays in, the outcome is kept)
            return None

    def _take_out(self, lane: Lane, outcome: QueueOutcome, why: str) -> None:
        """The lane's GPU failed: its run is `crashed` (folder too), the lane runs nothing more."""
        left = len(self.lanes) - len(self.out) - 1
        message = f"{lane.name} failed: {why}; the lane is taken out ({left} lane(s) go on)"
        with self._lock:
            self.out[lane] = why
        result = outcome.result
        outcome.result = replace(result, status="crashed", message=message)
        if result.run_dir:
            mark_status(Path(result.run_dir), "crashed", message, replace=True)

    def _skip_rest(self, source: Iterator[tuple[Any, ChildSpec]]) -> None:
        """Items no lane took (stopped, or every lane out): each gets its `skipped` outcome."""
        why = "not run: the queue was stopped first" if self.stopping else "not run: every lane's GPU failed"
        for key, spec in source:
            outcome = QueueOutcome(key, spec, ChildResult(SKIPPED, why))
            self._outcomes.append(outcome)
            if self.on_result is not None:
                try:
                    self.on_result(outcome)
                except Exception as e:  # noqa: BLE001 (a display bug must not lose the other outcomes)
                    outcome.notes.append(f"on_result raised {e.__class__.__name__}: {e}")


# ---------------------------------------------------------------------------------------------- in-process work


def map_on_lanes(work: Callable[[T, Lane], R], items: Sequence[T], lanes: Sequence[Lane],
                 stopping: Callable[[], bool] = lambda: False, out: set[Lane] | None = None) -> list[R | None]:
    """`work(item, lane)` for every item, one at a time on each lane, the next item to whichever lane is free; in
    the item's order. For work that starts its own children (a max-batch search: one child per probe): pass
    `lane.env` to them. A lane `work` puts in `out` (its GPU failed) takes nothing more. An item not started
    (`stopping()` became true, or every lane is out) gets None."""
    results: list[R | None] = [None] * len(items)
    lock = threading.Lock()
    order = iter(range(len(items)))

    def take(lane: Lane) -> int | None:
        with lock:
            return next(order, None)

    def do(i: int, lane: Lane) -> None:
        results[i] = work(items[i], lane)

    drain_on_lanes(take, do, lanes, stopping, out)
    return results


def drain_on_lanes(take: Callable[[Lane], T | None], work: Callable[[T, Lane], Any], lanes: Sequence[Lane],
                   stopping: Callable[[], bool] = lambda: False, out: set[Lane] | None = None) -> None:
    """Each lane, in a thread of its own, does `work(take(lane), lane)` until `take` gives None (it may wait for
    an item to become ready), `stopping()`, or the lane is in `out`. What `work` raised is raised again here, once
    every lane has ended; the other lanes take nothing more after it."""
    out = set() if out is None else out
    errors: list[BaseException] = []

    def drain(lane: Lane) -> None:
        while not stopping() and not errors and lane not in out:
            item = take(lane)
            if item is None:
                return
            try:
                work(item, lane)
            except BaseException as e:  # noqa: BLE001 (raised again in the caller's thread, once every lane ends)
                errors.append(e)

    threads = [threading.Thread(target=drain, args=(lane,), name=f"lane {lane.name}", daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.2)  # short waits: the main thread stays free for a Ctrl-C handler
    if errors:
        raise errors[0]
