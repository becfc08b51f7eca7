"""compile.enabled: torch.compile over the (fused, checkpointed) model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """Every mode compiles on every device; the profile's own validation already names the valid modes."""


def compiled(model: torch.nn.Module, profile: Profile) -> torch.nn.Module:
    mode = None if profile.compile.mode == "default" else profile.compile.mode
    if profile.compile.tune_kernels:
        # torch.compile takes a mode or options, not both: spell the mode out as its options and add the tuning
        from torch._inductor import list_mode_options

        options = (dict(list_mode_options(mode)) if mode else {}) | {"coordinate_descent_tuning": True}
        return torch.compile(model, options=options)
    return torch.compile(model, mode=mode)


def apply(step: TrainStep) -> None:
    """After checkpointing (compile sees the recompute boundaries), before distributed wrapping."""
    c = step.profile.compile
    if c.enabled:
        step.train_model = compiled(step.train_model, step.profile)
    step.applied["compile"] = (c.mode + (" +tune_kernels" if c.tune_kernels else "")) if c.enabled else "off"
