"""kernels.liger: Liger Kernel's model patches on a transformers model (RMSNorm, RoPE, SwiGLU as Triton kernels).

Liger keeps one patch function per architecture (`liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN`,
keyed by the config's model_type); called with `model=`, it swaps the forward of the instance's norms and MLPs for
Liger's kernels and points the modeling module's rotary function at Liger's. Its own loss patches stay off: memlab's
head computes the loss (loss.fused = liger is Liger's fused linear cross-entropy there, so the `liger` profile sets
both). Applied on the built model, before adapters or quantization, which keep the patched forwards.

Memory: a norm's kernel saves its input and one rstd per row, SwiGLU's recomputes the activation in backward; both
save less than the eager ops they replace, so the predictor traces the unpatched model, an upper bound
(memory_standin). The patch also moves module-level RoPE for the rest of the process, which a run's process is.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import TYPE_CHECKING, Any

import torch

from memlab.core.errors import ConfigError, MissingExtra
from memlab.core.models.family import require_family
from memlab.core.models.hf import transformers_config
from memlab.core.requirements import LIGER_MISSING, refuse_without_cuda
from memlab.core.standin import StandIn

FAMILIES = ("hf",)  # Liger patches transformers' modeling code
PATCHES = {"rope": True, "rms_norm": True, "swiglu": True, "geglu": True, "layer_norm": True,
           "cross_entropy": False, "fused_linear_cross_entropy": False}  # memlab's head owns the loss

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if not profile.kernels.liger:
        return
    check_plan(experiment, profile)
    refuse_without_cuda("kernels.liger", profile, device)
    patch_function(_model_type(experiment))


def check_plan(experiment: Experiment, profile: Profile) -> None:
    """What the configuration alone rules out, wherever it would run."""
    if not profile.kernels.liger:
        return
    require_family(experiment, FAMILIES, "kernels.liger", "set kernels.liger = false (Liger patches transformers' modeling code; memlab's GPT has kernels.fused)")
    if profile.kernels.fused:
        raise ConfigError("kernels.liger and kernels.fused both replace the model's kernels; choose one")


def patch_function(model_type: str) -> Any:
    """Liger's patch function for this architecture; a one-line refusal naming the ones it has."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        raise MissingExtra(LIGER_MISSING, "liger") from None
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        known = ", ".join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))
        raise ConfigError(f"kernels.liger: Liger Kernel {_version()} has no patches for model_type {model_type!r}; it has: {known}")
    return MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]


def apply(step: TrainStep) -> None:
    if not step.profile.kernels.liger:
        return
    hf_model = step.model.hf
    patch = patch_function(hf_model.config.model_type)
    accepted = inspect.signature(patch).parameters
    chosen = {k: v for k, v in PATCHES.items() if k in accepted}
    patch(model=hf_model, **chosen)
    kernels = ", ".join(k for k, v in chosen.items() if v)
    step.applied["kernels"] = f"liger {_version()} ({kernels})"


def memory_standin(profile: Profile) -> StandIn | None:
    """Liger's kernels are Triton: the fake step runs the unpatched model, which saves at least as much."""
    if not profile.kernels.liger:
        return None
    return StandIn("model_patches", None, {"kernels.liger": False})


def _model_type(experiment: Experiment) -> str:
    return transformers_config(experiment.model).model_type


def _version() -> str:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
