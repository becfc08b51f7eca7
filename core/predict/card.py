"""The card a prediction is for: its memory, its GPU model (the calibration key), whether it is emulated under
--gpu-memory's cap, and what a run holds on it outside the caching allocator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from memlab.core import gpu_memory, techniques
from memlab.core.errors import ConfigError
from memlab.core.predict import analytic
from memlab.core.predict.calibration import ASSUMED_GPU, DEVICES
from memlab.core.units import gib, parse_size

DEFAULT_CARD = "80GiB"  # a prediction without a GPU to ask and without --gpu-memory: an 80 GB H100


@dataclass(frozen=True)
class Card:
    total_bytes: int  # the card's memory, all of it (a real card's, or the emulated --gpu-memory)
    gpu: str | None  # the device name, for the calibration (None: no GPU named, the assumed H100)
    where: str  # where the figure came from, for the views: "--gpu-memory 24GiB", "NVIDIA H100 80GB HBM3", ...
    capped: bool = False  # emulated under --gpu-memory's cap, as find-batch's and the study's probes run
    named: bool = False  # the user named it (--gpu-memory): the slower allocator replay is worth its seconds

    @property
    def budget_bytes(self) -> int:
        """What the caching allocator may hand out: the card less what a run holds outside it here."""
        return self.total_bytes - context_bytes_here()

    def budget_for(self, profile: Any) -> int:
        """budget_bytes less what the profile's techniques hold outside the allocator (a process group's NCCL)."""
        return self.budget_bytes - techniques.outside_allocator_bytes(profile)


def card_for(size: str | None) -> Card:
    """--gpu-memory's card (emulated under a cap), else this machine's GPU, else an 80 GB H100."""
    if size is not None:
        total = parse_size(size)
        gpu = gpu_memory.gpu_info() if cuda_here() else None
        card = Card(total, gpu.name if gpu else None, f"--gpu-memory {size}", capped=True, named=True)
        _refuse_smaller_than_the_context(card)
        return card
    info = gpu_memory.gpu_info() if cuda_here() else None
    if info is not None:
        return Card(info.total_bytes, info.name, info.name)
    return Card(parse_size(DEFAULT_CARD), None, f"no GPU here: an 80 GB {ASSUMED_GPU} assumed")


def _refuse_smaller_than_the_context(card: Card) -> None:
    if card.budget_bytes <= 0:
        raise ConfigError(f"{card.where} ({gib(card.total_bytes)}) is smaller than what a run holds outside the allocator "
                          f"(the CUDA context, libraries, the driver's reserve: {gib(context_bytes_here())}); name a larger card")


def context_bytes_here() -> int:
    """What a run holds outside the allocator on this machine's GPU, for a prediction made before any probe: the
    calibrated card's context, libraries and driver reserve (analytic.CUDA_CONTEXT_BYTES) with this GPU's own driver
    reserve in place of that card's. On an H200 (a 0.60 GiB reserve) the H100's figure left liger_ce on the T 8192
    shape predicted one above the batch found (bench/results/prediction-check/). No GPU or no NVML v2: the H100's."""
    if not torch.cuda.is_available():
        return analytic.CUDA_CONTEXT_BYTES
    here = gpu_memory.driver_reserved(gpu_memory._nvml_handle(gpu_memory._nvml_index(0)))
    return context_bytes_with(here) if here else analytic.CUDA_CONTEXT_BYTES


def context_bytes_with(driver_reserve: int) -> int:
    """The calibrated card's context, libraries and driver reserve, with `driver_reserve` in place of its own."""
    return analytic.CUDA_CONTEXT_BYTES - DEVICES[ASSUMED_GPU].driver_reserve_bytes + driver_reserve


def cuda_here() -> bool:
    """Whether this process sees a real CUDA device: where the allocator replay's seconds are worth spending on a
    prediction (find-batch's and the study's searches), not on a CPU."""
    return torch.cuda.is_available()
