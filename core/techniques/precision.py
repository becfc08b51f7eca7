"""precision.dtype: fp32, tf32 (fp32 storage, TF32 tensor-core matmuls), bf16 or fp16 autocast (fp16 with a GradScaler)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from memlab.core.errors import DeviceError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(profile: Profile) -> torch.dtype:
    """The dtype matmuls and attention see: the autocast dtype, else fp32 (tf32 keeps fp32 tensors)."""
    return AUTOCAST.get(profile.precision.dtype, torch.float32)


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if profile.precision.dtype == "tf32" and device.type != "cuda":
        raise DeviceError("precision.dtype = tf32 needs CUDA (TF32 is a tensor-core mode); valid on the CPU backend: fp32, bf16, fp16")


def set_matmul_precision(dtype: str) -> None:
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def apply(step: TrainStep) -> None:
    """Global matmul flags, the autocast context for forward, and (fp16) the GradScaler."""
    dtype, device = step.profile.precision.dtype, step.device
    set_matmul_precision(dtype)
    amp = AUTOCAST.get(dtype)
    step.autocast = (lambda: torch.autocast(device.type, dtype=amp)) if amp else contextlib.nullcontext
    if dtype == "fp16":  # FSDP: a sharded scaler, so an overflow on one rank skips the step on every rank
        step.scaler = step.dist.grad_scaler(device) if step.dist else torch.amp.GradScaler(device.type)
