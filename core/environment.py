"""What memlab sees: GPU, driver, torch, CUDA, cuDNN, flash-attn, NVML, git sha. Recorded in every run.json."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that ask it: a command refuses a mistyped --device, and lists what it
# lists, without the second or two that importing torch costs.


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    """The commit of memlab's own source tree, when it is a git checkout (editable installs), with "+dirty" when
    its tracked files differ from that commit (a copy of a working tree, e.g. on a remote GPU machine, names a
    commit its code is not)."""
    here = Path(__file__).resolve().parent
    sha = _git(here, "rev-parse", "--short=12", "HEAD")
    if not sha:
        return None
    changes = _git(here, "status", "--porcelain", "--untracked-files=no")
    return sha + ("+dirty" if changes else "") if changes is not None else sha


def _git(cwd: Path, *args: str) -> str | None:
    """git's output (stripped), or None when git is missing, fails or times out."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def nvml_info() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
        return {"nvml": True, "driver": driver if isinstance(driver, str) else driver.decode(), "nvml_devices": count}
    except Exception as e:  # noqa: BLE001
        return {"nvml": False, "nvml_reason": f"{e.__class__.__name__}: {e}".strip()}


def check_device_name(name: str) -> None:
    """Refuse a --device that is none of auto, cpu, cuda[:N] (the name alone: whether CUDA is here is torch's)."""
    from memlab.core.errors import DeviceError

    if name not in ("auto", "cpu") and not name.startswith("cuda"):
        raise DeviceError(f"--device {name!r} is not valid; choose one of: auto, cuda, cpu")


def device_type(name: str) -> str:
    """"cpu" or "cuda" for a --device; a supervisor (sweep, study) needs no more, and for cpu no torch to know it."""
    check_device_name(name)
    return "cpu" if name == "cpu" else resolve_device(name).type


def resolve_device(name: str) -> torch.device:
    import torch

    from memlab.core.errors import DeviceError

    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {name}: no CUDA GPU is visible to torch {torch.__version__}; use --device cpu or auto")
    return torch.device(name)


def gpu_identity(nvml_indices: list[int], nvml: Any = None) -> dict[str, Any]:
    """Which physical GPUs a run used (lanes pin runs with CUDA_VISIBLE_DEVICES, so cuda:0 may be GPU 3): NVML's
    indices, names, serial numbers (NVML has none for most consumer cards: then None) and UUIDs, comma-joined for a
    run on several GPUs. Without NVML, the indices alone."""
    out: dict[str, Any] = {"gpu_index": ",".join(map(str, nvml_indices)) or None, "gpu_serial": None, "gpu_uuid": None}
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in nvml_indices]
    except Exception:  # noqa: BLE001 (no NVML: the indices are all there is)
        return out
    serials = [_nvml_text(nvml.nvmlDeviceGetSerial, h) for h in handles]
    uuids = [_nvml_text(nvml.nvmlDeviceGetUUID, h) for h in handles]
    out["gpu_serial"] = ",".join(s or "?" for s in serials) if any(serials) else None
    out["gpu_uuid"] = ",".join(u or "?" for u in uuids) if any(uuids) else None
    return out


def _nvml_text(call: Any, handle: Any) -> str | None:
    try:
        value = call(handle)
    except Exception:  # noqa: BLE001 (NVMLError_NotSupported: a card without a serial number)
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_indices(device: torch.device | None, world_size: int) -> list[int]:
    """NVML's indices of the GPUs this run trains on: its own device, or every local rank's under torchrun."""
    import torch

    from memlab.core.meters import nvml_index

    if world_size > 1:
        return [nvml_index(torch.device("cuda", i)) for i in range(min(world_size, torch.cuda.device_count()))]
    return [nvml_index(device if device is not None and device.type == "cuda" else torch.device("cuda", 0))]


def environment(device: torch.device | None = None, world_size: int = 1) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "flash_attn": _version("flash-attn"),
        "flash_attn_4": _version("flash-attn-4"),
        "memlab": _version("memlab"),
        "git_sha": git_sha(),
        "gpu_name": None,
        "gpu_count": 0,
        "gpu_memory_bytes": None,
        "compute_capability": None,
        "gpu_index": None,
        "gpu_serial": None,
        "gpu_uuid": None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if torch.cuda.is_available():
        idx = device.index if device is not None and device.type == "cuda" and device.index is not None else 0
        props = torch.cuda.get_device_properties(idx)
        info.update(
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
        info.update(gpu_identity(_nvml_indices(device, world_size)))
    info.update(nvml_info())
    return info
