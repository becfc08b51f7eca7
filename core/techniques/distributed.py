"""distributed.mode: DDP or FSDP2 around the finished module (the ranks' context is memlab.core.distributed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core import distributed

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    distributed.check(experiment, profile, world, device.type)


def shards_weights(profile: Profile) -> bool:
    """Whether each rank holds only its share of the weights (FSDP); DDP's ranks each hold all of them."""
    return profile.distributed.mode == "fsdp"


def apply(step: TrainStep) -> None:
    """Last of the model wrappers: DDP wraps the compiled module; FSDP2 shards the module inside it."""
    if step.dist is None:
        return
    step.train_model, step.applied["distributed"] = step.dist.wrap(step.train_model, step.profile)
