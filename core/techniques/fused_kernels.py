"""kernels.fused: route the model's forward through memlab's fused kernels (memlab.core.fused)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError, DeviceError
from memlab.core.models.family import require_family

FAMILIES = ("gpt",)  # memlab's fused block and head

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    check_plan(experiment, profile, world)
    if profile.kernels.fused and device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise DeviceError("kernels.fused needs Triton on CUDA (CUDA builds of torch ship it): pip install triton, or kernels.fused = false") from None


def check_plan(experiment: Experiment, profile: Profile, world: int) -> None:
    """What the configuration alone rules out, wherever it would run."""
    if not profile.kernels.fused:
        return
    require_family(experiment, FAMILIES, "kernels.fused", "set kernels.fused = false (its kernels are written for memlab's own GPT block and head)")
    # the fused path wires the residual stream across blocks itself, so per-block wrappers would be bypassed
    if profile.checkpointing.mode != "none":
        raise ConfigError(f"kernels.fused runs the blocks itself and cannot checkpoint them; use checkpointing.mode = none, not {profile.checkpointing.mode} (or kernels.fused = false)")
    if profile.distributed.mode == "fsdp":
        raise ConfigError("kernels.fused cannot run under distributed.mode = fsdp (FSDP2 gathers each block in its own forward); use ddp or none")


def graphs_standin(profile: Profile) -> dict[str, bool] | None:
    """What the predictor's compiled-graph trace builds for a fused step: the stock compiled model. memlab's fused
    kernels allocate their outputs only and save what the ops they replace save, in the same bytes (each norm's
    input instead of its output: memlab.core.predict.analytic); on the seed shape the H100 found the same max batch
    for both, 400 (bench/results/study-so-posts-h100/)."""
    return {"kernels.fused": False} if profile.kernels.fused else None


def apply(step: TrainStep) -> None:
    """Switch the model to the fused forward (before compile, which traces it); the label goes to the summary."""
    if not step.profile.kernels.fused:
        step.applied.setdefault("kernels", "off")  # kernels.liger's label, where Liger patched the model
        return
    if step.device.type == "cuda":
        import triton

        label = f"fused (triton {triton.__version__})"
    else:
        label = "fused (CPU reference)"  # no Triton on the CPU backend: the same ops in plain PyTorch
    step.model.fused = True
    step.applied["kernels"] = label
