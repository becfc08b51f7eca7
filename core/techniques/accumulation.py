"""accumulation.steps: the effective batch split into micro-batches, one backward each, one optimizer step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    k, B = profile.accumulation.steps, experiment.train.batch_size
    if B % k:
        raise ConfigError(f"train.batch_size ({B}) must be divisible by accumulation.steps ({k}) so the effective batch stays {B}, e.g. accumulation.steps = {_divisor_near(B, k)}")


def _divisor_near(batch: int, k: int) -> int:
    return max(d for d in range(1, batch + 1) if batch % d == 0 and d <= k)


def micro_batch(experiment: Experiment, profile: Profile, world: int) -> int:
    """Sequences per forward on one rank: train.batch_size is the global batch of one optimizer step."""
    return experiment.train.batch_size // (profile.accumulation.steps * world)


def apply(step: TrainStep) -> None:
    """Nothing to build: TrainStep.run splits each batch into profile.accumulation.steps micro-batches."""
