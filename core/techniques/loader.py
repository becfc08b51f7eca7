"""loader.pin_memory / workers: how batches reach the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import DeviceError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if profile.loader.pin_memory and device.type != "cuda":
        raise DeviceError("loader.pin_memory speeds host-to-GPU copies and needs CUDA; set it to false on the CPU backend")
