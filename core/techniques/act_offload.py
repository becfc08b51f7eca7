"""checkpointing.offload: tensors saved for backward go to pinned host memory and come back when backward needs them.

Two ways, one knob each: `offload` alone is PyTorch's save_on_cpu (every saved tensor, copied synchronously);
with `offload_overlap` the copies run on a side stream beside the compute and come back one block ahead
(memlab.core.offload), which needs the blocks as they are: called as modules, not recomputed, not compiled."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError
from memlab.core.standin import StandIn
from memlab.core.offload import MIN_BYTES, CudaCopies, OverlapOffload
from memlab.core.requirements import refuse_without_cuda

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

OVERLAP = f"overlapped (side stream, prefetch one block ahead; tensors >= {MIN_BYTES >> 20} MiB, weights stay)"
SYNC = "synchronous (save_on_cpu, pinned)"


def _overlap_conflict(profile: Profile) -> str | None:
    """Why offload_overlap cannot run with the rest of the profile, or None."""
    p, fix = profile, "or set checkpointing.offload_overlap = false (save_on_cpu composes with it)"
    if p.checkpointing.mode != "none":
        return (f"checkpointing.offload_overlap prefetches the tensors each block saved, and checkpointing.mode = "
                f"{p.checkpointing.mode!r} recomputes them instead; set checkpointing.mode = 'none', {fix}")
    if p.compile.enabled:
        return f"checkpointing.offload_overlap marks each block with module hooks, which break torch.compile's graph at every block; set compile.enabled = false, {fix}"
    if p.kernels.fused:
        return f"checkpointing.offload_overlap finds the blocks by their module calls, which kernels.fused bypasses; set kernels.fused = false, {fix}"
    if p.distributed.mode != "none":
        return f"checkpointing.offload_overlap is not tested under distributed.mode = {p.distributed.mode!r}; set distributed.mode = 'none', {fix}"
    return None


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    ck = profile.checkpointing
    if not ck.offload:
        return
    check_plan(experiment, profile)
    refuse_without_cuda("checkpointing.offload", profile, device)


def check_plan(experiment: Experiment, profile: Profile) -> None:
    """What the configuration alone rules out, wherever it would run (`memlab estimate` too)."""
    if profile.checkpointing.offload and profile.checkpointing.offload_overlap:
        conflict = _overlap_conflict(profile)
        if conflict:
            raise ConfigError(conflict)


def memory_standin(profile: Profile) -> StandIn | None:
    """Activations copied to the host: on a CPU host and device are one, so the stand-in copies on the device only."""
    if not profile.checkpointing.offload:
        return None
    return StandIn("offload", "overlap" if profile.checkpointing.offload_overlap else "sync",
                   {"checkpointing.offload": False, "checkpointing.offload_overlap": False})


def apply(step: TrainStep) -> None:
    """A context the step's forward runs under; the overlapped one also hooks every block (and the final norm)."""
    ck = step.profile.checkpointing
    if not ck.offload:
        return
    if ck.offload_overlap:
        offload = OverlapOffload(CudaCopies(step.device))
        offload.install(list(step.model.blocks), step.model.final_norm)
        step.offload, how = offload.forward, OVERLAP
    else:
        step.offload, how = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)), SYNC
    step.applied["act_offload"] = how  # run.json: how the activations went to the host
