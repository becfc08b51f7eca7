"""What the predictor knows that is tied to a GPU model, a torch release or a library release, as data keyed by
those versions, and whether a prediction falls inside them.

Each figure names where it was measured. A prediction for another GPU, torch or library release still runs (the
physics is the same), but says so: `valid_for(...)` returns the keys it was made for and, outside the calibrated
ones, "not calibrated for ...: expect +-N%" with N from the largest error seen across such a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from memlab.core.releases import LIBRARIES, installed_version

MIB = 1024**2


@dataclass(frozen=True)
class Device:
    """What a GPU reports (torch.cuda.get_device_properties) and what it holds outside the allocator."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    total_memory: int
    regs_per_sm: int
    max_threads_per_block: int
    warp_size: int
    l2_cache_size: int
    shared_memory_per_block_optin: int
    driver_reserve_bytes: int  # NVML v2 `reserved` on the idle card


DEVICES: dict[str, Device] = {
    # bench/results/cap-check-h100/NOTE.md (driver reserve); the rest as torch 2.11 reports an H100 SXM
    "H100": Device(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, max_threads_per_sm=2048,
                   total_memory=85017493504, regs_per_sm=65536, max_threads_per_block=1024, warp_size=32,
                   l2_cache_size=52428800, shared_memory_per_block_optin=232448, driver_reserve_bytes=480 * MIB),
}
ASSUMED_GPU = "H100"  # the card a prediction made without a GPU stands for (memlab estimate's default card)


@dataclass(frozen=True)
class Calibration:
    """Constants measured on one GPU model under some torch releases, and the checks that held there."""

    gpu: str
    torch: tuple[str, ...]  # major.minor: the releases of the measured runs and of the tracer that predicted them
    cuda_context_bytes: int  # NVML's used less the allocator's reserved on a card used whole
    workspace_bytes: int  # allocated beyond the counted tensors (cuBLAS / cuDNN workspaces, block rounding)
    evidence: str


CALIBRATIONS: tuple[Calibration, ...] = (
    # context: every run of bench/results/techniques-h100, 1231 .. 1263 MiB, median 1247 (torch 2.11).
    # workspace: bench/results/estimate-h100/estimate_vs_measured.json "workspace_bytes_by_family" (torch 2.11).
    # torch 2.13: the tracer of tests/test_estimate_heldout.py and bench/results/prediction-check (runs on 2.11).
    Calibration(gpu="H100", torch=("2.11", "2.13"), cuda_context_bytes=1247 * MIB, workspace_bytes=71 * MIB,
                evidence="bench/results/estimate-h100, bench/results/prediction-check, tests/test_estimate_heldout.py"),
)
CALIBRATION = CALIBRATIONS[0]

# Inductor's wrapper code as memlab.core.predict.inductor reads it: the releases its format was checked under.
INDUCTOR_WRAPPER_TORCH: tuple[str, ...] = ("2.11", "2.13")

# The expected error outside the calibrated keys, in percent, from the largest change seen across such a step:
# another torch release's Inductor plan was -23% on the seq-8192 shape (bench/results/prediction-check/float8-traced);
# another GPU's driver reserve and workspaces moved the H200's max batch by one (about 2%), its SM count changes
# reductions' staging buffers (cuda_temporaries); a library's release may change its buffers wholesale.
UNCALIBRATED_ERROR_PCT = {"torch": 25, "gpu": 10, "library": 25}


def torch_release(version: str | None = None) -> str:
    """'2.13' for '2.13.0+cpu' (default: the torch running here)."""
    return ".".join((version or torch.__version__).split("+")[0].split(".")[:2])


def gpu_key(name: str | None) -> str | None:
    """The DEVICES key a device name belongs to ('NVIDIA H100 80GB HBM3' -> 'H100'); None when unknown."""
    return next((key for key in DEVICES if name and key.lower() in name.lower()), None)


def model_name(name: str | None) -> str:
    """'A100' for 'NVIDIA A100-SXM4-80GB': the model, as a reader names it."""
    found = re.search(r"\b([A-Z]{1,2}\d{1,4}[A-Z]?)\b", name or "")
    return found.group(1) if found else (name or "unknown GPU")


def _with_article(model: str) -> str:
    return f"an {model}" if model[:1].upper() in "AEFHILMNORSX" else f"a {model}"


@dataclass(frozen=True)
class ValidFor:
    """The keys a prediction was made for, and whether the predictor was calibrated there."""

    gpu: str  # the GPU model predicted for ('H100', or the name of an unknown card)
    torch: str  # major.minor of the torch that traced the step
    libraries: dict[str, str] = field(default_factory=dict)  # distribution -> installed release, for the stand-ins used
    outside: tuple[str, ...] = ()  # what is not calibrated, e.g. ('torch 2.14', 'an A100')
    error_pct: int = 0  # the error to expect outside (0 inside)

    @property
    def calibrated(self) -> bool:
        return not self.outside

    def note(self) -> str:
        """'' inside the calibration; else the one line every view shows."""
        return f"not calibrated for {' / '.join(self.outside)}: expect +-{self.error_pct}%" if self.outside else ""

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "torch": self.torch, "libraries": dict(self.libraries), "calibrated": self.calibrated,
                "outside": list(self.outside), "error_pct": self.error_pct, "note": self.note()}

    @classmethod
    def from_dict(cls, d: dict) -> ValidFor:
        return cls(d["gpu"], d["torch"], d["libraries"], tuple(d["outside"]), d["error_pct"])


def valid_for(gpu: str | None, libraries: tuple[str, ...] = (), torch_version: str | None = None) -> ValidFor:
    """Whether a prediction for a card `gpu` (a device name; None: no GPU named, the ASSUMED_GPU), by `torch_version`
    (default: this torch), with the stand-ins of `libraries` (distributions), is inside a calibration."""
    key = gpu_key(gpu) if gpu else ASSUMED_GPU
    release = torch_release(torch_version)
    calibrated = [c for c in CALIBRATIONS if c.gpu == key]
    outside, errors = [], []
    if not any(release in c.torch for c in calibrated or CALIBRATIONS):
        outside.append(f"torch {release}")
        errors.append(UNCALIBRATED_ERROR_PCT["torch"])
    if not calibrated:
        outside.append(_with_article(model_name(gpu)))
        errors.append(UNCALIBRATED_ERROR_PCT["gpu"])
    versions = {d: installed_version(d) or LIBRARIES.get(d, "?") for d in libraries}
    for dist, ver in versions.items():
        if dist in LIBRARIES and ver != LIBRARIES[dist]:
            outside.append(f"{dist} {ver}")
            errors.append(UNCALIBRATED_ERROR_PCT["library"])
    return ValidFor(key or str(gpu), release, versions, tuple(outside), max(errors, default=0))
