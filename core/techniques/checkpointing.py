"""Activation checkpointing: recompute a block's (or a sub-layer's) activations in backward instead of keeping them.

Always `use_reentrant=False` (the implementation PyTorch recommends: it composes with autocast, compile and
hooks, and gives the same loss and gradients as no checkpointing).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from memlab.core.config import CheckpointingConfig

if TYPE_CHECKING:
    import torch

    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def _wrap(module: nn.Module) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def apply_checkpointing(model: nn.Module, cfg: CheckpointingConfig) -> str:
    """Wrap blocks (or their attention / MLP) per cfg.mode; returns a one-line description for the summary."""
    blocks = list(model.blocks)
    if cfg.mode == "none":
        return "none"
    if cfg.mode == "full":
        for block in blocks:
            _wrap(block)
        return f"full ({len(blocks)}/{len(blocks)} blocks)"
    if cfg.mode == "every_n":
        chosen = blocks[:: cfg.every]
        for block in chosen:
            _wrap(block)
        return f"every_n:{cfg.every} ({len(chosen)}/{len(blocks)} blocks)"
    if cfg.mode == "selective":
        for block in blocks:
            _wrap(block.attn if cfg.target == "attention" else block.mlp)
        return f"selective:{cfg.target}"
    raise ValueError(cfg.mode)


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """Nothing beyond the profile's own validation: every mode runs on every device (offload: act_offload)."""


def apply(step: TrainStep) -> None:
    """Before compile, so compile sees (and can fuse around) the recompute boundaries."""
    step.applied["checkpointing"] = apply_checkpointing(step.model, step.profile.checkpointing)
