"""Meters: per-phase time and peak memory, host RSS, and the NVML sampler thread.

Peak memory by phase (DESIGN.md): the allocator's peak is reset at the start of forward, backward and optimizer
step, and read at each end. The caching allocator keeps its counters on the host as kernels are enqueued, so the
reads are exact without a device synchronize; time comes from CUDA events, read one step late (the GPU keeps
working while the host waits on the previous step's last event), so the meters add no bubble to the stream.
On CPU the same phases are timed with perf_counter, and memory is the process's peak RSS (host memory), counted from
the start of training (reset_host_peak), not from the process's start.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

PHASES = ("fwd", "bwd", "opt")


def host_peak_rss_bytes() -> int:
    """The process's peak resident memory since the last reset_host_peak (else since it started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_host_peak() -> bool:
    """Start the host peak afresh from the memory held now, freed heap returned to the OS first, so that what
    happened before (data preparation) does not count. Linux only (/proc/self/clear_refs); False where it cannot."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap resident until asked
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # "5": reset the peak RSS (VmHWM) to the current RSS (proc(5))
        return True
    except OSError:
        return False


def host_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None


@dataclass
class StepRecord:
    """What one optimizer step measured. Times in ms; memory in bytes (None where it does not apply)."""

    step: int
    fwd_ms: float | None = 0.0  # None when the meters are off
    bwd_ms: float | None = 0.0
    opt_ms: float | None = 0.0
    step_ms: float = 0.0
    peak: dict[str, int | None] = field(default_factory=lambda: {p: None for p in PHASES})
    peak_reserved: int | None = None
    loss: Any = None  # a tensor (a host copy on CUDA) until the step is read back, then a float
    grad_norm: Any = None


def allocator_peaks() -> tuple[int, int]:
    """The caching allocator's peak allocated and peak reserved bytes since the last reset, in one read.

    torch.cuda.max_memory_allocated() and max_memory_reserved() each flatten the allocator's whole stats tree into a
    sorted dict: 6 such calls a step took 3.3 ms of the host's step under cProfile on the H100
    (bench/host_profile.py). The nested dict holds the same figures."""
    stats = torch.cuda.memory_stats_as_nested_dict()
    return stats["allocated_bytes"]["all"]["peak"], stats["reserved_bytes"]["all"]["peak"]


def host_copy(value: Any) -> Any:
    """A device tensor's copy into pinned host memory, queued on the stream now; it has landed once anything recorded
    after it has completed. Reading the device tensor itself a step late (.item()) would queue the read behind the
    next step and wait for that step too: the host's work between steps would then leave the GPU idle."""
    if isinstance(value, torch.Tensor) and value.device.type == "cuda":
        return value.detach().to("cpu", non_blocking=True)  # detached: the copy holds no autograd graph
    return value


class PhaseMeter:
    """Marks phase boundaries within a step; `finish_step` returns the record of the step before (lagged)."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self._marks: list[tuple[str, Any]] = []
        self._record: StepRecord | None = None
        self._pending: tuple[StepRecord, list[tuple[str, Any]]] | None = None

    def _mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start_step(self, step: int) -> None:
        self._record = StepRecord(step)
        self._marks = [("start", self._mark())]

    def begin(self, phase: str) -> None:
        if not self.enabled:  # meters off: only the step's own start and end are timed
            return
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self._marks.append((f"{phase}<", self._mark()))

    def end(self, phase: str) -> None:
        if not self.enabled:
            return
        self._marks.append((f"{phase}>", self._mark()))
        rec = self._record
        if self.cuda and rec is not None:
            alloc, reserved = allocator_peaks()
            rec.peak[phase] = max(rec.peak[phase] or 0, alloc)
            rec.peak_reserved = max(rec.peak_reserved or 0, reserved)

    def replayed(self, peaks: dict[str, int]) -> None:
        """A step replayed from a CUDA graph (memlab.core.techniques.cuda_graph): a replay allocates nothing, so its
        phase peaks are the ones measured while the graph was captured; it has no phase marks, so no phase times."""
        rec = self._record
        if not (self.enabled and self.cuda) or rec is None:
            return
        rec.peak.update(peaks)
        rec.peak_reserved = allocator_peaks()[1]  # the graph's pool included: reserved since the capture

    def finish_step(self, loss: Any, grad_norm: Any = None) -> StepRecord | None:
        """Close this step; return the previous step's completed record (None on the first call)."""
        assert self._record is not None
        self._record.loss, self._record.grad_norm = host_copy(loss), host_copy(grad_norm)  # queued before the end mark
        self._marks.append(("end", self._mark()))
        previous, self._pending = self._pending, (self._record, self._marks)
        return self._resolve(previous) if previous else None

    def flush(self) -> StepRecord | None:
        """The last step's record (at the end of training, or before an eval)."""
        previous, self._pending = self._pending, None
        return self._resolve(previous) if previous else None

    def _elapsed(self, a: Any, b: Any) -> float:
        if self.cuda:
            return a.elapsed_time(b)
        return (b - a) * 1000.0

    def _resolve(self, pending: tuple[StepRecord, list[tuple[str, Any]]]) -> StepRecord:
        rec, marks = pending
        if self.cuda:
            marks[-1][1].synchronize()  # waits for that step only; the next one is already queued behind it
        totals = dict.fromkeys(PHASES, 0.0)
        opened: dict[str, Any] = {}
        for name, mark in marks[1:-1]:
            phase, edge = name[:-1], name[-1]
            if edge == "<":
                opened[phase] = mark
            else:
                totals[phase] += self._elapsed(opened.pop(phase), mark)
        if self.enabled and len(marks) > 2:  # a replayed graph's step has its start and end only
            rec.fwd_ms, rec.bwd_ms, rec.opt_ms = totals["fwd"], totals["bwd"], totals["opt"]
        else:
            rec.fwd_ms = rec.bwd_ms = rec.opt_ms = None
        rec.step_ms = self._elapsed(marks[0][1], marks[-1][1])
        return rec


