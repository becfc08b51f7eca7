"""loader.pin_memory / workers: how batches reach the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import FakeStep

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    refuse_without_cuda("loader", profile, device)


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """Pinned host memory needs CUDA; the batch's device tensors are the same without it."""
    if profile.loader.pin_memory and device.type != "cuda":
        return FakeStep({"loader.pin_memory": False})
    return None
