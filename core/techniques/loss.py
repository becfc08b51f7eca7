"""loss.chunked: cross-entropy in chunks of rows, so the B x T x V logits never exist at once (memlab.core.loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """Runs everywhere; chunk_size >= 1 is the profile's own validation (memlab.core.config)."""


def apply(step: TrainStep) -> None:
    loss = step.profile.loss
    step.model.loss_chunk_size = loss.chunk_size if loss.chunked else 0
