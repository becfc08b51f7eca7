"""loss: how the next-token cross-entropy avoids the B x T x V logits, if it does.

loss.chunked  memlab's own: rows in chunks under checkpointing (memlab.core.loss); runs everywhere.
loss.fused    a library's fused linear cross-entropy, liger or cce (memlab.core.linear_ce): Triton kernels, CUDA only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core import linear_ce
from memlab.core.errors import ConfigError
from memlab.core.standin import StandIn
from memlab.core.dtypes import compute_dtype
from memlab.core.requirements import refuse_without_cuda

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    check_plan(experiment, profile, world)
    fused = profile.loss.fused
    if fused == "none":
        return
    refuse_without_cuda("loss", profile, device)
    linear_ce.require(fused)


def check_plan(experiment: Experiment, profile: Profile, world: int) -> None:
    """What the configuration alone rules out. chunked with fused is refused by the profile's own validation
    (memlab.core.config), as is chunk_size < 1."""
    fused = profile.loss.fused
    if fused not in ("none", *linear_ce.LIBRARIES):
        raise ConfigError(f"unknown loss.fused {fused!r}; valid: none, {', '.join(linear_ce.LIBRARIES)}")
    if fused == "cce" and profile.precision.dtype not in ("bf16", "fp16"):
        raise ConfigError(f"loss.fused = cce needs 16-bit inputs (its backward takes bf16 or fp16 only): use precision.dtype = bf16 or fp16, not {profile.precision.dtype}")


def memory_standin(profile: Profile) -> StandIn | None:
    """A library's fused linear cross-entropy runs Triton kernels: the fake step builds full logits, the stand-in
    allocates what the library's kernels allocate."""
    if profile.loss.fused == "none":
        return None
    return StandIn("loss", profile.loss.fused, {"loss.fused": "none"})


def memory_libraries(profile: Profile) -> tuple[str, ...]:
    """The libraries whose release decides this technique's memory (the predictor's stand-in was read from one)."""
    return (linear_ce.LIBRARIES[profile.loss.fused].distribution,) if profile.loss.fused in linear_ce.LIBRARIES else ()


def apply(step: TrainStep) -> None:
    """A setting of the model's head; what ran goes to the summary (library and version for a fused kernel)."""
    loss = step.profile.loss
    if loss.fused != "none":
        step.model.loss_kernel = linear_ce.head_loss(loss.fused, compute_dtype(step.profile))
        step.applied["loss_kernel"] = linear_ce.label(loss.fused)
        return
    step.model.loss_chunk_size = loss.chunk_size if loss.chunked else 0
    step.applied["loss_kernel"] = f"chunked ({loss.chunk_size} rows)" if loss.chunked else "full logits"