class WallClock:
    """Each step's wall time, from the end of the step before (or a restart) to the end of this one: what the host
    did between steps (the loader, logging, publishing) included. On CUDA each mark is taken once the device has
    finished the step before (PhaseMeter reads one step late), so the sum over many steps is the device's pace plus
    the host's gaps."""

    def __init__(self) -> None:
        self.laps: dict[int, float] = {}  # step -> seconds
        self._mark = time.perf_counter()

    def restart(self) -> None:
        """After work that is not training (an eval): the next step's lap starts here."""
        self._mark = time.perf_counter()

    def lap(self, step: int) -> None:
        now = time.perf_counter()
        self.laps[step], self._mark = now - self._mark, now


class NvmlSampler:
    """Samples device-wide memory, this process's memory (NVML's per-process figure: what a card of its own would
    have to hold), utilization and power every ~50 ms in a thread (includes the CUDA context).

    Degrades cleanly: without nvidia-ml-py or an NVIDIA driver, `available` is False and nothing is sampled.
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.05, on_sample: Callable[[dict], None] | None = None):
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.samples: list[dict[str, float]] = []
        self.peak_used_bytes: int | None = None
        self.peak_process_bytes: int | None = None  # None: NVML never listed this process (a container's PIDs)
        self.available = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.time()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self.available = True
        except Exception as e:  # noqa: BLE001 (ImportError, NVMLError_LibraryNotFound, driver mismatch...)
            self.reason = f"{e.__class__.__name__}: {e}".strip()

    def _sample(self) -> dict[str, float] | None:
        nv = self._nvml
        try:
            used = nv.nvmlDeviceGetMemoryInfo(self._handle).used
            util = nv.nvmlDeviceGetUtilizationRates(self._handle).gpu
            try:
                power = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            except nv.NVMLError:
                power = None
        except Exception:  # noqa: BLE001 (a sample lost is not worth a crashed run)
            return None
        return {"t": time.time() - self._t0, "used_bytes": int(used), "process_bytes": nvml_process_used(self._handle),
                "util_pct": float(util), "power_w": power}

    def _record(self, s: dict) -> None:
        self.samples.append(s)
        self.peak_used_bytes = max(self.peak_used_bytes or 0, s["used_bytes"])
        if s["process_bytes"] is not None:
            self.peak_process_bytes = max(self.peak_process_bytes or 0, s["process_bytes"])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            s = self._sample()
            if s is None:
                continue
            self._record(s)
            if self.on_sample:
                try:
                    self.on_sample(s)
                except Exception:  # noqa: BLE001
                    pass

    def start(self) -> NvmlSampler:
        if self.available:
            self._t0 = time.time()
            self._thread = threading.Thread(target=self._loop, name="memlab-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def nvml_process_used(handle: Any) -> int | None:
    """This process's GPU memory by NVML's per-process list; None where NVML does not list it (a container's own
    PIDs, a driver that lists no processes) or there is no handle."""
    if handle is None:
        return None
    try:
        import pynvml

        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 (no NVML, or not every driver lists processes)
        pass
    return None


def nvml_index(device: torch.device) -> int:
    """NVML's index of a CUDA device (they differ under CUDA_VISIBLE_DEVICES)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    try:
        return torch.cuda._get_nvml_device_index(idx)  # private, but it knows CUDA_VISIBLE_DEVICES
    except Exception:  # noqa: BLE001
        return idx
