"""optimizer.name / fused / offload / in_backward: AdamW (foreach or fused), Adafactor, torchao's 8-bit AdamW, state
on the CPU, the step inside backward. Construction lives in memlab.core.optim (optim_offload for offload,
optim_in_backward for in_backward); this is the door: check, then apply."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError, DeviceError
from memlab.core.optim import build_optimizer

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

NAMES = ("adamw", "adafactor", "adamw8bit")


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    cfg = profile.optimizer
    if cfg.name not in NAMES:
        raise ConfigError(f"unknown optimizer.name {cfg.name!r}; valid: {', '.join(NAMES)}")
    if cfg.name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        raise ConfigError(f"optimizer.name = adafactor needs torch >= 2.5 (this is {torch.__version__}); use adamw")
    if cfg.name == "adamw8bit":
        _check_adamw8bit(device)
    if cfg.offload:
        if device.type != "cuda":
            raise DeviceError("optimizer.offload moves optimizer state from the GPU to the CPU and needs CUDA; set it to false on the CPU backend")
        if cfg.name not in ("adamw", "adafactor"):
            raise ConfigError(f"optimizer.offload works with adamw or adafactor, not {cfg.name} (its 8-bit state lives on the GPU)")
    check_in_backward(experiment, profile)


def check_in_backward(experiment: Experiment, profile: Profile) -> None:
    """What a step inside backward cannot do: each needs every gradient at once, or a later step than the hook's."""
    cfg = profile.optimizer
    if not cfg.in_backward:
        return
    refusals = (
        (cfg.name != "adamw", f"optimizer.in_backward steps adamw per parameter, not {cfg.name}; use optimizer.name = adamw"),
        (cfg.offload, "optimizer.in_backward steps on the GPU as each gradient is made; it cannot also offload the step (optimizer.offload = false)"),
        (profile.accumulation.steps > 1, f"optimizer.in_backward steps in every backward, so accumulation.steps = {profile.accumulation.steps} would step on every micro-batch; use accumulation.steps = 1"),
        (experiment.train.clip > 0, f"optimizer.in_backward steps each parameter before the global grad norm exists, so it cannot clip (train.clip = {experiment.train.clip:g}); set train.clip = 0 (the optim_in_bwd profile does)"),
        (profile.precision.dtype == "fp16", "optimizer.in_backward cannot run fp16's GradScaler (unscaling and its inf check need every gradient at once); use precision.dtype = bf16"),
        (profile.distributed.mode != "none", f"optimizer.in_backward steps before {profile.distributed.mode}'s gradient reduction; use distributed.mode = none"),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(message)


def _check_adamw8bit(device: torch.device) -> None:
    if device.type != "cuda":
        raise DeviceError("optimizer.name = adamw8bit needs CUDA (its 8-bit kernels are GPU-only); use adamw on the CPU backend")
    try:
        import torchao.optim  # noqa: F401
    except ImportError:
        raise ConfigError("optimizer.name = adamw8bit needs torchao: pip install 'memlab[adamw8bit]', or use adamw") from None


def describe(profile: Profile) -> str:
    cfg = profile.optimizer
    if cfg.in_backward:
        from memlab.core.techniques.optim_in_backward import LABEL

        return cfg.name + (":fused" if cfg.fused else "") + ":" + LABEL
    return cfg.name + (":fused" if cfg.fused else "") + (":offload" if cfg.offload else "")


def apply(step: TrainStep) -> None:
    """After every wrapper: FSDP2 swaps in sharded parameters, which the optimizer must hold."""
    step.optimizer = build_optimizer(step.model, step.profile.optimizer, step.experiment.train, step.device)
    step.applied["optimizer"] = describe(step.profile)
