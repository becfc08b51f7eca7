"""loader.pin_memory / workers: how batches reach the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.requirements import refuse_without_cuda

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    refuse_without_cuda("loader", profile, device)
