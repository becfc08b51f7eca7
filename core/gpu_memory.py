"""A GPU's memory as a run sees it: the emulated card under --gpu-memory's cap (MEMLAB_GPU_MEMORY_BYTES, set by
find-batch, the study and `memlab run` children), what a process holds outside the caching allocator (NVML), the
driver's reserve, and the device's name and size. Used by the memory-cap technique, find-batch and the predictor."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

from memlab.core.errors import DeviceError
from memlab.core.units import gib, parse_size
from memlab.core.meters import nvml_index
from memlab.core.meters import nvml_process_used

MEMORY_ENV = "MEMLAB_GPU_MEMORY_BYTES"
# Set when other processes share the card (study --lanes): only NVML's per-process figure can tell this
# process's use apart, so the device-wide fallback (its growth across this context's creation) is refused.
PER_PROCESS_ENV = "MEMLAB_NVML_PER_PROCESS"

# ---------------------------------------------------------------------------------------------- the child's cap


def memory_cap_request(device: Any) -> tuple[int, int] | None:
    """MEMLAB_GPU_MEMORY_BYTES checked against this device: (cap in bytes, GPU index), None when unset. Raises a
    one-line DeviceError for a cap on the CPU or above what the GPU has (technique check, before any work)."""
    raw = os.environ.get(MEMORY_ENV)
    if not raw:
        return None
    cap = parse_size(raw, MEMORY_ENV)
    if getattr(device, "type", str(device)) != "cuda":
        raise DeviceError(f"{MEMORY_ENV}={raw} caps GPU memory and needs CUDA; unset it to run on {device}")
    import torch

    # set_per_process_memory_fraction refuses a bare "cuda": it wants the index (seen on the H100, torch 2.11)
    index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if cap > props.total_memory:
        raise DeviceError(f"{MEMORY_ENV}={raw} ({gib(cap)}) is more than this GPU has ({props.name}: {gib(props.total_memory)})")
    return cap, index


@dataclass(frozen=True)
class MemoryCap:
    """An emulated card: its total (--gpu-memory), and what the caching allocator may hold of it."""

    card_bytes: int  # the emulated card's total memory
    budget_bytes: int  # the allocator's cap: the card less the driver's reserve and what this process holds outside the allocator
    outside_bytes: int | None  # CUDA context, cuBLAS workspace...: measured through NVML (None: NVML could not tell)
    index: int = 0  # the GPU
    device_before: int | None = None  # NVML's device use before this process's context (the fallback's baseline)
    driver_bytes: int = 0  # the driver's own reserve on this GPU (NVML v2 `reserved`), which a real card also loses


class OverTheCard(Exception):
    """The process already holds more than the emulated card (allocator reserve plus what is outside it)."""


def outside_allocator(nvml_used_bytes: int | None, reserved_bytes: int) -> int | None:
    """What this process holds beyond the allocator's reserve (CUDA context, library handles, workspaces); None
    when NVML could not tell."""
    return max(0, nvml_used_bytes - reserved_bytes) if nvml_used_bytes is not None else None


def tightened_budget(cap: MemoryCap, nvml_used_bytes: int | None, reserved_bytes: int) -> int:
    """The allocator's budget after the CUDA context grew: kernels load lazily, and cuDNN / cuBLAS handles and
    workspaces arrive with the first steps (on the H100, 0.66 GiB outside the allocator after one matmul, 1.2 GiB
    once a step had run). Never looser than before; raises OverTheCard when what is already reserved, plus what
    is outside the allocator, no longer fits the card."""
    outside = outside_allocator(nvml_used_bytes, reserved_bytes)
    if outside is None:
        return cap.budget_bytes
    budget = min(cap.budget_bytes, cap.card_bytes - cap.driver_bytes - outside)
    if reserved_bytes > budget:
        raise OverTheCard(f"this process holds {gib(reserved_bytes + outside)} ({gib(reserved_bytes)} reserved by the allocator, "
                          f"{gib(outside)} outside it): more than the {gib(cap.card_bytes)} card")
    return budget


def allocator_budget(card_bytes: int, nvml_used_bytes: int | None, reserved_bytes: int, driver_bytes: int = 0) -> int:
    """What the caching allocator may reserve so that this process fits a card of `card_bytes` in total: the card
    less the driver's own reserve (which a real card loses too; on the H100 0.47 GiB, measured with no process on
    it) and less what NVML sees this process hold beyond the allocator's reserved memory (the CUDA context,
    library handles and workspaces). NVML unable to tell (None): nothing outside. Raises when nothing is left."""
    outside = (outside_allocator(nvml_used_bytes, reserved_bytes) or 0) + driver_bytes
    if card_bytes <= outside:
        raise DeviceError(f"a card of {gib(card_bytes)} is less than what this process holds outside the allocator with "
                          f"the driver's reserve ({gib(outside)}: the CUDA context, workspaces and the driver, measured through NVML); give more")
    return card_bytes - outside


def apply_memory_cap(device: Any) -> MemoryCap | None:
    """In the process that trains: cap the caching allocator so that the whole process fits a card of
    MEMLAB_GPU_MEMORY_BYTES, before the model or anything else allocates. None when unset."""
    request = memory_cap_request(device)
    if request is None:
        return None
    import torch

    card, index = request
    used, reserved, before = _used_outside_allocator(index)
    driver = driver_reserved(_nvml_handle(_nvml_index(index)))
    budget = allocator_budget(card, used, reserved, driver)
    torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(index).total_memory, index)
    return MemoryCap(card, budget, outside_allocator(used, reserved), index, before, driver)


def tighten_memory_cap(cap: MemoryCap) -> MemoryCap:
    """After a training step, in the process that trains: measure again what is outside the allocator and lower the
    allocator's cap to match (a torch.OutOfMemoryError, as the allocator's own, when the card is already exceeded)."""
    import torch

    used = _process_used(_nvml_handle(_nvml_index(cap.index)), cap.device_before)
    reserved = torch.cuda.memory_reserved(cap.index)
    try:
        budget = tightened_budget(cap, used, reserved)
    except OverTheCard as e:
        raise torch.OutOfMemoryError(f"out of memory on the emulated card: {e}") from None
    if budget < cap.budget_bytes:
        total = torch.cuda.get_device_properties(cap.index).total_memory
        torch.cuda.set_per_process_memory_fraction(budget / total, cap.index)
        cap = dataclasses.replace(cap, budget_bytes=budget, outside_bytes=outside_allocator(used, reserved))
    return cap


def _nvml_index(index: int) -> int:
    import torch


    return nvml_index(torch.device("cuda", index))


def _process_used(nvml: Any, before: int | None) -> int | None:
    """NVML's figure for this process; else the device's growth since `before` (its use before this process's
    context), through process_use."""

    def growth() -> int | None:
        now = _nvml_device_used(nvml)
        return now - before if now is not None and before is not None else None

    return process_use(nvml_process_used(nvml), growth)


MEASURE_SIDE = 256  # _used_outside_allocator's fp32 square matrix (allocation_trace replays what it allocates)


def _used_outside_allocator(index: int) -> tuple[int | None, int, int | None]:
    """(what NVML sees this process use, the allocator's reserved bytes, the device's use before this process's
    context), after CUDA's initialization and a first cuBLAS call (its handle and workspace). NVML's per-process
    figure; where it does not list this process (a container's own PIDs), the device's growth across this
    process's context creation; None when neither."""
    import torch

    dev = torch.device("cuda", index)
    nvml = _nvml_handle(_nvml_index(index))
    fresh = not torch._C._cuda_hasPrimaryContext(index)  # no context yet: the device's growth is this process's
    before = _nvml_device_used(nvml) if fresh else None
    a = torch.ones(MEASURE_SIDE, MEASURE_SIDE, device=dev)
    (a @ a).sum().item()  # creates the context, the cuBLAS handle and its workspace
    del a
    torch.cuda.synchronize(dev)
    reserved = torch.cuda.memory_reserved(dev)
    return _process_used(nvml, before), reserved, before


def process_use(per_process: int | None, device_growth: Callable[[], int | None]) -> int | None:
    """This process's GPU memory: NVML's per-process figure; else the device's growth across this process's context
    creation, unless other processes share the card (then refused in one line, not guessed)."""
    if per_process is not None:
        return per_process
    if os.environ.get(PER_PROCESS_ENV):
        raise DeviceError("NVML does not list this process's memory (a container's PIDs?), and other processes share "
                          "the card (study --lanes), so its use outside the allocator cannot be measured; run without --lanes")
    return device_growth()


def _nvml_handle(nvml_idx: int) -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(nvml_idx)
    except Exception:  # noqa: BLE001 (no NVML: the cap stays the whole card)
        return None


def driver_reserved(handle: Any) -> int:
    """The driver's own reserve on this GPU (NVML's v2 memory info, `reserved`: held by no process, counted in the
    device's v1 `used`); 0 where NVML or its v2 call is not there."""
    if handle is None:
        return 0
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved)
    except Exception:  # noqa: BLE001 (an older NVML or binding: no v2 memory info)
        return 0


def _nvml_device_used(handle: Any) -> int | None:
    if handle is None:
        return None
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001
        return None


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int


def gpu_info(index: int = 0) -> GpuInfo | None:
    """Name and memory of the CUDA device `index` WITHOUT creating a CUDA context in this process (a context here
    would take memory from the probes on the same card): NVML, else a short-lived child process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            import torch

            nvml_idx = torch.cuda._get_nvml_device_index(index)
        except Exception:  # noqa: BLE001
            nvml_idx = index
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_idx)
        name = pynvml.nvmlDeviceGetName(h)
        return GpuInfo(name if isinstance(name, str) else name.decode(), int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
    except Exception:  # noqa: BLE001 (no NVML: ask a child)
        pass
    code = f"import json, torch; p = torch.cuda.get_device_properties({index}); print(json.dumps([p.name, p.total_memory]))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        name, total = json.loads(out.stdout.strip().splitlines()[-1])
        return GpuInfo(name, int(total))
    except Exception:  # noqa: BLE001
        return None


