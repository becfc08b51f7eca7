"""Techniques applied to a built model, one function each, in one documented order (torchtitan's parallelize).

Order, and why:
0. fused kernels (kernels.fused) switch the model's forward to memlab.core.fused first: what compile traces;
1. activation checkpointing wraps blocks first, so compile sees (and can fuse around) the recompute boundaries;
2. torch.compile next, over the checkpointed blocks;
3. distributed wrapping (DDP / FSDP2) last, around the finished module (see memlab.core.distributed).
Precision, attention kernel, loss and optimizer are chosen when the model and the step are built, not here.
"""

from __future__ import annotations

import torch

from memlab.core.config import Profile
from memlab.core.techniques.checkpointing import apply_checkpointing
from memlab.core.techniques.fused_kernels import apply_fused_kernels


def apply_compile(model: torch.nn.Module, profile: Profile) -> torch.nn.Module:
    if not profile.compile.enabled:
        return model
    mode = None if profile.compile.mode == "default" else profile.compile.mode
    if profile.compile.tune_kernels:
        # torch.compile takes a mode or options, not both: spell the mode out as its options and add the tuning
        from torch._inductor import list_mode_options

        options = (dict(list_mode_options(mode)) if mode else {}) | {"coordinate_descent_tuning": True}
        return torch.compile(model, options=options)
    return torch.compile(model, mode=mode)


def apply_techniques(model: torch.nn.Module, profile: Profile, dist=None) -> tuple[torch.nn.Module, dict[str, str]]:
    """Returns the model to train (possibly a compiled / DDP wrapper) and one line per technique for run.json.

    `dist` is the engine's memlab.core.distributed.DistContext; without one, no distributed wrapping.
    """
    applied = {"kernels": apply_fused_kernels(model, profile.kernels)}
    applied["checkpointing"] = apply_checkpointing(model, profile.checkpointing)
    model = apply_compile(model, profile)
    compiled_as = profile.compile.mode + (" +tune_kernels" if profile.compile.tune_kernels else "")
    applied["compile"] = compiled_as if profile.compile.enabled else "off"
    if dist is not None:  # 3. DDP / FSDP2 last, around (FSDP2: inside) the finished module
        model, applied["distributed"] = dist.wrap(model, profile)
    return model, applied
