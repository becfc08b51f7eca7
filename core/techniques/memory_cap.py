"""The memory cap (find-batch --gpu-memory, study --gpu-memory): MEMLAB_GPU_MEMORY_BYTES in the run's environment
is a card of that total; the caching allocator is capped at it less what the process holds outside the allocator
(measured through NVML). The arithmetic lives in memlab.core.batchfind (allocator_budget); this is the one place
that applies it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.batchfind import apply_memory_cap, memory_cap_request

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    memory_cap_request(device)  # a malformed size, a cap on the CPU or above the card: one line


def apply(step: TrainStep) -> None:
    """First, before the model or anything else allocates on the GPU. The summary records the card and the budget."""
    cap = apply_memory_cap(step.device)
    if cap is not None:
        step.applied.update(gpu_memory_cap_bytes=cap.card_bytes, allocator_budget_bytes=cap.budget_bytes)
