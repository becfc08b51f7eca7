"""accumulation.steps: the effective batch split into micro-batches, one backward each, one optimizer step."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    k, B = profile.accumulation.steps, experiment.train.batch_size
    if world == 1 and B % k:
        raise ConfigError(f"train.batch_size ({B}) must be divisible by accumulation.steps ({k}) so the effective batch stays {B}, e.g. accumulation.steps = {_divisor_near(B, k)}")
    if B % (world * k):
        raise ConfigError(
            f"train.batch_size ({B}) is the global batch of one optimizer step; it must be divisible by ranks ({world}) "
            f"x accumulation.steps ({k}) = {world * k}, e.g. --set train.batch_size={max(1, B // (world * k)) * world * k}"
        )


def _divisor_near(batch: int, k: int) -> int:
    return max(d for d in range(1, batch + 1) if batch % d == 0 and d <= k)


def micro_batch(experiment: Experiment, profile: Profile, world: int) -> int:
    """Sequences per forward on one rank: train.batch_size is the global batch of one optimizer step."""
    return experiment.train.batch_size // (profile.accumulation.steps * world)


def steps(profile: Profile) -> int:
    """Micro-batches (forward and backward each) in one optimizer step."""
    return profile.accumulation.steps


def single(profile: Profile) -> Profile:
    """The profile at one micro-batch a step, as a probe runs it (and the predictor's searches size it)."""
    return dataclasses.replace(profile, accumulation=dataclasses.replace(profile.accumulation, steps=1))
