"""The memory cap (find-batch --gpu-memory, study --gpu-memory): MEMLAB_GPU_MEMORY_BYTES in the run's environment
is a card of that total; the caching allocator is capped at it less what the process holds outside the allocator
(measured through NVML). The arithmetic lives in memlab.core.batchfind (allocator_budget); this is the one place
that applies it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.gpu_memory import apply_memory_cap, memory_cap_request, tighten_memory_cap

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    memory_cap_request(device)  # a malformed size, a cap on the CPU or above the card: one line


# Steps after which the cap is measured again: by then the optimizer's state exists and every kernel of a step has
# loaded (CUDA loads them lazily, into the context, outside the allocator). Within the engine's warm-up steps
# (train.measure_after, 3 by default), so the NVML query never falls in a measured step.
RECHECK_STEPS = 3


def apply(step: TrainStep) -> None:
    """First, before the model or anything else allocates on the GPU. The summary records the card and the budget
    (the budget as tightened after the first steps)."""
    cap = apply_memory_cap(step.device)
    if cap is None:
        return
    step.applied.update(gpu_memory_cap_bytes=cap.card_bytes, allocator_budget_bytes=cap.budget_bytes)
    state = {"cap": cap}

    def recheck(i: int) -> None:
        if i < RECHECK_STEPS:
            state["cap"] = tighten_memory_cap(state["cap"])
            step.applied["allocator_budget_bytes"] = state["cap"].budget_bytes

    step.after_step.append(recheck)
