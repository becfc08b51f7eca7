"""precision.dtype: fp32, tf32 (fp32 storage, TF32 tensor-core matmuls), bf16 or fp16 autocast (fp16 with a GradScaler),
or bf16_pure: the parameters are bf16 themselves (no fp32 master weights, no autocast: every tensor is bf16), so
gradients and the optimizer's state are bf16 too. Without stochastic rounding (optimizer.name = bf16_sr) small
updates round away; the pairing is the bf16_sr profile."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from memlab.core.dtypes import AUTOCAST, param_dtype
from memlab.core.errors import ConfigError
from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import FakeStep

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    refuse_without_cuda("precision", profile, device)
    if profile.precision.dtype == "bf16_pure":
        _check_pure(profile)


def _check_pure(profile: Profile) -> None:
    """What bf16 parameters have not been tried with: refused rather than run untested."""
    if profile.kernels.fused:
        raise ConfigError("precision.dtype = bf16_pure does not compose with kernels.fused (its norms expect the fp32 residual stream); set kernels.fused = false")
    if profile.distributed.mode == "fsdp":
        raise ConfigError("precision.dtype = bf16_pure does not compose with distributed.mode = fsdp (FSDP2 casts fp32 parameters itself); use bf16, or ddp")
    if profile.optimizer.offload:
        raise ConfigError("precision.dtype = bf16_pure does not compose with optimizer.offload (it keeps fp32 master copies on the host); use bf16")


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """TF32 is a matmul mode of fp32 storage (its CPU twin saves the same tensors); fp16's GradScaler holds a scale
    and a flag, no memory of its own."""
    if profile.precision.dtype == "tf32" and device.type != "cuda":
        return FakeStep({"precision.dtype": "fp32"})
    if profile.precision.dtype == "fp16":
        return FakeStep(note="fp16's GradScaler left out (a scale and a flag per step: no memory of its own)")
    return None


def set_matmul_precision(dtype: str) -> None:
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def apply(step: TrainStep) -> None:
    """Global matmul flags, the autocast context for forward, (fp16) the GradScaler, the parameters' dtype."""
    dtype, device = step.profile.precision.dtype, step.device
    step.param_dtype = param_dtype(step.profile)
    set_matmul_precision(dtype)
    amp = AUTOCAST.get(dtype)
    step.autocast = (lambda: torch.autocast(device.type, dtype=amp)) if amp else contextlib.nullcontext
    if dtype == "fp16":  # FSDP: a sharded scaler, so an overflow on one rank skips the step on every rank
        step.scaler = step.dist.grad_scaler(device) if step.dist else torch.amp.GradScaler(device.type)
