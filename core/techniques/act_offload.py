"""checkpointing.offload: tensors saved for backward go to pinned host memory and come back when backward needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import DeviceError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if profile.checkpointing.offload and device.type != "cuda":
        raise DeviceError("checkpointing.offload moves activations from the GPU to the CPU and needs CUDA; set it to false on the CPU backend")


def apply(step: TrainStep) -> None:
    """A context the step's forward runs under (save_on_cpu: synchronous copies, no overlap with compute)."""
    if step.profile.checkpointing.offload:
        step.offload = lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
